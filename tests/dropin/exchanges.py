"""The recorded public-SDK exchanges: ids as placeholders, and the type specs checked on replay.

A recording names every sandbox and job id it saw as ``{{sandbox_N}}`` / ``{{job_N}}``; a
replay learns the real ids from the answers it gets and puts them back. A type spec is a
``|``-separated list of ``str``, ``int``, ``number`` (int or float), ``bool``, ``null``,
``list``, ``dict``, ``any``, and ``absent`` (the field may be missing).
"""

from __future__ import annotations

import re
from typing import Any

PLACEHOLDER = re.compile(r"\{\{(?:sandbox|job)_\d+\}\}")
API_KEY_PLACEHOLDER = "{{api_key}}"


def type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "dict"
    return type(value).__name__


def conforms(spec: str, present: bool, value: Any) -> bool:
    allowed = set(spec.split("|"))
    if not present:
        return "absent" in allowed
    kind = type_of(value)
    return "any" in allowed or kind in allowed or (kind == "int" and "number" in allowed)


def problems(reads: dict[str, Any], answer: Any, where: str) -> list[str]:
    """Where ``answer`` lacks a field the SDK reads, or has it with another type.

    ``reads`` maps field names to specs; ``"name[]"`` maps to the reads of each item of the
    list ``name``.
    """
    if not isinstance(answer, dict):
        return [f"{where}: the answer is {type_of(answer)}, not a JSON object"]
    found = []
    for key, spec in reads.items():
        if key.endswith("[]"):
            items = answer.get(key[:-2])
            for i, item in enumerate(items if isinstance(items, list) else []):
                found += problems(spec, item, f"{where}.{key[:-2]}[{i}]")
            continue
        if not conforms(spec, key in answer, answer.get(key)):
            got = type_of(answer[key]) if key in answer else "absent"
            found.append(f"{where}: field {key!r} is {got}, the SDK needs {spec}")
    return found


def put_back(value: Any, ids: dict[str, str]) -> Any:
    """``value`` with every placeholder replaced by the id learned for it."""
    if isinstance(value, str):
        return PLACEHOLDER.sub(lambda m: ids[m.group(0)], value)
    if isinstance(value, list):
        return [put_back(v, ids) for v in value]
    if isinstance(value, dict):
        return {k: put_back(v, ids) for k, v in value.items()}
    return value


class IdNames:
    """Recording side: real ids to placeholders, numbered in the order they appear."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self._counts = {"sandbox": 0, "job": 0}

    def learn(self, answer: Any) -> None:
        """Name the ``sandbox_id`` and ``job_id`` an answer carries."""
        if not isinstance(answer, dict):
            return
        for kind in ("sandbox", "job"):
            real = answer.get(f"{kind}_id")
            if isinstance(real, str) and real and real not in self.names:
                self._counts[kind] += 1
                self.names[real] = f"{{{{{kind}_{self._counts[kind]}}}}}"

    def hide(self, value: Any) -> Any:
        """``value`` with every known id replaced by its placeholder (longest ids first)."""
        if isinstance(value, str):
            for real in sorted(self.names, key=len, reverse=True):
                value = value.replace(real, self.names[real])
            return value
        if isinstance(value, list):
            return [self.hide(v) for v in value]
        if isinstance(value, dict):
            return {k: self.hide(v) for k, v in value.items()}
        return value
