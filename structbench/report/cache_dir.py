"""Where the report keeps its caches: a directory beside each store's datasets, named so that the store's readers
skip it (a leading ".")."""

CACHE_DIR = ".report-cache"
