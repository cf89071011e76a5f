"""structbench: a benchmarking harness for structured optimizers."""

__version__ = "0.1.0"
