"""Orchard Env as a Harbor environment provider (``-e orchard_harbor:OrchardEnvironment``)."""

from orchard_harbor.environment import (
    OrchardConfigError,
    OrchardEnvironment,
    OrchardEnvironmentOptions,
)

__all__ = ["OrchardConfigError", "OrchardEnvironment", "OrchardEnvironmentOptions"]
