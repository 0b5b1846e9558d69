"""Orchard Env orchestrator: a FastAPI service that owns sandbox lifecycle."""

__version__ = "0.1.0"

__all__ = ["__version__"]
