"""CPU and memory quantities of a create request, as numbers a backend can apply.

``cpu``: cores, ``"2"``, ``"0.5"``, or millicores ``"500m"`` (Kubernetes style).
``memory``: bytes with a suffix: ``Ki Mi Gi Ti Pi Ei`` (binary, Kubernetes), ``K M G T P E``
(decimal, Kubernetes), or lowercase ``k m g t p e`` meaning binary units the way
``docker run --memory 512m`` does. A bare number is bytes.
"""

from __future__ import annotations

import re

_MEMORY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([KMGTPE]i?|[kmgtpe])?$")
_POWERS = "KMGTPE"


def parse_cpu(value: str) -> float:
    """Cores as a float; raises ValueError on anything else or on zero."""
    cores = float(value[:-1]) / 1000 if value.endswith("m") else float(value)
    if cores <= 0:
        raise ValueError(f"cpu {value!r} must be more than zero")
    return cores


def parse_memory(value: str) -> int:
    """Bytes as an int; raises ValueError on anything else."""
    match = _MEMORY.match(value)
    if not match:
        raise ValueError(f"memory {value!r} is not a quantity like 512Mi, 2G or 1g")
    number, suffix = float(match.group(1)), match.group(2) or ""
    if not suffix:
        return int(number)
    power = _POWERS.index(suffix[0].upper()) + 1
    binary = suffix.endswith("i") or suffix.islower()
    return int(number * (1024 if binary else 1000) ** power)
