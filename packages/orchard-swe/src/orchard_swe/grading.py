"""Grading a model patch exactly as SWE-bench does, in a fresh Orchard sandbox.

1. A new sandbox with the repository at ``base_commit`` (``environment.prepare``).
2. The model patch applied: ``git apply``, then ``git apply --3way``, then
   ``patch --fuzz``; none applying is ``patch_failed``.
3. The test files the ``test_patch`` touches reset to ``base_commit``, then ``test_patch``
   applied (a model cannot pass by editing the tests).
4. The instance's test command run; its log parsed by the ``swebench`` package's parser for
   ``install_config.log_parser`` and judged by ``swebench``'s own grading rules
   (FAIL_TO_PASS must pass; PASS_TO_PASS must keep passing, a skip is no regression).

Outcomes: ``resolved`` (all FAIL_TO_PASS and PASS_TO_PASS pass), ``partial`` (some
FAIL_TO_PASS pass, PASS_TO_PASS intact), ``unresolved``, ``patch_failed``, ``error``
(the environment or the test run broke, not the patch).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any, Literal

import attrs

from orchard_env_client import AsyncSandbox, AsyncSandboxClient
from orchard_env_client.errors import OrchardError

from .environment import PrepareError, prepare
from .tasks import Task

Status = Literal["resolved", "partial", "unresolved", "patch_failed", "error"]
STATUSES: tuple[Status, ...] = ("resolved", "partial", "unresolved", "patch_failed", "error")
_PATCH_FILE = "/tmp/orchard-model.patch"
_TEST_PATCH_FILE = "/tmp/orchard-test.patch"
_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
# How much of a failed test command's output a grade's ``error`` quotes.
TAIL_LINES = 20
TAIL_CHARS = 2048


@attrs.define
class GradeResult:
    """What grading one instance found; ``status`` is one of ``STATUSES``."""

    instance_id: str
    status: Status
    fail_to_pass: dict[str, list[str]] = attrs.Factory(dict)  # success / failure
    pass_to_pass: dict[str, list[str]] = attrs.Factory(dict)
    apply_method: str | None = None
    error: str | None = None
    test_log: str = ""
    duration_s: float = 0.0
    test_exit_code: int | None = None  # the test command's, once it ran to an end

    def to_dict(self, with_log: bool = False) -> dict[str, Any]:
        data = attrs.asdict(self)
        if not with_log:
            data.pop("test_log")
        return data


def files_in_patch(patch: str) -> list[str]:
    """Paths a unified git diff touches (both sides of renames)."""
    paths: list[str] = []
    for a, b in _DIFF_FILE.findall(patch):
        for path in (a, b):
            if path not in paths:
                paths.append(path)
    return paths


def output_tail(text: str, lines: int = TAIL_LINES, chars: int = TAIL_CHARS) -> str:
    """The last ``lines`` lines of ``text``, at most ``chars`` characters of them."""
    tail = "\n".join(text.rstrip("\n").splitlines()[-lines:])
    if len(tail) > chars:
        tail = "..." + tail[-(chars - 3) :]
    return tail


def no_results_error(
    command: str, exit_code: int | None, output: str, job_error: str | None = None
) -> str:
    """The grade's ``error`` when a test run's output holds no test results.

    A command that exited non-zero most likely never ran the tests (``python: not found``,
    a missing module, a broken conftest): say so, with the command, its exit code and the
    tail of what it printed, so that the cause can be read from the grade itself.
    """
    if len(command) > 500:
        command = command[:497] + "..."
    tail = output_tail(output)
    shown = f"; its output ends:\n{tail}" if tail else "; it printed nothing"
    if exit_code == 0:
        return f"the test log holds no test results (the test command exited 0): {command}{shown}"
    if exit_code is None:
        why = f"ended without an exit code ({job_error or 'no reason given'})"
    else:
        why = f"failed (exit {exit_code}{_exit_meaning(exit_code)})"
    return f"the test command {why} and reported no test results: {command}{shown}"


def _exit_meaning(code: int) -> str:
    if code == 126:
        return ", not executable"
    if code == 127:
        return ", command not found"
    if 128 < code < 160:
        return f", killed by signal {code - 128}"
    return ""


def log_parser(name: str) -> Callable[[str], dict[str, str]]:
    """``swebench``'s log parser by name (``pytest``, ``django``, ``pytest_v2``, ...)."""
    from swebench.harness.log_parsers import python as parsers

    function = getattr(parsers, f"parse_log_{name}", None)
    if function is None:
        known = sorted(
            n.removeprefix("parse_log_") for n in dir(parsers) if n.startswith("parse_log_")
        )
        raise ValueError(f"unknown log_parser {name!r} (swebench has: {', '.join(known)})")
    return lambda log: dict(function(log, None))


