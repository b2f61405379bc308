"""Apache Beam jobs (index, lookup) composed from encoder/ and indexer/."""
