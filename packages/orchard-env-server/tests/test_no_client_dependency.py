"""The server does not depend on the client: the benches that use the client live in the
orchard-env-bench package, which ``orchard-env bench`` and ``orchard-env cost`` hand over to."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

from orchard_env_server.cli import main

pytestmark = pytest.mark.fast

PACKAGE = Path(__file__).resolve().parents[1]


def _imported_modules(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module)
    return modules


def test_no_server_module_imports_the_client():
    sources = sorted((PACKAGE / "src").rglob("*.py"))
    assert sources
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in sources
        if any(m.split(".")[0] == "orchard_env_client" for m in _imported_modules(path))
    ]
    assert offenders == []


def test_the_server_does_not_list_the_client_as_a_dependency():
    project = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]
    listed = [*project["dependencies"]]
    listed += [dep for extra in project.get("optional-dependencies", {}).values() for dep in extra]
    names = {re.split(r"[\s\[<>=!~;]", dep, maxsplit=1)[0].lower() for dep in listed}
    assert project["name"] == "orchard-env-server" and "orchard-env-agent" in names
    assert "orchard-env-client" not in names


@pytest.mark.parametrize("command", ["bench", "cost"])
def test_bench_and_cost_without_the_bench_package_exit_2(command, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "orchard_env_bench", None)
    monkeypatch.setitem(sys.modules, "orchard_env_bench.cli", None)
    assert main([command, "--help"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"orchard-env {command}:" in captured.err and "install orchard-env-bench" in captured.err