def judge(task: Task, status_map: dict[str, str]) -> tuple[Status, dict[str, Any]]:
    """Apply SWE-bench's grading rules to a parsed test log."""
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS
    from swebench.harness.grading import get_eval_tests_report, get_resolution_status

    gold = {FAIL_TO_PASS: list(task.fail_to_pass), PASS_TO_PASS: list(task.pass_to_pass)}
    report = get_eval_tests_report(status_map, gold)
    resolution = str(get_resolution_status(report))
    status: Status = {"RESOLVED_FULL": "resolved", "RESOLVED_PARTIAL": "partial"}.get(
        resolution, "unresolved"
    )  # type: ignore[assignment]
    return status, {"fail_to_pass": report[FAIL_TO_PASS], "pass_to_pass": report[PASS_TO_PASS]}


async def apply_model_patch(sandbox: AsyncSandbox, repo_dir: str, patch: str) -> str | None:
    """Apply ``patch`` in ``repo_dir``; the method that worked, or None if none did."""
    await sandbox.upload_content(_PATCH_FILE, patch)
    attempts = [
        ("git apply", f"git apply --verbose {_PATCH_FILE}"),
        ("git apply --3way", f"git apply --verbose --3way {_PATCH_FILE}"),
        ("patch --fuzz", f"patch --batch --fuzz=5 -p1 -i {_PATCH_FILE}"),
    ]
    for method, command in attempts:
        job = await sandbox.exec(command, cwd=repo_dir, timeout=120)
        if job.exit_code == 0:
            return method
        await sandbox.exec("git reset -q --hard && git clean -fdq", cwd=repo_dir, timeout=60)
    return None


async def _reset_and_apply_tests(sandbox: AsyncSandbox, task: Task, repo_dir: str) -> None:
    for path in files_in_patch(task.test_patch):
        # Restore what base_commit has; a file it lacks is removed (the test patch adds it).
        await sandbox.exec(
            f"git checkout {task.base_commit} -- '{path}' 2>/dev/null || rm -f -- '{path}'",
            cwd=repo_dir,
            timeout=60,
        )
    await sandbox.upload_content(_TEST_PATCH_FILE, task.test_patch)
    job = await sandbox.exec(f"git apply --verbose {_TEST_PATCH_FILE}", cwd=repo_dir, timeout=120)
    if job.exit_code != 0:
        raise PrepareError(f"test_patch does not apply: {(job.stdout + job.stderr)[-1000:]}")


async def grade(
    client: AsyncSandboxClient,
    task: Task,
    model_patch: str,
    *,
    backend: str | None = None,
    default_image: str | None = None,
    test_timeout: float = 1800,
) -> GradeResult:
    """Grade one prediction in a fresh sandbox, deleted afterwards."""
    started = time.monotonic()
    result = GradeResult(instance_id=task.instance_id, status="error")
    try:
        sandbox, spec = await prepare(
            client,
            task,
            backend=backend,
            default_image=default_image,
            labels={"orchard-swe-role": "grade"},
        )
    except (PrepareError, OrchardError) as exc:
        result.error = f"environment: {exc}"
        return result
    try:
        if model_patch.strip():
            result.apply_method = await apply_model_patch(sandbox, spec.repo_dir, model_patch)
            if result.apply_method is None:
                result.status, result.error = "patch_failed", "the patch applies by no method"
                return result
        if task.test_patch:
            await _reset_and_apply_tests(sandbox, task, spec.repo_dir)
        job = await sandbox.exec(
            task.install_config.test_cmd, cwd=spec.repo_dir, timeout=test_timeout
        )
        result.test_log = job.stdout + job.stderr
        if job.timed_out:
            result.error = f"the test command timed out after {test_timeout:g} s"
            return result
        result.test_exit_code = job.exit_code
        status_map = log_parser(task.install_config.log_parser)(result.test_log)
        if not status_map:
            command = task.install_config.test_cmd
            result.error = no_results_error(command, job.exit_code, result.test_log, job.error)
            return result
        result.status, report = judge(task, status_map)
        result.fail_to_pass, result.pass_to_pass = report["fail_to_pass"], report["pass_to_pass"]
    except (PrepareError, OrchardError, ValueError) as exc:
        result.status, result.error = "error", str(exc)
    finally:
        result.duration_s = time.monotonic() - started
        await sandbox.delete()
    return result
