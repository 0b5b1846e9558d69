#!/usr/bin/env python3
"""Build the built-in SWE task set: git bundles of small real projects + ``tasks.jsonl``.

For each project (pinned PyPI sdist, sha256-checked) this:

1. downloads the sdist (``pip download --no-binary :all: --no-deps NAME==VERSION``) into a
   cache directory, or takes it from ``--sdist-dir``, and checks its sha256;
2. keeps only the package source, its tests, the licence, packaging metadata and a README
   (upstream's when small, else a short one), every file mode 0644;
3. makes a git repository with a fixed identity and fixed dates: commit 1 on ``main`` is the
   snapshot; each task gets one commit on top of the snapshot that injects its bug, tagged
   ``task/<instance_id>`` (that commit is the task's ``base_commit``);
4. derives ``patch`` (the gold fix: base -> snapshot, source files only) and ``test_patch``
   (the new tests, test files only) with ``git diff``;
5. runs the test command with Debian's ``/usr/bin/python3`` (see verify_builtin_tasks.py) on
   the base, on base + test_patch and on base + test_patch + patch, and derives
   FAIL_TO_PASS / PASS_TO_PASS from the ``-rA`` summaries, checking that the declared
   FAIL_TO_PASS tests are exactly the ones that flip and that nothing else fails;
6. writes ``repos/<project>.bundle`` (``git bundle create --all``), ``tasks.jsonl`` and the
   README listing the tasks.

Re-running it reproduces the same commit hashes (and, with the same git, the same bundles).
The projects and their bugs are defined in ``builtin_tasks/<project>.toml`` next to this
script, in the order of ``builtin_tasks/index.toml`` (the format: ``builtin_tasks/README.md``).
Standard library only::

    python3 packages/orchard-swe/scripts/make_builtin_tasks.py [--sdist-dir DIR] [--check]

``--check`` builds into a temporary directory and compares with the committed output.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, field, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))
import verify_builtin_tasks as vbt

OUT_DIR = vbt.BUILTIN_DIR
DEFINITIONS_DIR = Path(__file__).resolve().parent / "builtin_tasks"
INDEX_FILE = "index.toml"  # in DEFINITIONS_DIR: the projects, in order
DEFAULT_CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "orchard-swe" / "sdists"
)
IDENTITY = ("Orchard built-in tasks", "builtin-tasks@orchard.invalid")
TEST_CMD = "python3 -m pytest -rA -p no:cacheprovider"


@dataclass(frozen=True)
class Edit:
    """Replace the one occurrence of ``old`` in ``path`` by ``new``; ``old=""`` appends."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Project:
    """A pinned upstream release and what of its sdist the snapshot keeps."""

    name: str  # also the bundle's name and the instance id's prefix
    version: str
    sdist: str
    sha256: str
    repo: str  # upstream owner/name on GitHub
    license: str
    license_file: str
    snapshot_date: str  # the upstream release day (ISO, UTC)
    keep: tuple[str, ...]  # globs of kept paths, relative to the sdist's top directory
    readme: str  # the README's file name
    summary: str  # one line, for a replacement README
    pythonpath: str = ""  # "src" for a src/ layout


@dataclass(frozen=True)
class Task:
    """One injected bug: the edits that inject it, the new tests and what they must show."""

    project: str
    number: int
    test_files: tuple[str, ...]
    bug: tuple[Edit, ...]
    tests: tuple[Edit, ...]
    fail_to_pass: tuple[str, ...]
    summary: str  # what the bug is, for the README
    problem_statement: str

    @property
    def instance_id(self) -> str:
        return f"{self.project}__{self.project}-{self.number}"


README_LIMIT = 8 * 1024  # upstream READMEs larger than this are replaced by a short one


# ---------------------------------------------------------------------------- definitions


class DefinitionError(Exception):
    """A task definition file that does not load; the message names the file and the task."""


@dataclass(frozen=True)
class Definitions:
    """Every project and task, in the order of ``tasks.jsonl`` and the README."""

    projects: dict[str, Project]
    tasks: tuple[Task, ...]


_TOML_TYPES = {str: "a string", int: "an integer", bool: "a boolean", float: "a float"}
_TOML_TYPES.update({list: "an array", dict: "a table"})


def _toml_type(value: object) -> str:
    return _TOML_TYPES.get(type(value), type(value).__name__)


