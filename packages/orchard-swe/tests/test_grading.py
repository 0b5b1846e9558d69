"""Grading against a real Orchard service, on a small repository made here.

The repository has two bugs; the gold patch fixes both, a half patch one of them.
"""

from __future__ import annotations

import pytest

from orchard_swe.grading import files_in_patch, grade
from orchard_swe.tasks import InstallConfig, Task

pytestmark = pytest.mark.integration


def test_the_files_of_a_patch_are_found(calc_task):
    assert files_in_patch(calc_task.test_patch) == ["tests/test_calc.py"]


async def test_the_gold_patch_resolves(client, calc_task):
    result = await grade(client, calc_task, calc_task.patch)
    assert result.status == "resolved", result
    assert result.apply_method == "git apply"
    assert sorted(result.fail_to_pass["success"]) == sorted(calc_task.fail_to_pass)


async def test_an_empty_patch_is_unresolved(client, calc_task):
    result = await grade(client, calc_task, "")
    assert result.status == "unresolved" and result.apply_method is None
    assert sorted(result.fail_to_pass["failure"]) == sorted(calc_task.fail_to_pass)


async def test_fixing_one_of_two_bugs_is_partial(client, calc_task):
    result = await grade(client, calc_task, calc_task.extra["half"])
    assert result.status == "partial", result
    assert result.fail_to_pass["success"] == ["tests/test_calc.py::test_add_negative"]


async def test_a_patch_that_does_not_apply_is_patch_failed(client, calc_task):
    junk = calc_task.patch.replace("return a * b + 1", "return something else")
    result = await grade(client, calc_task, junk)
    assert result.status == "patch_failed" and "no method" in (result.error or "")


async def test_a_patch_with_drifted_context_applies_with_fuzz(client, calc_task):
    # The hunk's first context line no longer matches: git apply refuses, patch's fuzz copes.
    drifted = calc_task.patch.replace("\n def add(a, b):\n", "\n def add(a, b):  # drifted\n", 1)
    assert drifted != calc_task.patch
    result = await grade(client, calc_task, drifted)
    assert result.status == "resolved" and result.apply_method == "patch --fuzz", result


async def test_a_model_editing_the_tests_gains_nothing(client, calc_task):
    cheat = calc_task.extra["half"] + _tests_deleted(calc_task)
    result = await grade(client, calc_task, cheat)
    assert result.status == "partial"  # the test files were reset before the test patch


async def test_a_broken_test_command_is_an_error_not_a_failure(client, calc_task):
    from attrs import evolve

    broken = evolve(calc_task, install_config=InstallConfig(test_cmd="echo no tests here"))
    result = await grade(client, broken, calc_task.patch)
    assert result.status == "error" and "no test results" in (result.error or "")
    assert "exited 0" in (result.error or "") and "no tests here" in (result.error or "")
    assert result.test_exit_code == 0


async def test_a_test_command_that_cannot_run_says_why(client, calc_task):
    from attrs import evolve

    command = "no-such-python -m pytest -rA tests"
    missing = evolve(calc_task, install_config=InstallConfig(test_cmd=command))
    result = await grade(client, missing, calc_task.patch)
    error = result.error or ""
    assert result.status == "error" and result.test_exit_code == 127, result
    assert error.startswith("the test command failed (exit 127, command not found)")
    assert command in error and "no-such-python" in error.split("its output ends:")[1]
    assert "the test log holds no test results" not in error


async def test_a_failing_test_command_quotes_only_the_tail_of_its_output(client, calc_task):
    from attrs import evolve

    command = "seq 1 5000; echo 'ImportError: no module named calc' >&2; exit 4"
    failing = evolve(calc_task, install_config=InstallConfig(test_cmd=command))
    result = await grade(client, failing, calc_task.patch)
    error = result.error or ""
    assert result.status == "error" and result.test_exit_code == 4, result
    assert f"failed (exit 4) and reported no test results: {command}" in error
    tail = error.split("its output ends:\n")[1].splitlines()
    assert tail[-1] == "ImportError: no module named calc" and tail[-2] == "5000"
    assert len(tail) == 20 and "4981" not in tail  # the last 20 lines, not the whole log
    assert "1\n2\n3\n" in result.test_log  # the full log is still kept


def _tests_deleted(task: Task) -> str:
    return (
        "diff --git a/tests/test_calc.py b/tests/test_calc.py\n"
        "deleted file mode 100644\n"
        "--- a/tests/test_calc.py\n"
        "+++ /dev/null\n"
        "@@ -1,5 +0,0 @@\n"
        "-from calc import add\n-\n-\n-def test_add_positive():\n-    assert add(1, 2) == 3\n"
    )


async def test_rollout_sandboxes_hold_no_history_to_read_the_answer_from(client, calc_task):
    from orchard_swe.environment import prepare

    sandbox, spec = await prepare(client, calc_task, hide_history=True)
    try:
        log = await sandbox.exec(
            "git log --oneline --all | wc -l; git tag | wc -l", cwd=spec.repo_dir
        )
        assert log.stdout.split() == ["1", "0"]
        shown = await sandbox.exec(f"git cat-file -t {calc_task.base_commit}", cwd=spec.repo_dir)
        assert shown.exit_code != 0  # the original commit object is gone too
        assert (await sandbox.exec("git status --porcelain", cwd=spec.repo_dir)).stdout == ""
        assert "a > 0" in (await sandbox.download_content(f"{spec.repo_dir}/calc.py")).decode()
    finally:
        await sandbox.delete()
