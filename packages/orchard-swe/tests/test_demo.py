"""The documented paths on the built-in tasks: `orchard-swe grade` and `orchard-swe demo`."""

from __future__ import annotations

import json

import pytest

from orchard_swe.cli import main
from orchard_swe.tasks import load_tasks

pytestmark = pytest.mark.integration


def test_gold_resolves_and_empty_does_not_on_every_builtin_task(server, tmp_path, capsys):
    tasks = load_tasks("builtin")
    assert len(tasks) >= 8
    gold = tmp_path / "gold.json"
    gold.write_text(
        json.dumps(
            [
                {"instance_id": t.instance_id, "model_patch": t.patch, "model_name_or_path": "gold"}
                for t in tasks
            ]
        )
    )
    empty = tmp_path / "empty.jsonl"
    empty.write_text(
        "\n".join(json.dumps({"instance_id": t.instance_id, "model_patch": ""}) for t in tasks)
    )
    outcomes = {}
    for name, path in (("gold", gold), ("empty", empty)):
        assert main(["grade", "--predictions", str(path), "--json", "--url", server.url]) == 0
        outcomes[name] = {
            r["instance_id"]: r["status"] for r in json.loads(capsys.readouterr().out)
        }
    assert outcomes["gold"] == {t.instance_id: "resolved" for t in tasks}
    assert outcomes["empty"] == {t.instance_id: "unresolved" for t in tasks}


def test_the_demo_distils_through_both_harnesses(local_server, tmp_path):
    """The demo command end to end; one backend (distill itself runs on every backend in
    test_distill.py, and the demo adds only its own CLI around it)."""
    out = tmp_path / "demo"
    assert main(["demo", "--url", local_server.url, "--out", str(out)]) == 0
    for run in ("tools-gold", "tools-empty", "mini-gold", "mini-empty"):
        summary = json.loads((out / run / "summary.json").read_text())
        assert summary["attempts"] == len(load_tasks("builtin"))
        assert summary["resolved_rate"] == (1.0 if run.endswith("gold") else 0.0), summary
