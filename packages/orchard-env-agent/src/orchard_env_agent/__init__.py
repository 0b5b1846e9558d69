"""Orchard Env agent: the small HTTP server that runs commands inside a sandbox."""

__version__ = "0.1.0"
