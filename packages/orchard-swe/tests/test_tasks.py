"""Loading task instances from every supported format, and refusing bad rows clearly."""

from __future__ import annotations

import json

import pytest

from orchard_swe.tasks import InstallConfig, TaskLoadError, load_tasks, task_from_row

pytestmark = pytest.mark.fast

ROW = {
    "instance_id": "proj__proj-1",
    "repo": "owner/proj",
    "base_commit": "a" * 40,
    "problem_statement": "it breaks",
    "patch": "diff --git a/x b/x\n",
    "test_patch": "diff --git a/t b/t\n",
    "FAIL_TO_PASS": json.dumps(["tests/test_x.py::test_a"]),
    "PASS_TO_PASS": json.dumps(["tests/test_x.py::test_b", "tests/test_x.py::test_c[1-2]"]),
    "version": "1.0",
}


def test_swe_bench_rows_with_json_string_lists():
    task = task_from_row(ROW)
    assert task.fail_to_pass == ("tests/test_x.py::test_a",)
    assert task.pass_to_pass[1] == "tests/test_x.py::test_c[1-2]"
    assert task.install_config == InstallConfig()
    assert task.source_url == "https://github.com/owner/proj.git"


def test_swe_rebench_install_config_and_image():
    row = {
        **ROW,
        "image_name": "swerebench/proj:1",
        "install_config": {
            "install": ["pip install -e .", "pip install pytest"],
            "test_cmd": "pytest -rA",
            "log_parser": "pytest_v2",
        },
    }
    task = task_from_row(row)
    assert task.image_name == "swerebench/proj:1"
    assert task.install_config.install == "pip install -e . && pip install pytest"
    assert task.install_config.log_parser == "pytest_v2"


def test_scale_swe_style_names_are_understood():
    row = {
        "task_id": "x-1",
        "repo_name": "o/x",
        "base_sha": "b" * 40,
        "issue": "bug",
        "fail_to_pass": ["t::a"],
        "pass_to_pass": [],
        "docker_image": "img",
    }
    task = task_from_row(row)
    assert (task.instance_id, task.repo, task.base_commit) == ("x-1", "o/x", "b" * 40)
    assert task.fail_to_pass == ("t::a",) and task.image_name == "img"


def test_every_format_loads_the_same_tasks(tmp_path):
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text(json.dumps(ROW) + "\n\n")
    as_json = tmp_path / "t.json"
    as_json.write_text(json.dumps([ROW]))
    wrapped = tmp_path / "w.json"
    wrapped.write_text(json.dumps({"instances": [ROW]}))
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist([ROW]), parquet)
    import datasets

    saved = tmp_path / "ds"
    datasets.Dataset.from_list([ROW]).save_to_disk(str(saved))
    loaded = [load_tasks(p) for p in (jsonl, as_json, wrapped, parquet, saved)]
    assert all(tasks == loaded[0] for tasks in loaded)
    assert loaded[0][0].instance_id == "proj__proj-1"


def test_bad_rows_are_all_reported_with_their_numbers(tmp_path):
    rows = [ROW, {**ROW, "instance_id": ""}, {**ROW, "FAIL_TO_PASS": "not json"}, ROW, 7]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(rows))
    with pytest.raises(TaskLoadError) as err:
        load_tasks(path)
    problems = err.value.problems
    assert len(problems) == 4
    assert "row 2" in problems[0] and "instance_id" in problems[0]
    assert "row 3" in problems[1] and "FAIL_TO_PASS" in problems[1]
    assert "duplicate" in problems[2] and "row 5" in problems[3]


def test_invalid_json_lines_and_unknown_ids_are_errors(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(ROW) + "\n{oops\n")
    with pytest.raises(TaskLoadError, match="line 2"):
        load_tasks(path)
    path.write_text(json.dumps(ROW) + "\n")
    with pytest.raises(TaskLoadError, match="unknown instance_id 'nope'"):
        load_tasks(path, ids=["nope"])
    with pytest.raises(FileNotFoundError):
        load_tasks(tmp_path / "missing.jsonl")


def test_a_task_round_trips_through_its_swe_bench_dict():
    task = task_from_row(ROW)
    assert task_from_row(task.to_dict()) == task
