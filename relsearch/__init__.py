"""relsearch: relational vector search.

Sub-packages follow the data flow: ``pipelines`` (Beam jobs) → ``encoder`` (text → vectors →
relational query vectors) → ``indexer`` (FAISS, docstore, manifest); ``retrieval`` reads what the
indexer wrote; ``bench`` measures.
"""
__version__ = "0.1.0"
