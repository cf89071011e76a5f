"""structbench: a benchmarking harness for structured optimizers."""

from importlib import metadata

try:
    __version__ = metadata.version("structbench")
except metadata.PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"
