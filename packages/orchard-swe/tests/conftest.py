"""A real Orchard Env service for the recipe's tests: each selected backend in turn.

On Docker the repository tasks run in ``orchard-test/debian`` (git, python3, pytest).
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from orchard_env_client import AsyncSandboxClient
from orchard_swe.tasks import InstallConfig, Task
from orchard_swe.testing.tiny_llm import TinyLLMServer
from orchard_swe.trainers.llm_venv import TORCH_WHEEL, LLMVenvError, ensure_train_venv
from orchard_swe.trainers.sft_train import make_proof_data
from orchard_testing import RunningServer, require_backend, selected_backends


@pytest.fixture(scope="session", params=selected_backends())
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    require_backend(request.param)
    srv = RunningServer(backend=request.param, state_dir=tmp_path_factory.mktemp("swe-state") / "s")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def local_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One local-backend service, for tests whose subject does not depend on the backend
    (the server fixture above runs them on every backend)."""
    srv = RunningServer(backend="local", state_dir=tmp_path_factory.mktemp("swe-local") / "s")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
async def client(server: RunningServer) -> AsyncIterator[AsyncSandboxClient]:
    async with AsyncSandboxClient(base_url=server.url) as c:
        yield c


# A small repository made here with two bugs: the gold patch fixes both, a half patch one.
CALC = "def add(a, b):\n    return a + b if a > 0 else a - b\n\n\ndef mul(a, b):\n    return a * b + 1\n"
FIXED_ADD = "def add(a, b):\n    return a + b\n"
TESTS_OLD = "from calc import add\n\n\ndef test_add_positive():\n    assert add(1, 2) == 3\n"
TESTS_NEW = TESTS_OLD + (
    "\n\ndef test_add_negative():\n    assert add(-1, 2) == 1\n"
    "\n\ndef test_mul():\n    from calc import mul\n    assert mul(2, 3) == 6\n"
)


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout


def _diff_after(repo: Path, edit: dict[str, str]) -> str:
    for name, text in edit.items():
        (repo / name).write_text(text)
    _git(repo, "add", "-A")
    diff = _git(repo, "diff", "--cached")
    _git(repo, "reset", "-q", "--hard")
    return diff


@pytest.fixture(scope="session")
def calc_task(tmp_path_factory) -> Task:
    repo = tmp_path_factory.mktemp("calc") / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "calc.py").write_text(CALC)
    (repo / "tests").mkdir()
    (repo / "tests" / "test_calc.py").write_text(TESTS_OLD)
    (repo / "conftest.py").write_text("")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    gold = _diff_after(repo, {"calc.py": FIXED_ADD + "\n\ndef mul(a, b):\n    return a * b\n"})
    test_patch = _diff_after(repo, {"tests/test_calc.py": TESTS_NEW})
    return Task(
        instance_id="calc__calc-1",
        repo="example/calc",
        base_commit=base,
        problem_statement="add() and mul() are wrong",
        patch=gold,
        test_patch=test_patch,
        fail_to_pass=("tests/test_calc.py::test_add_negative", "tests/test_calc.py::test_mul"),
        pass_to_pass=("tests/test_calc.py::test_add_positive",),
        repo_url=str(repo),
        install_config=InstallConfig(test_cmd="python3 -m pytest -rA -p no:cacheprovider tests"),
        extra={
            "half": _diff_after(
                repo, {"calc.py": CALC.replace("a + b if a > 0 else a - b", "a + b")}
            )
        },
    )


# A real small language model (SmolLM2-135M on CPU) behind an OpenAI-compatible endpoint.
@pytest.fixture(scope="session")
def tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """base_url (http://127.0.0.1:PORT/v1) of a running tiny LLM server."""
    if not TORCH_WHEEL.is_file():
        pytest.skip(f"no CPU torch wheel at {TORCH_WHEEL} on this machine")
    log = tmp_path_factory.mktemp("tiny-llm") / "server.log"
    server = TinyLLMServer(max_new_tokens=48, startup_timeout_s=120, log_path=log)
    try:
        server.start()
    except LLMVenvError as exc:
        pytest.fail(f"cannot build the tiny-LLM venv: {exc}")
    try:
        yield server.base_url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def train_venv() -> Path:
    """The training venv (CPU torch, TRL); skips only where the torch wheel is missing."""
    if not TORCH_WHEEL.is_file():
        pytest.skip(f"no CPU torch wheel at {TORCH_WHEEL} on this machine")
    try:
        return ensure_train_venv()
    except LLMVenvError as exc:
        pytest.fail(f"cannot build the training venv: {exc}")


PROOF_IDS = ["inflection__inflection-1", "toolz__toolz-1"]


@pytest.fixture(scope="session")
def proof_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SFT proof's data for two built-in tasks, tools harness (made once)."""
    out = tmp_path_factory.getbasetemp() / "sft-proof-data"
    server = RunningServer(backend="local", state_dir=tmp_path_factory.mktemp("proof-state") / "s")
    server.start()
    try:
        make_proof_data(out, url=server.url, ids=PROOF_IDS, harnesses=["tools"])
    finally:
        server.stop()
    return out
