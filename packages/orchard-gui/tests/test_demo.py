"""``orchard-gui demo``, as a user runs it after the README's set-up: the offline tasks end
to end on the embedded local backend, a scripted oracle (success 1.0) and a random policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchard_gui.cli import main
from orchard_testing import RunningServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_the_demo_solves_the_offline_tasks_and_a_random_policy_does_not(
    gui_local_server: RunningServer, tmp_path: Path
) -> None:
    code = main(
        ["demo", "--url", gui_local_server.url, "--out", str(tmp_path), "--concurrency", "2"]
    )
    assert code == 0
    oracle = json.loads((tmp_path / "oracle" / "results.json").read_text())
    random = json.loads((tmp_path / "random" / "results.json").read_text())
    assert oracle["success_rate"] == 1.0 and oracle["episodes"] == 16
    assert random["episodes"] == 16 and random["success_rate"] <= 0.25, random["results"]
    sheets = sorted(p.name for p in (tmp_path / "oracle" / "contact_sheets").iterdir())
    assert len(sheets) == 16 and all(name.endswith("-0.png") for name in sheets)
