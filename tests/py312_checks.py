"""Run the ``check_*`` functions of a pure-logic check file with a 3.12 venv's Python.

The suite runs on Python 3.11 and must not import the 3.12-only adapters, so their
pure-logic checks live in plain files (``packages/*/tests/py312/check_*.py``) and
:func:`run_checks` runs them in a subprocess: ``<venv>/bin/python py312_checks.py FILE``
imports FILE, calls each ``check_*`` function in name order, prints ``ok <name>`` and
stops with ``FAILED <name>`` and a traceback at the first failure (exit status 1).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import traceback
from pathlib import Path


def main(path: str) -> int:
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    checks = sorted((n, f) for n, f in vars(module).items() if n.startswith("check_"))
    for name, check in checks:
        try:
            check()
        except Exception:
            traceback.print_exc()
            print(f"FAILED {name}")
            return 1
        print(f"ok {name}")
    return 0 if checks else 1


def run_checks(venv: Path, check_file: Path) -> str:
    """Run ``check_file``'s checks with ``venv``'s Python; their output, or AssertionError."""
    argv = [str(venv / "bin" / "python"), __file__, str(check_file)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
