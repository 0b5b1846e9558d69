#!/usr/bin/env python3
"""Verify the built-in SWE task set on this host, without a sandbox.

For every task in ``orchard_swe/builtin/tasks.jsonl``:

1. clone its bundle (``repo_url`` = ``builtin:<project>.bundle``) into a temporary
   directory and check out ``base_commit`` (which must be what tag ``task/<instance_id>``
   points at);
2. run the test command on the bare base commit: every existing test passes there and none
   of the FAIL_TO_PASS tests exists yet (the base does not contain the new tests);
3. apply ``test_patch`` (``git apply``) and run ``install_config.test_cmd`` again: every
   FAIL_TO_PASS test fails and every PASS_TO_PASS test passes. This is also the "empty
   patch" check: a model that changes nothing leaves at least one FAIL_TO_PASS failing;
4. additionally apply the gold ``patch``: every FAIL_TO_PASS and PASS_TO_PASS test passes.

It also checks that ``patch`` touches source files only and ``test_patch`` test files only.
Tests run with Debian's ``/usr/bin/python3`` (what the sandboxes have; ``apt-get install -y
python3-pytest`` provides pytest, ``--install-pytest`` does that when it is missing), never
with a virtualenv's interpreter. ``python3`` in the test command resolves to that
interpreter. The pytest log is parsed from its ``-rA`` summary lines exactly as SWE-bench's
``parse_log_pytest`` does.

Standard library only, so it runs under any Python 3.11+::

    python3 packages/orchard-swe/scripts/verify_builtin_tasks.py [-j 2] [--only ID ...]

Prints a table and exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BUILTIN_DIR = Path(__file__).resolve().parents[1] / "src" / "orchard_swe" / "builtin"
TASKS_FILE = BUILTIN_DIR / "tasks.jsonl"
REPOS_DIR = BUILTIN_DIR / "repos"
DEFAULT_PYTHON = "/usr/bin/python3"
RUN_TIMEOUT = 600.0

# SWE-bench's TestStatus values, in its order.
STATUSES = ("FAILED", "PASSED", "SKIPPED", "ERROR", "XFAIL")
FAILING = ("FAILED", "ERROR")

# Variables that would make the task's tests see something other than the bare repository
# and Debian's interpreter.
_DROP_ENV = (
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSAFEPATH",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "PYTEST_ADDOPTS",
    "PYTEST_PLUGINS",
    "PYTEST_CURRENT_TEST",
    "PYTEST_XDIST_WORKER",
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD",
    "UV_PROJECT_ENVIRONMENT",
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
)


# ---------------------------------------------------------------------------- parsing


def parse_pytest_log(log: str) -> dict[str, str]:
    """Test id -> status from pytest's ``-rA`` summary, as SWE-bench's ``parse_log_pytest``.

    A line counts when it starts with a status word; for FAILED lines `` - `` (the start of
    the message) becomes a space; the id is the second whitespace-separated word. So ids
    that contain whitespace cannot be told apart by this parser: the task set lists none.
    ``SKIPPED [N] file:line: reason`` summary lines are not tests.
    """
    statuses: dict[str, str] = {}
    for line in log.split("\n"):
        if not any(line.startswith(status) for status in STATUSES):
            continue
        if line.startswith("FAILED"):
            line = line.replace(" - ", " ")
        words = line.split()
        if len(words) <= 1:
            continue
        status, name = words[0], words[1]
        if (
            status == "SKIPPED"
            and name.startswith("[")
            and name.endswith("]")
            and name[1:-1].isdigit()
        ):
            continue
        statuses[name] = status
    return statuses


def truncated_ids(log: str) -> set[str]:
    """Parser keys that stand for a longer test id: ``PASSED`` lines whose id has whitespace.

    ``parse_pytest_log`` (like SWE-bench's) keeps only the first word, so
    ``test_x[funky jeans]`` becomes ``test_x[funky``; such keys belong in no test list.
    """
    keys = set()
    for line in log.split("\n"):
        if line.startswith("PASSED "):
            rest = line[len("PASSED ") :].strip()
            if any(c.isspace() for c in rest):
                keys.add(rest.split()[0])
    return keys


def test_list(value: Any) -> list[str]:
    """FAIL_TO_PASS / PASS_TO_PASS: a JSON string holding a list (as SWE-bench ships them)."""
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"not a list of test ids: {value!r}")
    return value


def patch_files(patch: str) -> list[str]:
    """The paths a unified git diff touches (both sides of each ``diff --git`` header)."""
    files: list[str] = []
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            rest = line[len("diff --git ") :]
            a, sep, b = rest.partition(" b/")
            for path in (a.removeprefix("a/"), b if sep else ""):
                if path and path not in files:
                    files.append(path)
    return files


def is_test_path(path: str) -> bool:
    """SWE-bench's notion of a test file: under a test(s) directory or named like a test."""
    parts = path.split("/")
    name = parts[-1]
    return (
        any(p in ("test", "tests", "testing") for p in parts[:-1])
        or name.startswith("test_")
        or name.endswith("_test.py")
        or name == "conftest.py"
    )


# ---------------------------------------------------------------------------- host python


def pytest_version(python: str) -> str | None:
    """``python -m pytest --version``'s answer, or None when pytest is not importable."""
    if not Path(python).exists():
        return None
    done = subprocess.run(
        [python, "-m", "pytest", "--version"],
        capture_output=True,
        text=True,
        env=_clean_env(),
        timeout=120,
    )
    if done.returncode != 0:
        return None
    return (done.stdout + done.stderr).strip().splitlines()[-1]


def ensure_host_pytest(python: str = DEFAULT_PYTHON, install: bool = False) -> str:
    """Make sure ``python -m pytest`` works; with ``install`` apt-get installs python3-pytest.

    Returns pytest's version line; raises RuntimeError saying what is missing.
    """
    version = pytest_version(python)
    if version is not None:
        return version
    if install and python == DEFAULT_PYTHON and shutil.which("apt-get"):
        env = {**_clean_env(), "DEBIAN_FRONTEND": "noninteractive"}
        cmd = ["apt-get", "install", "-y", "-q", "python3-pytest"]
        if os.geteuid() != 0:
            cmd = ["sudo", "-n", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if done.returncode != 0:  # a fresh machine may need its package lists first
            update = [*cmd[: cmd.index("install")], "update", "-q"]
            subprocess.run(update, capture_output=True, text=True, env=env, timeout=900)
            subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        version = pytest_version(python)
        if version is not None:
            return version
    raise RuntimeError(
        f"{python} -m pytest does not work: install it with 'apt-get install -y python3-pytest'"
        " (or pass --install-pytest)"
    )


# ---------------------------------------------------------------------------- git & runs


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
    env.update(
        {
            "PYTHONDONTWRITEBYTECODE": "1",
            "PY_COLORS": "0",
            "NO_COLOR": "1",
            "COLUMNS": "200",
            "LC_ALL": "C.UTF-8",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_TERMINAL_PROMPT": "0",
        }
    )
    return env


def git(repo: Path | str, *args: str, input: str | None = None, check: bool = True) -> str:
    """Run git in ``repo`` with the user's and the system's configuration ignored."""
    done = subprocess.run(
        ["git", "-c", "core.autocrlf=false", "-c", "advice.detachedHead=false", *args],
        cwd=repo,
        input=input,
        capture_output=True,
        text=True,
        env=_clean_env(),
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def checkout(source: Path | str, commit: str, dest: Path) -> None:
    """Clone ``source`` (a bundle or repository) into ``dest`` and check out ``commit``."""
    git(dest.parent, "clone", "-q", "--no-checkout", str(source), dest.name)
    git(dest, "checkout", "-q", "--detach", commit)


def apply_patch(repo: Path, patch: str) -> None:
    """``git apply`` a patch in ``repo``; RuntimeError if it does not apply."""
    if patch.strip():
        git(repo, "apply", "-", input=patch)


def reset(repo: Path) -> None:
    """Back to the checked-out commit: drop every change and every untracked file."""
    git(repo, "reset", "-q", "--hard")
    git(repo, "clean", "-q", "-fdx")


@dataclass
class Run:
    """One run of a task's test command."""

    returncode: int
    log: str
    statuses: dict[str, str]
    seconds: float


def run_tests(
    repo: Path, test_cmd: str, python: str = DEFAULT_PYTHON, timeout: float = RUN_TIMEOUT
) -> Run:
    """Run ``test_cmd`` in ``repo`` with ``python3`` meaning ``python``; parse its summary."""
    with tempfile.TemporaryDirectory(prefix="orchard-shim-") as shim:
        wrapper = Path(shim) / "python3"  # a script, not a symlink: venvs stay venvs
        wrapper.write_text(f'#!/bin/sh\nexec "{python}" "$@"\n')
        wrapper.chmod(0o755)
        env = _clean_env()
        env["PATH"] = shim + os.pathsep + env.get("PATH", "/usr/bin:/bin")
        shell = shutil.which("bash") or "/bin/sh"
        start = time.monotonic()
        try:
            done = subprocess.run(
                [shell, "-c", test_cmd],
                cwd=repo,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
            returncode, log = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            returncode, log = -9, out + f"\n[timed out after {timeout}s]\n"
        seconds = time.monotonic() - start
    return Run(returncode, log, parse_pytest_log(log), seconds)


# ---------------------------------------------------------------------------- verification


def load_tasks(path: Path | str = TASKS_FILE) -> list[dict[str, Any]]:
    """The task rows of a JSONL file."""
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


def bundle_path(task: Mapping[str, Any], repos_dir: Path = REPOS_DIR) -> Path:
    """Where a task's bundle is: ``repo_url`` is ``builtin:<file>``."""
    url = str(task.get("repo_url") or "")
    if not url.startswith("builtin:"):
        raise ValueError(f"{task.get('instance_id')}: repo_url {url!r} is not builtin:<bundle>")
    return repos_dir / url.removeprefix("builtin:")


@dataclass
class TaskResult:
    """What verifying one task found; ``problems`` empty means it is consistent."""

    instance_id: str
    fail_to_pass: int = 0
    pass_to_pass: int = 0
    base: str = "-"  # the bare base commit: existing tests
    with_tests: str = "-"  # base + test_patch
    gold: str = "-"  # base + test_patch + patch
    empty_patch: str = "-"  # does an empty model patch stay unresolved?
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    logs: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def _summary(
    statuses: Mapping[str, str], wanted: Iterable[str], good: Sequence[str]
) -> tuple[int, list[str]]:
    good_count, bad = 0, []
    for test in wanted:
        status = statuses.get(test, "MISSING")
        if status in good:
            good_count += 1
        else:
            bad.append(f"{test} ({status})")
    return good_count, bad


def _shown(tests: list[str], limit: int = 5) -> str:
    more = f" ... and {len(tests) - limit} more" if len(tests) > limit else ""
    return ", ".join(tests[:limit]) + more


def verify_task(
    task: Mapping[str, Any],
    python: str = DEFAULT_PYTHON,
    repos_dir: Path = REPOS_DIR,
    keep_logs: bool = False,
) -> TaskResult:
    """Check one task on this host (see the module docstring); never raises for a bad task."""
    iid = str(task.get("instance_id"))
    result = TaskResult(iid)
    start = time.monotonic()
    try:
        _verify(task, python, repos_dir, result, keep_logs)
    except Exception as exc:  # a broken task is a finding, not a crash
        result.problems.append(f"{type(exc).__name__}: {exc}")
    result.seconds = time.monotonic() - start
    return result


def _metadata_problems(
    task: Mapping[str, Any], f2p: list[str], p2p: list[str], config: Mapping[str, Any]
) -> list[str]:
    """What is wrong with the task's fields, before anything runs."""
    problems = []
    if not f2p:
        problems.append("FAIL_TO_PASS is empty")
    if set(f2p) & set(p2p):
        problems.append(f"in both lists: {_shown(sorted(set(f2p) & set(p2p)))}")
    spaced = [t for t in f2p + p2p if any(c.isspace() for c in t)]
    if spaced:
        problems.append(
            f"test ids with whitespace (SWE-bench's parser cannot match them): {_shown(spaced)}"
        )
    if task.get("environment_setup_commit") not in (None, task["base_commit"]):
        problems.append("environment_setup_commit differs from base_commit")
    if config.get("install"):
        problems.append("install_config.install is not empty (the tests must need no install)")
    source_files = patch_files(task["patch"])
    test_files = patch_files(task["test_patch"])
    if not source_files:
        problems.append("patch is empty")
    if not test_files:
        problems.append("test_patch is empty")
    if [f for f in source_files if is_test_path(f)]:
        problems.append(f"patch touches test files: {[f for f in source_files if is_test_path(f)]}")
    if [f for f in test_files if not is_test_path(f)]:
        problems.append(
            f"test_patch touches non-test files: {[f for f in test_files if not is_test_path(f)]}"
        )
    return problems


def _ref_problems(repo: Path, iid: str, base: str) -> list[str]:
    problems = []
    head = git(repo, "rev-parse", "HEAD").strip()
    if head != base:
        problems.append(f"base_commit {base} resolves to {head}")
    tag = git(
        repo, "rev-parse", "-q", "--verify", f"refs/tags/task/{iid}^{{commit}}", check=False
    ).strip()
    if tag != base:
        problems.append(f"tag task/{iid} is {tag or 'missing'}, not base_commit")
    return problems


def _check_base(bare: Any, f2p: list[str], result: TaskResult) -> None:
    """The bare base: existing tests pass, the new ones are not there yet."""
    failing = sorted(t for t, s in bare.statuses.items() if s in FAILING)
    present = [t for t in f2p if t in bare.statuses]
    if not bare.statuses:
        result.problems.append(
            f"base: the test command ran no test (exit {bare.returncode}): {bare.log[-500:]}"
        )
    result.base = f"{len(bare.statuses)} run, {len(failing)} fail"
    if failing:
        result.problems.append(f"base: existing tests fail without test_patch: {_shown(failing)}")
    if present:
        result.problems.append(f"base already contains FAIL_TO_PASS tests: {_shown(present)}")


def _check_with_tests(before: Any, f2p: list[str], p2p: list[str], result: TaskResult) -> None:
    """Base + test_patch: F2P fail, P2P pass (this is also the empty-patch outcome)."""
    f2p_failing, f2p_bad = _summary(before.statuses, f2p, FAILING)
    p2p_passing, p2p_bad = _summary(before.statuses, p2p, ("PASSED",))
    result.with_tests = f"F2P {f2p_failing}/{len(f2p)} fail, P2P {p2p_passing}/{len(p2p)} pass"
    if f2p_bad:
        result.problems.append(f"base+test_patch: FAIL_TO_PASS not failing: {_shown(f2p_bad)}")
    if p2p_bad:
        result.problems.append(f"base+test_patch: PASS_TO_PASS not passing: {_shown(p2p_bad)}")
    unresolved = f2p_failing > 0
    result.empty_patch = "unresolved" if unresolved else "RESOLVED"
    if not unresolved:
        result.problems.append(
            "the empty patch resolves the task: no FAIL_TO_PASS test fails without the fix"
        )


def _check_gold(
    before: Any, after: Any, f2p: list[str], p2p: list[str], result: TaskResult
) -> None:
    """+ gold patch: everything passes."""
    good, bad = _summary(after.statuses, f2p + p2p, ("PASSED",))
    result.gold = f"{good}/{len(f2p) + len(p2p)} pass"
    if bad:
        result.problems.append(f"gold: not passing: {_shown(bad)}")
    truncated = sorted(set(f2p + p2p) & (truncated_ids(before.log) | truncated_ids(after.log)))
    if truncated:
        result.problems.append(
            f"listed ids that are cut-off test ids with whitespace: {_shown(truncated)}"
        )


def _verify(
    task: Mapping[str, Any], python: str, repos_dir: Path, result: TaskResult, keep_logs: bool
) -> None:
    f2p = test_list(task["FAIL_TO_PASS"])
    p2p = test_list(task["PASS_TO_PASS"])
    result.fail_to_pass, result.pass_to_pass = len(f2p), len(p2p)
    config = task["install_config"]
    if isinstance(config, str):
        config = json.loads(config)
    test_cmd = config["test_cmd"]
    result.problems += _metadata_problems(task, f2p, p2p, config)
    bundle = bundle_path(task, repos_dir)
    if not bundle.is_file():
        result.problems.append(f"bundle {bundle} is missing")
        return
    with tempfile.TemporaryDirectory(prefix="orchard-verify-") as tmp:
        repo = Path(tmp) / "repo"
        checkout(bundle, task["base_commit"], repo)
        result.problems += _ref_problems(repo, result.instance_id, task["base_commit"])
        bare = run_tests(repo, test_cmd, python)
        _check_base(bare, f2p, result)
        apply_patch(repo, task["test_patch"])
        before = run_tests(repo, test_cmd, python)
        _check_with_tests(before, f2p, p2p, result)
        apply_patch(repo, task["patch"])
        after = run_tests(repo, test_cmd, python)
        _check_gold(before, after, f2p, p2p, result)
        if keep_logs or result.problems:
            result.logs = {"base": bare.log, "with_tests": before.log, "gold": after.log}


def verify_all(
    tasks: Sequence[Mapping[str, Any]],
    python: str = DEFAULT_PYTHON,
    repos_dir: Path = REPOS_DIR,
    jobs: int = 2,
    keep_logs: bool = False,
) -> list[TaskResult]:
    """Verify every task, ``jobs`` at a time; results in the tasks' order."""
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(lambda t: verify_task(t, python, repos_dir, keep_logs), tasks))


def format_table(results: Sequence[TaskResult]) -> str:
    """A plain-text table of the results."""
    header = (
        "instance_id",
        "F2P",
        "P2P",
        "base",
        "base+test_patch",
        "+gold patch",
        "empty patch",
        "secs",
        "result",
    )
    rows = [header] + [
        (
            r.instance_id,
            str(r.fail_to_pass),
            str(r.pass_to_pass),
            r.base,
            r.with_tests,
            r.gold,
            r.empty_patch,
            f"{r.seconds:.1f}",
            "OK" if r.ok else "MISMATCH",
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=Path, default=TASKS_FILE, help="tasks.jsonl to verify")
    parser.add_argument(
        "--repos", type=Path, default=None, help="bundle directory (default: beside tasks)"
    )
    parser.add_argument("--python", default=DEFAULT_PYTHON, help="interpreter that runs the tests")
    parser.add_argument(
        "--only", nargs="*", default=None, metavar="ID", help="verify only these ids"
    )
    parser.add_argument("-j", "--jobs", type=int, default=2, help="tasks verified at once")
    parser.add_argument(
        "--install-pytest", action="store_true", help="apt-get install python3-pytest if missing"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="print the logs of failing tasks"
    )
    args = parser.parse_args(argv)

    repos = args.repos or args.tasks.resolve().parent / "repos"
    tasks = load_tasks(args.tasks)
    if args.only:
        unknown = set(args.only) - {t["instance_id"] for t in tasks}
        if unknown:
            parser.error(f"unknown instance ids: {', '.join(sorted(unknown))}")
        tasks = [t for t in tasks if t["instance_id"] in args.only]
    try:
        version = ensure_host_pytest(args.python, install=args.install_pytest)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(tasks)} task(s); tests run with {args.python} ({version})")
    start = time.monotonic()
    results = verify_all(tasks, args.python, repos, args.jobs)
    print(format_table(results))
    bad = [r for r in results if not r.ok]
    for r in bad:
        print(f"\n{r.instance_id}:")
        for problem in r.problems:
            print(f"  - {problem}")
        if args.verbose:
            for name, log in r.logs.items():
                print(f"  --- {name} log (tail) ---\n{log[-3000:]}")
    total = time.monotonic() - start
    print(f"\n{len(results) - len(bad)}/{len(results)} consistent in {total:.1f}s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