def _read_str(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise DefinitionError(f"{where} must be a string, not {_toml_type(value)}")
    return value


def _read_int(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        shown = repr(value) if isinstance(value, int) else _toml_type(value)
        raise DefinitionError(f"{where} must be a positive integer, not {shown}")
    return value


def _read_array(value: object, where: str) -> list[object]:
    if not isinstance(value, list) or not value:
        shown = "an empty array" if value == [] else _toml_type(value)
        raise DefinitionError(f"{where} must be a non-empty array, not {shown}")
    return value


def _read_strs(value: object, where: str) -> tuple[str, ...]:
    items = _read_array(value, where)
    return tuple(_read_str(item, f"{where} #{i + 1}") for i, item in enumerate(items))


def _read_edits(value: object, where: str) -> tuple[Edit, ...]:
    items = _read_array(value, where)
    return tuple(_read_table(Edit, item, f"{where} #{i + 1}") for i, item in enumerate(items))


T = TypeVar("T", Edit, Project, Task)  # what _read_table makes

# A dataclass field's annotation -> how its TOML value is read. The dataclasses are the
# schema: a TOML table has a key for each field, and may leave out the ones with defaults.
_READERS: dict[str, Callable[[object, str], object]] = {
    "str": _read_str,
    "int": _read_int,
    "tuple[str, ...]": _read_strs,
    "tuple[Edit, ...]": _read_edits,
}


def _read_table(cls: type[T], table: object, where: str, **given: object) -> T:
    """``cls`` from a TOML table whose keys are its fields, except those ``given``."""
    if not isinstance(table, dict):
        raise DefinitionError(f"{where} must be a table, not {_toml_type(table)}")
    known = {f.name: f for f in fields(cls) if f.name not in given}
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise DefinitionError(
            f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(known)})"
        )
    missing = [name for name, f in known.items() if name not in table and f.default is MISSING]
    if missing:
        raise DefinitionError(f"{where}: missing field(s) {', '.join(missing)}")
    values: dict[str, Any] = dict(given)
    for name, value in table.items():
        values[name] = _READERS[str(known[name].type)](value, f"{where}: {name}")
    return cls(**values)


def _task_where(path: Path, project: str, index: int, table: object) -> str:
    """How errors name a task: by its instance id when it has a usable number."""
    number = table.get("number") if isinstance(table, dict) else None
    if isinstance(number, int) and not isinstance(number, bool):
        return f"{path}: task {project}__{project}-{number}"
    return f"{path}: task #{index + 1}"


def _read_toml(path: Path) -> dict[str, object]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise DefinitionError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise DefinitionError(f"{path}: not valid TOML: {exc}") from None


def load_project(path: Path) -> tuple[Project, tuple[Task, ...]]:
    """A project and its tasks from ``<name>.toml`` (``[project]`` and ``[[task]]``)."""
    data = _read_toml(path)
    unknown = sorted(set(data) - {"project", "task"})
    if unknown:
        raise DefinitionError(f"{path}: unknown key(s) {', '.join(unknown)} (known: project, task)")
    if "project" not in data:
        raise DefinitionError(f"{path}: missing [project]")
    if "task" not in data:
        raise DefinitionError(f"{path}: missing [[task]] (a project has at least one task)")
    project = _read_table(Project, data["project"], f"{path}: [project]")
    if project.name != path.stem:
        raise DefinitionError(f"{path}: [project] name {project.name!r} is not the file's name")
    tasks: list[Task] = []
    for index, table in enumerate(_read_array(data["task"], f"{path}: task")):
        where = _task_where(path, project.name, index, table)
        task = _read_table(Task, table, where, project=project.name)
        if any(t.number == task.number for t in tasks):
            raise DefinitionError(f"{where}: number {task.number} is used twice")
        tasks.append(task)
    return project, tuple(tasks)


def load_definitions(directory: Path = DEFINITIONS_DIR) -> Definitions:
    """Every project listed in ``index.toml`` of ``directory``, each from ``<name>.toml``."""
    index_path = directory / INDEX_FILE
    index = _read_toml(index_path)
    if set(index) != {"projects"}:
        raise DefinitionError(
            f"{index_path}: must hold exactly one key, projects (has: {', '.join(index)})"
        )
    names = _read_strs(index["projects"], f"{index_path}: projects")
    if len(set(names)) != len(names):
        raise DefinitionError(f"{index_path}: projects lists a project twice")
    unlisted = sorted(
        p.name for p in directory.glob("*.toml") if p.name != INDEX_FILE and p.stem not in names
    )
    if unlisted:
        raise DefinitionError(f"{index_path}: projects does not list {', '.join(unlisted)}")
    projects: dict[str, Project] = {}
    tasks: list[Task] = []
    for name in names:
        project, project_tasks = load_project(directory / f"{name}.toml")
        projects[name] = project
        tasks.extend(project_tasks)
    return Definitions(projects, tuple(tasks))


