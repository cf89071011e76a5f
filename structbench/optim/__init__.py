"""Optimizers: the registry, `make_optimizer`, and one module per optimizer family.

Importing this package registers every optimizer.
"""

from structbench.optim import adagrad_norm as adagrad_norm
from structbench.optim import alice as alice
from structbench.optim import apollo as apollo
from structbench.optim import asgo as asgo
from structbench.optim import baselines as baselines
from structbench.optim import fira as fira
from structbench.optim import fismo as fismo
from structbench.optim import galore as galore
from structbench.optim import muon as muon
from structbench.optim import racs as racs
from structbench.optim import shampoo as shampoo
from structbench.optim import shampoo4bit as shampoo4bit
from structbench.optim import soap as soap
from structbench.optim import sumo as sumo
from structbench.optim.registry import (
    OptimizerEntry,
    Routing,
    build_with_routing,
    get,
    make_optimizer,
    names,
    register,
    resolve_hparams,
    validate,
)

__all__ = [
    "OptimizerEntry",
    "Routing",
    "build_with_routing",
    "get",
    "make_optimizer",
    "names",
    "register",
    "resolve_hparams",
    "validate",
]
