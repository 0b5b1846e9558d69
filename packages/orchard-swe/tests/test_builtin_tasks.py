"""The built-in SWE task set stays consistent: every task verified on this host.

For each task in ``orchard_swe/builtin/tasks.jsonl`` its bundle is cloned, the base commit
checked out and the test command run with Debian's ``/usr/bin/python3`` (never the
virtualenv's interpreter): the existing tests pass at the base, FAIL_TO_PASS fail and
PASS_TO_PASS pass with the test patch, everything passes with the gold patch. The work is
``scripts/verify_builtin_tasks.py``'s; these tests call it. pytest for Debian's interpreter
comes from ``apt-get install -y python3-pytest``, which the fixture runs when it is missing
and it may (root, apt-get present).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.integration

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


verify = _load("verify_builtin_tasks")
TASKS: list[dict[str, Any]] = verify.load_tasks()
IDS = [t["instance_id"] for t in TASKS]


@pytest.fixture(scope="module")
def host_python() -> str:
    """Debian's interpreter with pytest (installed by apt-get when missing and possible)."""
    python = os.environ.get("ORCHARD_SWE_HOST_PYTHON", verify.DEFAULT_PYTHON)
    if not Path(python).exists():
        pytest.fail(f"{python} does not exist: the task tests run with Debian's python3")
    can_install = shutil.which("apt-get") is not None and os.geteuid() == 0
    try:
        verify.ensure_host_pytest(python, install=can_install)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    return python


@pytest.fixture(scope="module")
def results(host_python: str) -> dict[str, Any]:
    """Every task verified once, two at a time (the machine has two cores)."""
    done = verify.verify_all(TASKS, host_python, jobs=2, keep_logs=True)
    print("\n" + verify.format_table(done))
    return {r.instance_id: r for r in done}


def test_task_file_shape() -> None:
    assert len(TASKS) >= 8
    assert len(set(IDS)) == len(IDS)
    projects = {t["repo_url"] for t in TASKS}
    assert len(projects) >= 3
    for task in TASKS:
        iid = task["instance_id"]
        project = task["repo_url"].removeprefix("builtin:").removesuffix(".bundle")
        assert re.fullmatch(rf"{re.escape(project)}__{re.escape(project)}-\d+", iid), iid
        assert task["repo_url"] == f"builtin:{project}.bundle"
        assert verify.bundle_path(task).is_file(), iid
        assert re.fullmatch(r"[0-9a-f]{40}", task["base_commit"]), iid
        assert task["environment_setup_commit"] == task["base_commit"]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", task["created_at"]), iid
        assert (
            task["version"] and task["problem_statement"].strip() and task["repo"].count("/") == 1
        )
        # SWE-bench ships the test lists as JSON strings
        assert isinstance(task["FAIL_TO_PASS"], str) and isinstance(task["PASS_TO_PASS"], str)
        f2p, p2p = json.loads(task["FAIL_TO_PASS"]), json.loads(task["PASS_TO_PASS"])
        assert f2p and p2p and not set(f2p) & set(p2p), iid
        assert all(not any(c.isspace() for c in t) for t in f2p + p2p), iid
        config = task["install_config"]
        assert config["install"] == "" and config["log_parser"] == "pytest"
        assert re.fullmatch(
            r"(PYTHONPATH=src )?python3 -m pytest -rA -p no:cacheprovider( \S+)+",
            config["test_cmd"],
        ), config["test_cmd"]
        for path in verify.patch_files(task["patch"]):
            assert not verify.is_test_path(path), (iid, path)
        for path in verify.patch_files(task["test_patch"]):
            assert verify.is_test_path(path), (iid, path)
        assert task["patch"].startswith("diff --git a/") and task["test_patch"].startswith(
            "diff --git a/"
        )


def test_bundles_hold_every_task_tag() -> None:
    by_bundle: dict[Path, list[dict[str, Any]]] = {}
    for task in TASKS:
        by_bundle.setdefault(verify.bundle_path(task), []).append(task)
    for bundle, tasks in by_bundle.items():
        listing = subprocess.run(
            ["git", "bundle", "list-heads", str(bundle)], capture_output=True, text=True, check=True
        ).stdout
        refs = {ref: sha for sha, ref in (line.split() for line in listing.splitlines())}
        assert "refs/heads/main" in refs, bundle
        for task in tasks:
            assert refs.get(f"refs/tags/task/{task['instance_id']}") == task["base_commit"]
        # each base commit sits on the clean snapshot, which main points at
        assert refs["refs/heads/main"] not in {t["base_commit"] for t in tasks}


@pytest.mark.parametrize("instance_id", IDS)
def test_builtin_task_is_consistent(instance_id: str, results: dict[str, Any]) -> None:
    result = results[instance_id]
    assert result.ok, "\n".join(result.problems)
    assert result.empty_patch == "unresolved"


def test_parser_agrees_with_swebench(results: dict[str, Any]) -> None:
    """The verifier reads the logs exactly as the grader (swebench's parser) does."""
    parsers = pytest.importorskip("swebench.harness.log_parsers.python")
    compared = 0
    for result in results.values():
        for log in result.logs.values():
            assert verify.parse_pytest_log(log) == parsers.parse_log_pytest(log, None)
            compared += 1
    assert compared == 3 * len(TASKS)


def test_a_broken_task_is_caught(host_python: str) -> None:
    """An empty gold patch and a wrong FAIL_TO_PASS entry are both reported."""
    task = dict(next(t for t in TASKS if t["instance_id"].startswith("toolz__")))
    p2p = json.loads(task["PASS_TO_PASS"])
    task["patch"] = ""
    task["FAIL_TO_PASS"] = json.dumps([*json.loads(task["FAIL_TO_PASS"]), p2p[0]])
    task["PASS_TO_PASS"] = json.dumps(p2p[1:])
    result = verify.verify_task(task, host_python)
    assert not result.ok
    problems = "\n".join(result.problems)
    assert "patch is empty" in problems
    assert "FAIL_TO_PASS not failing" in problems and p2p[0] in problems
    assert "gold: not passing" in problems