# ---------------------------------------------------------------------------- helpers


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_sdist(project: Project, cache: Path, sdist_dir: Path | None) -> Path:
    """The pinned sdist, downloaded into ``cache`` unless it is there or in ``sdist_dir``."""
    for directory in (sdist_dir, cache):
        if directory is not None and (directory / project.sdist).is_file():
            path = directory / project.sdist
            if sha256_of(path) == project.sha256:
                return path
            print(f"  {path}: sha256 mismatch, downloading again", file=sys.stderr)
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        pip = _pip_command()
        cmd = [
            *pip,
            "download",
            "--no-binary",
            ":all:",
            "--no-deps",
            "-q",
            "-d",
            tmp,
            f"{project.name}=={project.version}",
        ]
        print(f"  {' '.join(cmd)}")
        subprocess.run(cmd, check=True)
        got = Path(tmp) / project.sdist
        if not got.is_file():
            raise SystemExit(f"pip did not download {project.sdist}: {os.listdir(tmp)}")
        if sha256_of(got) != project.sha256:
            raise SystemExit(f"{project.sdist}: sha256 {sha256_of(got)} != pinned {project.sha256}")
        shutil.move(str(got), cache / project.sdist)
    return cache / project.sdist


def _pip_command() -> list[str]:
    for python in (sys.executable, vbt.DEFAULT_PYTHON):
        if (
            python
            and subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode
            == 0
        ):
            return [python, "-m", "pip"]
    if shutil.which("pip"):
        return ["pip"]
    raise SystemExit("no pip to download sdists with (or pass --sdist-dir)")


def _kept(rel: str, patterns: Sequence[str]) -> bool:
    if "__pycache__" in rel.split("/") or rel.endswith((".pyc", ".pyo")):
        return False
    return any(fnmatch.fnmatchcase(rel, pattern) for pattern in patterns)


def extract_snapshot(project: Project, sdist: Path, dest: Path) -> list[str]:
    """Write the kept files of the sdist into ``dest``; return their paths."""
    top = f"{project.name}-{project.version}/"
    written: list[str] = []
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.startswith(top):
                continue
            rel = member.name[len(top) :]
            if ".." in rel.split("/") or not _kept(rel, project.keep):
                continue
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            if rel == project.readme and len(data) > README_LIMIT:
                data = short_readme(project).encode()
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(0o644)
            written.append(rel)
    for required in (project.license_file, project.readme):
        if required not in written:
            raise SystemExit(f"{project.sdist}: {required} is missing from the snapshot")
    return sorted(written)


def short_readme(project: Project) -> str:
    title = project.name
    underline = "=" * len(title)
    head = f"# {title}\n" if project.readme.endswith(".md") else f"{title}\n{underline}\n"
    return (
        f"{head}\n{project.summary}\n\n"
        f"This is a trimmed snapshot of {project.name} {project.version} "
        f"(https://github.com/{project.repo}), taken from its PyPI sdist: the package "
        f"source, its tests, packaging metadata and the licence ({project.license}, see "
        f"{project.license_file}). The documentation is upstream.\n"
    )


def apply_edits(root: Path, edits: Sequence[Edit]) -> None:
    for edit in edits:
        path = root / edit.path
        text = path.read_text(encoding="utf-8")
        if edit.old == "":
            text = text + edit.new
        else:
            count = text.count(edit.old)
            if count != 1:
                raise SystemExit(
                    f"{edit.path}: the text to replace occurs {count} times:\n{edit.old}"
                )
            text = text.replace(edit.old, edit.new)
        path.write_text(text, encoding="utf-8")


def _iso(date: datetime) -> str:
    return date.strftime("%Y-%m-%dT%H:%M:%SZ")


