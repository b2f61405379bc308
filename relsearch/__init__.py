"""relsearch: relational vector search.

Sub-packages follow the data flow: ``pipelines`` (Beam jobs) → ``encoder`` (text → vectors →
relational query vectors) → ``indexer`` (FAISS, docstore, manifest); ``retrieval`` reads what the
indexer wrote; ``bench`` measures.
"""
from .version import __version__  # noqa: F401 (the package version)


def __getattr__(name: str):
    # the Python API (relsearch/api.py) loads torch and FAISS: import it on first use, not with the package
    if name in ("open_index", "Index", "SearchRequest", "RequestError"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'relsearch' has no attribute {name!r}")
