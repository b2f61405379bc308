"""Storage: FAISS index, SQLite docstore and manifest, written aside and switched in atomically."""
