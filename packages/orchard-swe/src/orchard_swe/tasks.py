"""SWE task instances: SWE-bench fields, SWE-rebench and Scale-SWE extras, validated.

Loads JSONL, JSON (a list, or ``{"instances": [...]}``), parquet, or a Hugging Face
``datasets`` dataset saved to disk (``save_to_disk``), and the built-in set (``builtin``).
Every bad row is reported with its row number and what is wrong; nothing is silently dropped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

BUILTIN_DIR = Path(__file__).parent / "builtin"
BUILTIN = "builtin"

# Scale-SWE and other collections name the same things differently.
_ALIASES = {
    "task_id": "instance_id",
    "id": "instance_id",
    "repo_name": "repo",
    "commit": "base_commit",
    "base_sha": "base_commit",
    "issue": "problem_statement",
    "problem": "problem_statement",
    "gold_patch": "patch",
    "fix_patch": "patch",
    "test_diff": "test_patch",
    "fail_to_pass": "FAIL_TO_PASS",
    "pass_to_pass": "PASS_TO_PASS",
    "f2p": "FAIL_TO_PASS",
    "p2p": "PASS_TO_PASS",
    "docker_image": "image_name",
    "image": "image_name",
}
_REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement")


class TaskLoadError(ValueError):
    """One or more rows are not valid task instances; ``problems`` lists each."""

    def __init__(self, source: str, problems: list[str]) -> None:
        shown = "\n".join(f"  - {p}" for p in problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"{source}: {len(problems)} bad row(s):\n{shown}{more}")
        self.problems = problems


@attrs.frozen
class InstallConfig:
    """How to install and test a repository (SWE-rebench's ``install_config`` shape)."""

    install: str = ""
    test_cmd: str = "python3 -m pytest -rA -p no:cacheprovider"
    log_parser: str = "pytest"
    pre_install: tuple[str, ...] = ()

    @classmethod
    def from_value(cls, value: Any) -> InstallConfig:
        if value is None or value == "":
            return cls()
        if isinstance(value, str):
            value = json.loads(value)
        if not isinstance(value, Mapping):
            raise ValueError("install_config must be an object")
        install = value.get("install") or ""
        if isinstance(install, list):
            install = " && ".join(str(c) for c in install)
        test_cmd = value.get("test_cmd") or cls.test_cmd
        if isinstance(test_cmd, list):
            test_cmd = " && ".join(str(c) for c in test_cmd)
        pre = value.get("pre_install") or ()
        return cls(
            install=str(install),
            test_cmd=str(test_cmd),
            log_parser=str(value.get("log_parser") or cls.log_parser),
            pre_install=tuple(str(c) for c in pre),
        )


@attrs.frozen
class Task:
    """One SWE instance. ``repo_url`` is a git URL, a local path or ``builtin:<name>``."""

    instance_id: str
    repo: str
    base_commit: str
    problem_statement: str
    patch: str = ""
    test_patch: str = ""
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()
    version: str = ""
    image_name: str | None = None
    repo_url: str | None = None
    install_config: InstallConfig = InstallConfig()
    extra: Mapping[str, Any] = attrs.field(factory=dict)

    @property
    def source_url(self) -> str:
        """Where to clone from: ``repo_url``, else GitHub by ``repo``."""
        return self.repo_url or f"https://github.com/{self.repo}.git"

    def builtin_bundle(self) -> Path | None:
        """The git bundle of a built-in task's repository."""
        if self.repo_url and self.repo_url.startswith("builtin:"):
            return BUILTIN_DIR / "repos" / self.repo_url.removeprefix("builtin:")
        return None

    def to_dict(self) -> dict[str, Any]:
        """SWE-bench's field names, with list fields as JSON strings as it ships them."""
        return {
            **dict(self.extra),
            "instance_id": self.instance_id,
            "repo": self.repo,
            "base_commit": self.base_commit,
            "problem_statement": self.problem_statement,
            "patch": self.patch,
            "test_patch": self.test_patch,
            "FAIL_TO_PASS": json.dumps(list(self.fail_to_pass)),
            "PASS_TO_PASS": json.dumps(list(self.pass_to_pass)),
            "version": self.version,
            "image_name": self.image_name,
            "repo_url": self.repo_url,
            "install_config": attrs.asdict(self.install_config),
        }


def _test_list(value: Any, field: str) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{field} is a string but not a JSON list: {exc}") from None
    if hasattr(value, "tolist"):  # numpy arrays from parquet
        value = value.tolist()
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        raise ValueError(f"{field} must be a list of test names")
    return tuple(value)


def task_from_row(row: Mapping[str, Any]) -> Task:
    """Validate one row (any of the supported field namings); ValueError says what is wrong."""
    data = {_ALIASES.get(k, k): v for k, v in row.items()}
    missing = [f for f in _REQUIRED if not isinstance(data.get(f), str) or not data.get(f)]
    if missing:
        raise ValueError(f"missing or empty: {', '.join(missing)}")
    known = {
        *_REQUIRED,
        "patch",
        "test_patch",
        "FAIL_TO_PASS",
        "PASS_TO_PASS",
        "version",
        "image_name",
        "repo_url",
        "install_config",
    }
    return Task(
        instance_id=data["instance_id"],
        repo=data["repo"],
        base_commit=data["base_commit"],
        problem_statement=data["problem_statement"],
        patch=str(data.get("patch") or ""),
        test_patch=str(data.get("test_patch") or ""),
        fail_to_pass=_test_list(data.get("FAIL_TO_PASS"), "FAIL_TO_PASS"),
        pass_to_pass=_test_list(data.get("PASS_TO_PASS"), "PASS_TO_PASS"),
        version=str(data.get("version") or ""),
        image_name=data.get("image_name") or None,
        repo_url=data.get("repo_url") or None,
        install_config=InstallConfig.from_value(data.get("install_config")),
        extra={k: v for k, v in data.items() if k not in known},
    )


def tasks_from_rows(rows: Iterable[Mapping[str, Any]], source: str) -> list[Task]:
    """Validate every row; raise TaskLoadError listing all bad rows and duplicate ids."""
    tasks: list[Task] = []
    problems: list[str] = []
    seen: set[str] = set()
    for number, row in enumerate(rows, 1):
        if not isinstance(row, Mapping):
            problems.append(f"row {number}: not an object")
            continue
        try:
            task = task_from_row(row)
        except (ValueError, TypeError) as exc:
            problems.append(f"row {number} ({row.get('instance_id', '?')}): {exc}")
            continue
        if task.instance_id in seen:
            problems.append(f"row {number}: duplicate instance_id {task.instance_id!r}")
            continue
        seen.add(task.instance_id)
        tasks.append(task)
    if problems:
        raise TaskLoadError(source, problems)
    return tasks


def _read_rows(path: Path) -> list[Any]:
    if path.is_dir():
        import datasets

        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            split = "test" if "test" in loaded else next(iter(loaded))
            loaded = loaded[split]
        return list(loaded)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return list(pq.read_table(path).to_pylist())
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        rows: list[Any] = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise TaskLoadError(
                        str(path), [f"line {number}: invalid JSON: {exc}"]
                    ) from None
        return rows
    data = json.loads(text)
    if isinstance(data, Mapping):
        data = data.get("instances", [data])
    if not isinstance(data, list):
        raise TaskLoadError(str(path), ["expected a list of instances"])
    return data


def load_tasks(source: str | Path, ids: Iterable[str] | None = None) -> list[Task]:
    """Tasks from a file, a saved dataset directory, or ``builtin``; optionally some ids."""
    path = BUILTIN_DIR / "tasks.jsonl" if str(source) == BUILTIN else Path(source)
    if not path.exists():
        raise FileNotFoundError(f"no task file or dataset at {path}")
    return select_tasks(tasks_from_rows(_read_rows(path), str(source)), ids, str(source))


def select_tasks(tasks: list[Task], ids: Iterable[str] | None, source: str) -> list[Task]:
    """``tasks`` whose ``instance_id`` is in ``ids``, in that order (all when None);
    ``TaskLoadError`` naming every unknown id of ``source``."""
    if ids is None:
        return tasks
    wanted = list(ids)
    by_id = {t.instance_id: t for t in tasks}
    unknown = [i for i in wanted if i not in by_id]
    if unknown:
        raise TaskLoadError(source, [f"unknown instance_id {i!r}" for i in unknown])
    return [by_id[i] for i in wanted]
