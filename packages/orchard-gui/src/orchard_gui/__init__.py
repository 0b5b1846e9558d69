"""orchard-gui: browser agents on Orchard Env sandboxes (the paper's GUI recipe)."""

__version__ = "0.1.0"
