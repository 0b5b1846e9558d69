"""The task schema, loaders, generator and checkers (offline: no sandbox).

The checkers are also run here against the reference solutions executed on the host in a
scratch copy of the workspace, and against those end states with one output emptied: a
run that writes the right files with the wrong content must fail.
"""

from __future__ import annotations

import collections
import json
import subprocess
from pathlib import Path

import pytest

from orchard_claw.tasks import (
    CHECKERS,
    KINDS,
    CheckResult,
    ClawTask,
    FinalState,
    TaskError,
    builtin_tasks,
    generate,
    get_checker,
    load_tasks,
    save_tasks,
    template_names,
)

fast = pytest.mark.fast
BUILTIN = builtin_tasks()


@fast
def test_builtin_set_covers_every_kind() -> None:
    assert len(BUILTIN) >= 30
    per_kind = collections.Counter(t.kind for t in BUILTIN)
    assert set(per_kind) == set(KINDS) and min(per_kind.values()) >= 5, per_kind
    assert len({t.id for t in BUILTIN}) == len(BUILTIN)
    for task in BUILTIN:
        assert task.checker in CHECKERS or get_checker(task.checker)
        assert task.instruction and task.reference.strip() and task.files
        assert all(not p.startswith("/") for p in task.files)
    assert any(t.service is not None for t in BUILTIN)


@fast
def test_builtin_by_kind_and_joined_specs() -> None:
    email = load_tasks("builtin:email")
    assert email and all(t.kind == "email" for t in email)
    both = load_tasks("builtin:email+gen:find_slot:2:seed=5")
    assert len(both) == len(email) + 2
    assert [t.id for t in both[-2:]] == ["gen-find_slot-5", "gen-find_slot-6"]
    with pytest.raises(TaskError, match="kind must be one of"):
        load_tasks("builtin:chores")


@fast
def test_generated_sets_are_deterministic_and_fresh() -> None:
    a = load_tasks("gen:email:6:seed=7")
    assert [t.to_dict() for t in a] == [t.to_dict() for t in load_tasks("gen:email:6:seed=7")]
    assert {t.kind for t in a} == {"email"}
    assert {t.meta["template"] for t in a} == set(template_names("email"))
    assert a[0].files != generate(a[0].meta["template"], 999).files
    everything = load_tasks("gen:all:11")
    assert {t.meta["template"] for t in everything} == set(template_names())
    with pytest.raises(TaskError, match="neither a template"):
        load_tasks("gen:nothing:3")
    with pytest.raises(TaskError, match="expected gen"):
        load_tasks("gen:email")
    with pytest.raises(TaskError, match="no template"):
        generate("nope", 1)


@fast
def test_duplicate_ids_are_refused() -> None:
    with pytest.raises(TaskError, match="duplicate task id"):
        load_tasks("gen:email:2+gen:email:2")


@fast
def test_round_trip_through_files_and_directories(tmp_path: Path) -> None:
    tasks = [BUILTIN[0], generate("weather_reminders", 4)]
    records = tmp_path / "tasks.jsonl"
    records.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in tasks))
    assert [t.to_dict() for t in load_tasks(records)] == [t.to_dict() for t in tasks]
    listed = tmp_path / "tasks.json"
    listed.write_text(json.dumps([t.to_dict() for t in tasks]))
    assert [t.id for t in load_tasks(listed)] == [t.id for t in tasks]
    folder = save_tasks(tasks, tmp_path / "set")
    assert (folder / tasks[1].id / "reference.sh").is_file()
    assert [t.to_dict() for t in load_tasks(folder)] == [t.to_dict() for t in tasks]


@fast
def test_bad_records_say_what_is_wrong(tmp_path: Path) -> None:
    good = generate("sales_summary", 1).to_dict()
    cases = [
        ({**good, "colour": "red"}, "unknown field"),
        ({k: v for k, v in good.items() if k != "checker"}, "missing field"),
        ({**good, "kind": "chores"}, "kind 'chores'"),
        ({**good, "files": {"../escape.txt": "x"}}, "must be relative"),
        ({**good, "id": "has space"}, "without spaces"),
        ({**good, "service": {"name": "x", "bogus": 1}}, "service"),
    ]
    for record, message in cases:
        path = tmp_path / "bad.jsonl"
        path.write_text(json.dumps(record) + "\n")
        with pytest.raises(TaskError, match=message):
            load_tasks(path)
    with pytest.raises(TaskError, match="neither a task set"):
        load_tasks(tmp_path / "missing.json")
    with pytest.raises(TaskError, match="no checker"):
        get_checker("nope")


def _run_reference_on_host(task: ClawTask, root: Path) -> FinalState:
    """The reference in a scratch workspace (its /workspace paths pointed at ``root``)."""
    for rel, content in task.files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(content)
    script = task.reference.replace("/workspace", str(root))
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return FinalState(root=root)


def _check(task: ClawTask, state: FinalState) -> CheckResult:
    return get_checker(task.checker)(task, state)


OFFLINE = [t for t in BUILTIN if t.service is None]


@pytest.mark.parametrize("task", OFFLINE, ids=lambda t: t.id)
def test_checker_reads_content_not_just_files(task: ClawTask, tmp_path: Path) -> None:
    seeded = FinalState(root=tmp_path / "seeded")
    for rel, content in task.files.items():
        (seeded.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (seeded.root / rel).write_text(content)
    idle = _check(task, seeded)
    assert not idle.passed and idle.score < 1
    state = _run_reference_on_host(task, tmp_path / "ws")
    assert _check(task, state).passed
    outputs = [rel for rel in state.files() if state.text(rel) != task.files.get(rel)]
    assert outputs
    for rel in outputs:
        original = (state.root / rel).read_text()
        (state.root / rel).write_text("")
        emptied = _check(task, state)
        assert not emptied.passed, f"{task.id}: emptying {rel} still passes"
        assert emptied.score < 1
        (state.root / rel).write_text(original)


@fast
def test_service_tasks_fail_when_the_service_is_gone(tmp_path: Path) -> None:
    for task in [t for t in BUILTIN if t.service is not None]:
        result = _check(task, FinalState(root=tmp_path, service=None))
        assert not result.passed and "service answers" in result.details[0]
