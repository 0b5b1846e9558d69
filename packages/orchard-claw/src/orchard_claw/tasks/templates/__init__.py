"""Task templates (one module per kind); importing this registers them and their checkers."""

from orchard_claw.tasks.templates import chain, data, email, files, scheduling
from orchard_claw.tasks.templates.common import TEMPLATES, Template

__all__ = ["TEMPLATES", "Template", "chain", "data", "email", "files", "scheduling"]
