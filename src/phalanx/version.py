"""The version, in a leaf module: what fingerprints and probes compare, importable from any layer
without the package root (which re-exports the in-script API)."""

__version__ = "0.1.0"