class Repo:
    """A git repository written with a fixed identity and dates, ignoring user config."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.home = path.parent / "home"
        self.home.mkdir(exist_ok=True)

    def env(self, date: datetime | None = None) -> dict[str, str]:
        env = vbt._clean_env()
        env.update(
            {"HOME": str(self.home), "XDG_CONFIG_HOME": str(self.home / ".config"), "TZ": "UTC"}
        )
        env.update({"GIT_AUTHOR_NAME": IDENTITY[0], "GIT_AUTHOR_EMAIL": IDENTITY[1]})
        env.update({"GIT_COMMITTER_NAME": IDENTITY[0], "GIT_COMMITTER_EMAIL": IDENTITY[1]})
        if date is not None:
            stamp = f"{int(date.timestamp())} +0000"
            env.update({"GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp})
        return env

    def git(self, *args: str, date: datetime | None = None, input: str | None = None) -> str:
        config = [
            "-c",
            "core.autocrlf=false",
            "-c",
            "core.filemode=true",
            "-c",
            "commit.gpgsign=false",
            "-c",
            "tag.gpgsign=false",
            "-c",
            "init.defaultBranch=main",
            "-c",
            "pack.threads=1",
            "-c",
            "core.bigFileThreshold=512m",
            "-c",
            "advice.detachedHead=false",
            "-c",
            "diff.noprefix=false",
            "-c",
            "diff.mnemonicPrefix=false",
        ]
        done = subprocess.run(
            ["git", *config, *args],
            cwd=self.path,
            env=self.env(date),
            input=input,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise SystemExit(f"git {' '.join(args)} failed:\n{done.stderr}")
        return done.stdout

    def commit_all(self, message: str, date: datetime) -> str:
        self.git("add", "-A", "-f")
        self.git("commit", "-q", "--no-verify", "-m", message, date=date)
        return self.git("rev-parse", "HEAD").strip()

    def diff(self, a: str, b: str | None = None, paths: Sequence[str] = ()) -> str:
        args = [
            "diff",
            "--no-color",
            "--no-ext-diff",
            "--no-renames",
            "--src-prefix=a/",
            "--dst-prefix=b/",
            a,
        ]
        if b is not None:
            args.append(b)
        return self.git(*args, "--", *paths)


@dataclass
class Built:
    rows: list[dict] = field(default_factory=list)
    bundles: dict[str, Path] = field(default_factory=dict)


def build_project(
    project: Project, tasks: Sequence[Task], sdist: Path, work: Path, python: str
) -> Built:
    """The repository, bundle and task rows of one project."""
    root = work / project.name
    root.mkdir(parents=True)
    repo_dir = root / "repo"
    repo_dir.mkdir()
    repo = Repo(repo_dir)
    extract_snapshot(project, sdist, repo_dir)
    day0 = datetime.fromisoformat(project.snapshot_date.replace("Z", "+00:00")).astimezone(UTC)
    repo.git("init", "-q", "-b", "main")
    snapshot = repo.commit_all(
        f"Import {project.name} {project.version}\n\n"
        f"Trimmed snapshot of the PyPI sdist {project.sdist}\n"
        f"(sha256 {project.sha256}) of https://github.com/{project.repo}.\n",
        day0,
    )
    built = Built()
    for task in tasks:
        date = day0 + timedelta(days=task.number)
        repo.git("checkout", "-q", "--detach", snapshot)
        apply_edits(repo_dir, task.bug)
        base = repo.commit_all(f"Task base for {task.instance_id}\n", date)
        repo.git("tag", f"task/{task.instance_id}", base)
        bug_files = sorted({e.path for e in task.bug})
        test_files = sorted({e.path for e in task.tests})
        patch = repo.diff(base, snapshot, bug_files)
        apply_edits(repo_dir, task.tests)
        test_patch = repo.diff("HEAD", None, test_files)
        repo.git("reset", "-q", "--hard")
        repo.git("checkout", "-q", "main")
        test_cmd = " ".join(
            part
            for part in (
                f"PYTHONPATH={project.pythonpath}" if project.pythonpath else "",
                TEST_CMD,
                *task.test_files,
            )
            if part
        )
        row = {
            "repo": project.repo,
            "instance_id": task.instance_id,
            "base_commit": base,
            "patch": patch,
            "test_patch": test_patch,
            "problem_statement": task.problem_statement,
            "hints_text": "",
            "created_at": _iso(date),
            "version": project.version,
            "FAIL_TO_PASS": "",
            "PASS_TO_PASS": "",
            "environment_setup_commit": base,
            "install_config": {"install": "", "test_cmd": test_cmd, "log_parser": "pytest"},
            "repo_url": f"builtin:{project.name}.bundle",
        }
        f2p, p2p = derive_test_lists(task, row, repo_dir, root, python)
        row["FAIL_TO_PASS"] = json.dumps(f2p)
        row["PASS_TO_PASS"] = json.dumps(p2p)
        built.rows.append(row)
    bundle = root / f"{project.name}.bundle"
    repo.git("bundle", "create", "-q", str(bundle), "--all")
    built.bundles[project.name] = bundle
    return built


def derive_test_lists(
    task: Task, row: dict, source: Path, root: Path, python: str
) -> tuple[list[str], list[str]]:
    """FAIL_TO_PASS and PASS_TO_PASS from real runs, checked against the declared F2P."""
    iid = task.instance_id
    test_cmd = row["install_config"]["test_cmd"]
    check = root / f"check-{task.number}"
    vbt.checkout(source, row["base_commit"], check)
    bare = vbt.run_tests(check, test_cmd, python)
    bad = {t: s for t, s in bare.statuses.items() if s in vbt.FAILING}
    if not bare.statuses or bad:
        raise SystemExit(
            f"{iid}: at the base commit the existing tests must all pass: {bad or bare.log[-2000:]}"
        )
    vbt.apply_patch(check, row["test_patch"])
    before = vbt.run_tests(check, test_cmd, python)
    vbt.apply_patch(check, row["patch"])
    after = vbt.run_tests(check, test_cmd, python)
    shutil.rmtree(check)
    failing_after = {t: s for t, s in after.statuses.items() if s in vbt.FAILING}
    if failing_after:
        raise SystemExit(
            f"{iid}: tests fail with the gold patch: {failing_after}\n{after.log[-3000:]}"
        )
    f2p = [
        t
        for t, s in after.statuses.items()
        if s == "PASSED" and before.statuses.get(t) in vbt.FAILING
    ]
    if sorted(f2p) != sorted(task.fail_to_pass):
        raise SystemExit(
            f"{iid}: the tests that flip are not the declared FAIL_TO_PASS:\n"
            f"  flipped:  {sorted(f2p)}\n  declared: {sorted(task.fail_to_pass)}\n{before.log[-3000:]}"
        )
    still_failing = {t: s for t, s in before.statuses.items() if s in vbt.FAILING and t not in f2p}
    if still_failing:
        raise SystemExit(
            f"{iid}: tests fail at base+test_patch that the gold patch does not fix: {still_failing}"
        )
    new = set(before.statuses) - set(bare.statuses)
    if not set(f2p) <= new:
        raise SystemExit(
            f"{iid}: FAIL_TO_PASS tests already exist at the base commit: {sorted(set(f2p) - new)}"
        )
    # ids with whitespace reach SWE-bench's parser cut off at the first space: leave them out
    truncated = vbt.truncated_ids(before.log) | vbt.truncated_ids(after.log)
    if set(f2p) & truncated:
        raise SystemExit(
            f"{iid}: FAIL_TO_PASS ids must not contain whitespace: {sorted(set(f2p) & truncated)}"
        )
    p2p = [
        t
        for t, s in after.statuses.items()
        if s == "PASSED" and before.statuses.get(t) == "PASSED" and t not in truncated
    ]
    left_out = [t for t, s in after.statuses.items() if s == "PASSED" and t in truncated]
    note = (
        f", {len(left_out)} passing test(s) with whitespace in their id left out"
        if left_out
        else ""
    )
    print(f"  {iid}: {len(f2p)} FAIL_TO_PASS, {len(p2p)} PASS_TO_PASS{note}")
    # FAIL_TO_PASS in the declared order; PASS_TO_PASS sorted, since pytest's order is not
    # stable for every project (inflection parametrizes over a set of strings)
    return list(task.fail_to_pass), sorted(p2p)


def build(
    definitions: Definitions, out: Path, cache: Path, sdist_dir: Path | None, python: str
) -> None:
    """Build every project into ``out`` (``repos/*.bundle``, ``tasks.jsonl``, ``README.md``)."""
    vbt.ensure_host_pytest(python)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="orchard-builtin-") as tmp:
        work = Path(tmp)
        bundles: dict[str, Path] = {}
        for project in definitions.projects.values():
            tasks = [t for t in definitions.tasks if t.project == project.name]
            print(f"{project.name} {project.version}: {len(tasks)} task(s)")
            sdist = fetch_sdist(project, cache, sdist_dir)
            built = build_project(project, tasks, sdist, work, python)
            rows.extend(built.rows)
            bundles.update(built.bundles)
        repos = out / "repos"
        repos.mkdir(parents=True, exist_ok=True)
        for stale in repos.glob("*.bundle"):
            if stale.stem not in bundles:
                stale.unlink()
        for name, bundle in bundles.items():
            shutil.copyfile(bundle, repos / f"{name}.bundle")
    lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    (out / "tasks.jsonl").write_text(lines, encoding="utf-8")
    (out / "README.md").write_text(readme(rows, definitions), encoding="utf-8")
    print(f"wrote {len(rows)} tasks to {out / 'tasks.jsonl'} and {out / 'README.md'}")


README_HEAD = """\
# Built-in SWE tasks

A small SWE-bench-style task set that works offline: {tasks} tasks in {projects} small real
pure-Python projects, each with an injected (SWE-smith style) bug, a gold `patch`, a
`test_patch` and `FAIL_TO_PASS` / `PASS_TO_PASS`. Load it with
`orchard_swe.tasks.load_tasks("builtin")` (or `--tasks builtin` on the command line).

**Generated** by `packages/orchard-swe/scripts/make_builtin_tasks.py`, like `tasks.jsonl` and
`repos/*.bundle`, from the definitions in `packages/orchard-swe/scripts/builtin_tasks/` (one
TOML file a project): edit those, not these files.

## Layout

- `tasks.jsonl`: one instance a line with SWE-bench's fields (`instance_id`, `repo`,
  `base_commit`, `patch`, `test_patch`, `problem_statement`, `hints_text`, `created_at`,
  `version`, `FAIL_TO_PASS`, `PASS_TO_PASS` as JSON strings, `environment_setup_commit`)
  plus SWE-rebench's `install_config` (`install` empty, `test_cmd`, `log_parser: pytest`)
  and `repo_url: builtin:<project>.bundle`.
- `repos/<project>.bundle`: a git bundle (`git clone repos/toolz.bundle` works). `main` is
  the trimmed upstream snapshot (package source, tests, licence, packaging metadata, a
  README); each task's `base_commit` is one commit on top of it that injects the bug,
  tagged `task/<instance_id>`. Identity and dates are fixed, so the hashes are reproducible.
- Tests run from the repository root with nothing but `python3` and pytest (no install
  step; isodate's src/ layout gets `PYTHONPATH=src` in its `test_cmd`).

## Tasks

| instance_id | project | licence | test file | F2P | P2P | the bug |
| --- | --- | --- | --- | --- | --- | --- |
"""

README_TAIL = """
## Projects

| project | version | upstream | licence | sdist sha256 |
| --- | --- | --- | --- | --- |
{projects}

Each snapshot keeps the project's licence file; the licences (MIT, BSD-3-Clause) allow
redistribution with the notice.

## Regenerate and verify

```bash
# rebuild (downloads the pinned sdists with pip, checks their sha256, runs the tests
# with /usr/bin/python3 to derive FAIL_TO_PASS / PASS_TO_PASS)
python3 packages/orchard-swe/scripts/make_builtin_tasks.py [--sdist-dir DIR]
# rebuild elsewhere and compare with what is committed (commit hashes, tasks.jsonl, README)
python3 packages/orchard-swe/scripts/make_builtin_tasks.py --check
# check every task on the host: F2P fail / P2P pass at base + test_patch, all pass with the
# gold patch, an empty patch stays unresolved (needs `apt-get install -y python3-pytest`)
python3 packages/orchard-swe/scripts/verify_builtin_tasks.py [--install-pytest]
# the same as a test (marked integration)
uv run pytest packages/orchard-swe/tests/test_builtin_tasks.py
```

Verifying all tasks takes about 15 s on two cores (three test runs per task, two tasks at a
time); rebuilding about 30 s once the sdists are cached.

## Caveats

- Test ids that contain whitespace (some of inflection's parametrized tests, e.g.
  `test_titleize[ActiveRecord-Active Record]`) are left out of `PASS_TO_PASS`: SWE-bench's
  pytest log parser keeps only the first word of a summary line, so they could never match.
  They still run. Parametrized ids with brackets (`test_x[a-b]`) are listed as pytest
  prints them.
- The bundle holds the whole history: the clean snapshot (`main`), every task's base and
  their tags. An agent that can run git in a clone can see the injected bug with
  `git show HEAD` or `git diff main`; an environment that must hide it should give the
  agent the tree at `base_commit` without that history.
- Tests of unittest-style suites avoid `subTest`, whose failures pytest 9 reports apart from
  the test itself; the set was verified with pytest 7.2 (Debian 12), 7.4 and 9.2.
"""


def readme(rows: Sequence[dict], definitions: Definitions) -> str:
    """The README of the task set, from the definitions and the built rows."""
    by_id = {t.instance_id: t for t in definitions.tasks}
    lines = []
    for row in rows:
        task = by_id[row["instance_id"]]
        project = definitions.projects[task.project]
        tests = " ".join(f"`{f}`" for f in task.test_files)
        f2p, p2p = json.loads(row["FAIL_TO_PASS"]), json.loads(row["PASS_TO_PASS"])
        lines.append(
            f"| `{task.instance_id}` | {project.name} {project.version} | {project.license} "
            f"| {tests} | {len(f2p)} | {len(p2p)} | {task.summary} |"
        )
    projects = "\n".join(
        f"| {p.name} | {p.version} | [{p.repo}](https://github.com/{p.repo}) | {p.license} "
        f"(`{p.license_file}`) | `{p.sha256[:16]}…` |"
        for p in definitions.projects.values()
    )
    head = README_HEAD.format(tasks=len(rows), projects=len(definitions.projects))
    return head + "\n".join(lines) + "\n" + README_TAIL.format(projects=projects)


def refs_of(bundle: Path) -> dict[str, str]:
    """ref -> commit of a bundle."""
    listing = subprocess.run(
        ["git", "bundle", "list-heads", str(bundle)],
        capture_output=True,
        text=True,
        check=True,
        env=vbt._clean_env(),
    ).stdout
    return {
        ref: sha for sha, ref in (line.split() for line in listing.splitlines() if line.strip())
    }


def check_against(out: Path, committed: Path) -> int:
    """Compare a fresh build with the committed one: same rows, same refs in every bundle."""
    problems = []
    new_rows = (out / "tasks.jsonl").read_text(encoding="utf-8")
    old_rows = (committed / "tasks.jsonl").read_text(encoding="utf-8")
    if new_rows != old_rows:
        problems.append("tasks.jsonl differs")
    if (out / "README.md").read_text(encoding="utf-8") != (committed / "README.md").read_text(
        encoding="utf-8"
    ):
        problems.append("README.md differs")
    for bundle in sorted((out / "repos").glob("*.bundle")):
        old = committed / "repos" / bundle.name
        if not old.exists():
            problems.append(f"{bundle.name} is not committed")
            continue
        if refs_of(bundle) != refs_of(old):
            problems.append(f"{bundle.name}: refs differ")
        elif bundle.read_bytes() != old.read_bytes():
            print(f"note: {bundle.name} has the same refs but other bytes (another git version?)")
    for problem in problems:
        print(f"MISMATCH: {problem}")
    print(
        "reproducible: the commit hashes and tasks.jsonl match"
        if not problems
        else "NOT reproducible"
    )
    return 1 if problems else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where repos/ and tasks.jsonl go")
    parser.add_argument(
        "--cache-dir", type=Path, default=DEFAULT_CACHE, help="sdist download cache"
    )
    parser.add_argument("--sdist-dir", type=Path, default=None, help="take the sdists from here")
    parser.add_argument(
        "--python", default=vbt.DEFAULT_PYTHON, help="interpreter that runs the tests"
    )
    parser.add_argument(
        "--check", action="store_true", help="build elsewhere and compare with --out"
    )
    args = parser.parse_args(argv)
    try:
        definitions = load_definitions(DEFINITIONS_DIR)
    except DefinitionError as exc:
        raise SystemExit(f"error: {exc}") from None
    if args.check:
        with tempfile.TemporaryDirectory(prefix="orchard-builtin-check-") as tmp:
            build(definitions, Path(tmp), args.cache_dir, args.sdist_dir, args.python)
            return check_against(Path(tmp), args.out)
    build(definitions, args.out, args.cache_dir, args.sdist_dir, args.python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
