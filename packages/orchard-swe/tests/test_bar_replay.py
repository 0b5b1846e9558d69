"""``orchard-swe bar replay``: the JSON Lines format, both profiles, bad lines."""

from __future__ import annotations

import io
import json

import pytest

from orchard_swe.algorithms.bar_replay import ReplayInputError, replay_stream
from orchard_swe.cli import main

PROMPT = {
    "n": 4,
    "n_max": 8,
    "stride": 2,
    "p_min": 0.25,
    "p_max": 0.75,
    "samples": [
        {"reward": r, "status": s, "exit_status": None}
        for r, s in [
            (1, "completed"),
            (0, "completed"),
            (1, "completed"),
            (0, "truncated"),
            (1, "completed"),
            (1, "completed"),
            (None, "aborted"),
            (1, "completed"),
        ]
    ],
}


def _run(lines: list[str], profile: str) -> list[dict[str, object]]:
    out = io.StringIO()
    replay_stream(lines, out, profile)  # type: ignore[arg-type]
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_both_profiles_decide_a_prompt() -> None:
    line = json.dumps(PROMPT)
    # The reference looks after 2 samples, then 4, where truncated sample 3 is a negative.
    assert _run([line], "reference") == [
        {"generated": 4, "selected": [0, 2, 1, 3], "outcome": "found"}
    ]
    # Ours asks for n=4 first, counts only completed samples, and lists indices ascending.
    assert _run([line], "orchard") == [
        {"generated": 6, "selected": [0, 1, 2, 4], "outcome": "found"}
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"n": "4"}, "n must be an integer"),
        ({"p_min": None}, "p_min must be a number"),
        ({"samples": {}}, "samples must be a list"),
        ({"samples": [{"reward": 1, "status": "done"}]}, "status must be one of"),
        ({"samples": [{"reward": True, "status": "completed"}]}, "finite number or null"),
        ({"n_max": 2}, "n <= n_max"),
    ],
)
def test_a_bad_line_is_named(change: dict[str, object], message: str) -> None:
    out = io.StringIO()
    lines = [json.dumps(PROMPT), json.dumps({**PROMPT, **change})]
    with pytest.raises(ReplayInputError, match=f"line 2: .*{message}"):
        replay_stream(lines, out, "reference")
    assert len(out.getvalue().splitlines()) == 1  # the good line before it was written


def test_the_command_reads_stdin_and_writes_stdout(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(PROMPT) + "\n\n"))
    assert main(["bar", "replay", "--profile", "reference"]) == 0
    assert json.loads(capsys.readouterr().out)["outcome"] == "found"
    monkeypatch.setattr("sys.stdin", io.StringIO("not json\n"))
    assert main(["bar", "replay"]) == 2
    assert "line 1" in capsys.readouterr().err
