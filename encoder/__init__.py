"""Text → vectors → relational query vectors: the encoder, relation operators and model bundles."""
