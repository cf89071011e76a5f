"""The data root: where every dataset reader looks first (docs/cli.md).

The root is the command line's ``--data-dir`` if given, else the environment variable
``STRUCTBENCH_DATA``, else ``~/.cache/structbench/data``. Nothing is created or downloaded here.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_ROOT_ENV = "STRUCTBENCH_DATA"
DEFAULT_DATA_ROOT = Path("~") / ".cache" / "structbench" / "data"


def resolve_data_root(cli_value: str | Path | None) -> Path:
    """Return the data root: ``cli_value``, else ``$STRUCTBENCH_DATA``, else ``~/.cache/structbench/data``.

    An empty string counts as not given. ``~`` is expanded; the directory need not exist.
    """
    if cli_value is not None and str(cli_value) != "":
        chosen = Path(cli_value)
    elif os.environ.get(DATA_ROOT_ENV):
        chosen = Path(os.environ[DATA_ROOT_ENV])
    else:
        chosen = DEFAULT_DATA_ROOT
    return chosen.expanduser().absolute()
