"""Orchard recipe for software-engineering agents."""

__version__ = "0.1.0"
