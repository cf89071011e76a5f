"""Readers for on-disk dataset formats and the data-root lookup (docs/suites-reference.md).

Every reader returns uint8 images laid out N,C,H,W (single-channel images keep C = 1) and int64
labels. Data never download; see :mod:`structbench.data.registry` for names, layouts and how to
get each dataset.
"""

from structbench.data.checksums import ChecksumWarning
from structbench.data.errors import DataFormatError
from structbench.data.registry import DATASETS, DatasetInfo, dataset_info, dataset_status, load, require
from structbench.data.root import resolve_data_root
from structbench.data.splits import IMAGE_LAYOUT, ArraySplit, DatasetMeta

__all__ = [
    "DATASETS",
    "IMAGE_LAYOUT",
    "ArraySplit",
    "ChecksumWarning",
    "DataFormatError",
    "DatasetInfo",
    "DatasetMeta",
    "dataset_info",
    "dataset_status",
    "load",
    "require",
    "resolve_data_root",
]
