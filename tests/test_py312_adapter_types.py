"""The Python >= 3.12 adapters type-check against the upstream releases they pin.

The workspace's own mypy run targets 3.11 and cannot see Harbor or the OpenHands SDK, so
each adapter is checked here with mypy pointed at its 3.12 venv (`tests/py312_venv.py`).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from py312_venv import ADAPTERS, REPO, adapter_venv

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_adapter_is_mypy_clean(name: str) -> None:
    venv = adapter_venv(name)
    source = f"{ADAPTERS[name][1][-1]}/src"
    python = str(venv / "bin" / "python")
    argv = [sys.executable, "-m", "mypy", "--python-version", "3.12"]
    argv += ["--python-executable", python, "--follow-imports=silent"]
    argv += ["--disallow-untyped-defs", "--ignore-missing-imports", source]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
