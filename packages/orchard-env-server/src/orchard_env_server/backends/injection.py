"""What every container backend shares about the injected agent and sandbox labels.

The agent bundle (``packages/orchard-env-agent`` with its own Python, ``infra/agent``) is
mounted read-only at :data:`AGENT_MOUNT` and started by :func:`agent_entry`, so an image
needs nothing of its own; Docker mounts it from a volume, Kubernetes from an emptyDir an
init container fills (docs/architecture.md). Sandboxes, and the objects made for them,
carry labels under one prefix, :data:`LABEL_PREFIX`, on every backend.
"""

from __future__ import annotations

from ..quantities import parse_memory

__all__ = [
    "AGENT_MOUNT",
    "LABEL_PREFIX",
    "MIN_MEMORY_BYTES",
    "RUN_MOUNT",
    "agent_entry",
    "label",
    "memory_limit",
]

AGENT_MOUNT = "/.orchard/agent"  # where the bundle appears inside a sandbox, read-only
RUN_MOUNT = "/.orchard/run"  # the agent's socket and token, shared with the orchestrator
LABEL_PREFIX = "orchard.dev/"
MIN_MEMORY_BYTES = 32 << 20  # below this the agent itself cannot run


def label(name: str) -> str:
    """The label key ``name`` under the one prefix (``orchard.dev/<name>``)."""
    return f"{LABEL_PREFIX}{name}"


def agent_entry(root: str = AGENT_MOUNT) -> list[str]:
    """The bundle's own loader runs its own Python: nothing of the image is needed."""
    return [
        f"{root}/lib/ld-linux-x86-64.so.2",
        "--library-path",
        f"{root}/lib",
        f"{root}/bin/python3.11",
        "-I",
        "-m",
        "orchard_env_agent",
    ]


def memory_limit(value: str) -> int:
    """A sandbox's memory limit in bytes; ValueError when unreadable or too small."""
    memory = parse_memory(value)
    if memory < MIN_MEMORY_BYTES:
        raise ValueError(
            f"memory {value!r} is below the {MIN_MEMORY_BYTES >> 20} MiB "
            "a sandbox needs for its agent"
        )
    return memory
