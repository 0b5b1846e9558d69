"""Grading against a real Orchard service, on a small repository made here.

The repository has two bugs; the gold patch fixes both, a half patch one of them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from orchard_env_client import AsyncSandboxClient
from orchard_swe.grading import files_in_patch, grade
from orchard_swe.tasks import InstallConfig, Task

pytestmark = pytest.mark.integration

CALC = "def add(a, b):\n    return a + b if a > 0 else a - b\n\n\ndef mul(a, b):\n    return a * b + 1\n"
FIXED_ADD = "def add(a, b):\n    return a + b\n"
TESTS_OLD = "from calc import add\n\n\ndef test_add_positive():\n    assert add(1, 2) == 3\n"
TESTS_NEW = TESTS_OLD + (
    "\n\ndef test_add_negative():\n    assert add(-1, 2) == 1\n"
    "\n\ndef test_mul():\n    from calc import mul\n    assert mul(2, 3) == 6\n"
)


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                           *args], check=True, capture_output=True, text=True)  # fmt: skip
    return done.stdout


def _diff_after(repo: Path, edit: dict[str, str]) -> str:
    for name, text in edit.items():
        (repo / name).write_text(text)
    _git(repo, "add", "-A")
    diff = _git(repo, "diff", "--cached")
    _git(repo, "reset", "-q", "--hard")
    return diff


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Task:
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
        instance_id="calc__calc-1", repo="example/calc", base_commit=base,
        problem_statement="add() and mul() are wrong", patch=gold, test_patch=test_patch,
        fail_to_pass=("tests/test_calc.py::test_add_negative", "tests/test_calc.py::test_mul"),
        pass_to_pass=("tests/test_calc.py::test_add_positive",), repo_url=str(repo),
        install_config=InstallConfig(test_cmd="python3 -m pytest -rA -p no:cacheprovider tests"),
        extra={"half": _diff_after(repo, {"calc.py": CALC.replace(
            "a + b if a > 0 else a - b", "a + b")})},
    )  # fmt: skip


@pytest.fixture
async def client(server):
    async with AsyncSandboxClient(base_url=server.url) as c:
        yield c


def test_the_files_of_a_patch_are_found(task):
    assert files_in_patch(task.test_patch) == ["tests/test_calc.py"]


async def test_the_gold_patch_resolves(client, task):
    result = await grade(client, task, task.patch)
    assert result.status == "resolved", result
    assert result.apply_method == "git apply"
    assert sorted(result.fail_to_pass["success"]) == sorted(task.fail_to_pass)


async def test_an_empty_patch_is_unresolved(client, task):
    result = await grade(client, task, "")
    assert result.status == "unresolved" and result.apply_method is None
    assert sorted(result.fail_to_pass["failure"]) == sorted(task.fail_to_pass)


async def test_fixing_one_of_two_bugs_is_partial(client, task):
    result = await grade(client, task, task.extra["half"])
    assert result.status == "partial", result
    assert result.fail_to_pass["success"] == ["tests/test_calc.py::test_add_negative"]


async def test_a_patch_that_does_not_apply_is_patch_failed(client, task):
    junk = task.patch.replace("return a * b + 1", "return something else")
    result = await grade(client, task, junk)
    assert result.status == "patch_failed" and "no method" in (result.error or "")


async def test_a_patch_with_drifted_context_applies_with_fuzz(client, task):
    # The hunk's first context line no longer matches: git apply refuses, patch's fuzz copes.
    drifted = task.patch.replace("\n def add(a, b):\n", "\n def add(a, b):  # drifted\n", 1)
    assert drifted != task.patch
    result = await grade(client, task, drifted)
    assert result.status == "resolved" and result.apply_method == "patch --fuzz", result


async def test_a_model_editing_the_tests_gains_nothing(client, task):
    cheat = task.extra["half"] + _tests_deleted(task)
    result = await grade(client, task, cheat)
    assert result.status == "partial"  # the test files were reset before the test patch


async def test_a_broken_test_command_is_an_error_not_a_failure(client, task):
    from attrs import evolve

    broken = evolve(task, install_config=InstallConfig(test_cmd="echo no tests here"))
    result = await grade(client, broken, task.patch)
    assert result.status == "error" and "no test results" in (result.error or "")


def _tests_deleted(task: Task) -> str:
    return (
        "diff --git a/tests/test_calc.py b/tests/test_calc.py\n"
        "deleted file mode 100644\n"
        "--- a/tests/test_calc.py\n"
        "+++ /dev/null\n"
        "@@ -1,5 +0,0 @@\n"
        "-from calc import add\n-\n-\n-def test_add_positive():\n-    assert add(1, 2) == 3\n"
    )
