"""The package version, a leaf every layer may import (the manifest, the Elasticsearch mapping and
the server record it) without importing the package root, whose lazy API re-export reaches the top."""
__version__ = "0.1.0"
