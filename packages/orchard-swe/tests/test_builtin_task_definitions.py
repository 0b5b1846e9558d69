"""The definitions of the built-in SWE tasks (``scripts/builtin_tasks/*.toml``) load.

The committed files agree with the committed ``tasks.jsonl``, a small well-formed set loads
into exactly the expected dataclasses, and every kind of malformed file stops
``make_builtin_tasks.py`` with a message naming the file and the task. Nothing is built.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.fast

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))  # as the script does itself, for verify_builtin_tasks
mbt: ModuleType = importlib.import_module("make_builtin_tasks")

PROJECT = """\
[project]
name = "demo"
version = "1.0"
sdist = "demo-1.0.tar.gz"
sha256 = "00"
repo = "someone/demo"
license = "MIT"
license_file = "LICENSE"
snapshot_date = "2024-01-01T00:00:00Z"
keep = ["LICENSE", "README.md", "demo/*"]
readme = "README.md"
summary = "A demo."
"""

TASK = """
[[task]]
number = 1
summary = "`f()` is off by one."
test_files = ["tests/test_demo.py"]
fail_to_pass = ["tests/test_demo.py::test_f"]
problem_statement = '''
f() is off by one
'''

[[task.bug]]
path = "demo/__init__.py"
old = '''
    return x
'''
new = '''
    return x + 1
'''

[[task.tests]]
path = "tests/test_demo.py"
old = ""
new = '''


def test_f():
    assert f(1) == 1
'''
"""


def write_set(directory: Path, text: str, name: str = "demo") -> Path:
    """``index.toml`` listing ``name`` and ``<name>.toml`` holding ``text``; its path."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "index.toml").write_text(f'projects = ["{name}"]\n', encoding="utf-8")
    path = directory / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_committed_definitions_match_committed_tasks() -> None:
    definitions = mbt.load_definitions()
    rows = mbt.vbt.load_tasks()
    assert [t.instance_id for t in definitions.tasks] == [r["instance_id"] for r in rows]
    for task, row in zip(definitions.tasks, rows, strict=True):
        project = definitions.projects[task.project]
        assert row["repo"] == project.repo
        assert row["version"] == project.version
        assert row["problem_statement"] == task.problem_statement
        assert json.loads(row["FAIL_TO_PASS"]) == list(task.fail_to_pass)
        assert row["install_config"]["test_cmd"].endswith(" ".join(task.test_files))


def test_well_formed_set_loads_exactly(tmp_path: Path) -> None:
    write_set(tmp_path, PROJECT + TASK)
    definitions = mbt.load_definitions(tmp_path)
    (project,) = definitions.projects.values()
    assert project.keep == ("LICENSE", "README.md", "demo/*")
    assert project.pythonpath == ""  # left out: the default
    assert definitions.tasks == (
        mbt.Task(
            project="demo",
            number=1,
            test_files=("tests/test_demo.py",),
            bug=(mbt.Edit("demo/__init__.py", "    return x\n", "    return x + 1\n"),),
            tests=(
                mbt.Edit("tests/test_demo.py", "", "\n\ndef test_f():\n    assert f(1) == 1\n"),
            ),
            fail_to_pass=("tests/test_demo.py::test_f",),
            summary="`f()` is off by one.",
            problem_statement="f() is off by one\n",
        ),
    )
    assert definitions.tasks[0].instance_id == "demo__demo-1"


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        (
            PROJECT + TASK.replace("number = 1\n", "number = 1\nnumbr = 2\n"),
            "task demo__demo-1",
            "unknown key(s) numbr",
        ),
        (
            PROJECT + TASK.replace('summary = "`f()` is off by one."\n', ""),
            "task demo__demo-1",
            "missing field(s) summary",
        ),
        (
            PROJECT + TASK.replace("number = 1", 'number = "1"'),
            "task #1",
            "number must be a positive integer, not a string",
        ),
        (
            PROJECT + TASK.replace('old = ""', "old = 0"),
            "task demo__demo-1: tests #1",
            "old must be a string, not an integer",
        ),
        (
            PROJECT + TASK.replace('test_files = ["tests/test_demo.py"]', "test_files = []"),
            "task demo__demo-1",
            "test_files must be a non-empty array, not an empty array",
        ),
        (PROJECT + TASK + TASK, "task demo__demo-1", "number 1 is used twice"),
        (
            PROJECT.replace('"LICENSE", "README.md"', '"LICENSE", 3') + TASK,
            "[project]",
            "keep #2 must be a string, not an integer",
        ),
        (PROJECT.replace("license = ", "licence = ") + TASK, "[project]", "unknown key(s) licence"),
        (
            PROJECT.replace('name = "demo"', 'name = "other"') + TASK,
            "",
            "name 'other' is not the file's name",
        ),
        (PROJECT, "", "missing [[task]]"),
        (
            PROJECT + TASK.replace("[[task.bug]]", "[[task.bugs]]"),
            "task demo__demo-1",
            "unknown key(s) bugs",
        ),
        (PROJECT + TASK.replace("old = '''", "old = '''x'''\n'''"), "", "not valid TOML"),
    ],
)
def test_malformed_file_names_file_and_task(
    tmp_path: Path, text: str, where: str, message: str
) -> None:
    path = write_set(tmp_path, text)
    prefix = f"{path}: {where}: " if where else f"{path}: "
    with pytest.raises(mbt.DefinitionError, match=re.escape(prefix) + ".*" + re.escape(message)):
        mbt.load_definitions(tmp_path)


def test_index_must_list_every_project(tmp_path: Path) -> None:
    write_set(tmp_path, PROJECT + TASK)
    (tmp_path / "forgotten.toml").write_text(PROJECT + TASK, encoding="utf-8")
    with pytest.raises(mbt.DefinitionError, match=r"does not list forgotten\.toml"):
        mbt.load_definitions(tmp_path)
    (tmp_path / "forgotten.toml").unlink()
    (tmp_path / "index.toml").write_text('projects = ["demo", "gone"]\n', encoding="utf-8")
    with pytest.raises(mbt.DefinitionError, match=re.escape(f"{tmp_path / 'gone.toml'}: no such")):
        mbt.load_definitions(tmp_path)


def test_script_stops_with_the_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_set(tmp_path, PROJECT + TASK.replace("number = 1", "number = 0"))
    monkeypatch.setattr(mbt, "DEFINITIONS_DIR", tmp_path)
    with pytest.raises(SystemExit, match=r"^error: .*demo\.toml: task demo__demo-0: number must"):
        mbt.main(["--check"])
