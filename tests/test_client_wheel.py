"""The client installs alone: its wheel in a fresh venv pulls no server or cluster tooling."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_the_client_wheel_installs_and_imports_alone(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        ["uv", "build", "--package", "orchard-env-client", "--wheel", "-o", str(dist)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    wheel = next(dist.glob("orchard_env_client-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run(["uv", "venv", "-q", "-p", sys.executable, str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run(["uv", "pip", "install", "-q", "-p", str(py), str(wheel)], check=True)
    probe = (
        "import importlib.util, orchard_env_client as c;"
        "print(c.SandboxClient.__name__, c.AsyncSandboxClient.__name__);"
        "print([m for m in ('fastapi','pydantic','kubernetes','starlette','uvicorn')"
        " if importlib.util.find_spec(m)])"
    )
    out = subprocess.run([str(py), "-c", probe], check=True, capture_output=True, text=True).stdout
    assert out.splitlines() == ["SandboxClient AsyncSandboxClient", "[]"]


def test_every_package_builds_as_its_own_wheel(tmp_path):
    subprocess.run(
        ["uv", "build", "--all-packages", "--wheel", "-o", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    wheels = {p.name.split("-")[0]: p for p in tmp_path.glob("*.whl")}
    assert sorted(wheels) == [
        "orchard_claw",
        "orchard_env_agent",
        "orchard_env_bench",
        "orchard_env_client",
        "orchard_env_server",
        "orchard_gui",
        "orchard_swe",
    ]


RECIPE_DATA = {
    "orchard-swe": "builtin/tasks.jsonl",
    "orchard-gui": "prompts/react_tools.txt",
    "orchard-claw": "data/builtin/book-room-1/task.json",
}


@pytest.mark.parametrize("package", sorted(RECIPE_DATA))
def test_a_recipe_depends_on_the_client_and_never_on_the_server_or_agent(tmp_path, package):
    import zipfile

    subprocess.run(
        ["uv", "build", "--package", package, "--wheel", "-o", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    wheel = next(tmp_path.glob(f"{package.replace('-', '_')}-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith("METADATA"))).decode()
        sources = [zf.read(n).decode() for n in zf.namelist() if n.endswith(".py")]
        assert any(n.endswith(RECIPE_DATA[package]) for n in zf.namelist())
    requires = [
        line.split(":", 1)[1].strip()
        for line in meta.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    assert any(r.startswith("orchard-env-client") for r in requires)
    assert not any(r.startswith(("orchard-env-server", "orchard-env-agent")) for r in requires)
    assert not any("orchard_env_server" in s or "orchard_env_agent" in s for s in sources)
