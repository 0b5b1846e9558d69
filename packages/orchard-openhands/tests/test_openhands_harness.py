"""The OpenHands agent as a SWE harness, end to end on a real Orchard service.

The harness needs Python >= 3.12 and the suite runs on 3.11, so nothing here imports it:
``orchard-openhands run`` runs in a 3.12 venv (``tests/py312_venv.py``) against a real
server on each selected backend and a scripted OpenAI-compatible model. The OpenHands
agent is real: its ``terminal`` and ``file_editor`` tool calls run in the sandbox. The
pure-logic checks in ``py312/`` (the event converter) run with that venv's Python.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from py312_checks import run_checks

from orchard_env_client.testing import Script, ScriptedModelServer, Step, ToolCall
from orchard_swe.tasks import BUILTIN, load_tasks
from orchard_swe.trajectory import SCHEMA, read_jsonl
from orchard_testing import RunningServer, check_tool_protocol

TASK = "inflection__inflection-1"
REPO = "/workspace/repo"
NOTE = f"{REPO}/scratch_note.txt"
HERE = Path(__file__).resolve().parent

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _terminal(command: str, thought: str = "") -> Step:
    return Step(content=thought, tool_calls=(ToolCall("terminal", {"command": command}),))


def _editor(thought: str = "", **arguments: Any) -> Step:
    return Step(content=thought, tool_calls=(ToolCall("file_editor", arguments),))


FINISH = Step(
    content="The fix is in place.",
    tool_calls=(ToolCall("finish", {"message": "Fixed the issue."}),),
)


def gold_script(patch: str) -> Script:
    """Look around, exercise every editor command, apply the gold patch, finish."""
    first_file = patch.split("diff --git a/", 1)[1].split(" ", 1)[0]
    return Script(
        [
            _terminal("cd /tmp && export ORCHARD_OH_PROBE=kept", "Session state first."),
            _terminal(f"pwd; echo probe=$ORCHARD_OH_PROBE; cd {REPO}", "Is it kept?"),
            _editor("Reading the code.", command="view", path=f"{REPO}/{first_file}"),
            _editor(command="create", path=NOTE, file_text="alpha\nbeta\n"),
            _editor(command="str_replace", path=NOTE, old_str="beta", new_str="gamma"),
            _editor(command="insert", path=NOTE, insert_line=0, new_str="zero"),
            _editor(command="undo_edit", path=NOTE),
            _terminal(f"cat {NOTE} && rm {NOTE}", "Checking and cleaning up."),
            _terminal(f"cat > /tmp/gold.patch <<'ORCHARD_EOF'\n{patch}ORCHARD_EOF", "The fix."),
            _terminal("git apply /tmp/gold.patch && git status --short"),
            FINISH,
        ]
    )


GIVE_UP = Script(
    [
        _terminal("ls", "Let me look."),
        Step(
            content="I cannot fix this.",
            tool_calls=(ToolCall("finish", {"message": "I give up."}),),
        ),
    ]
)


def _run_cli(
    venv: Path, server: RunningServer, model: ScriptedModelServer, out: Path, *extra: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCHARD_ENV_", "OPENAI_"))}
    env["HOME"] = str(out.parent)  # no user-level OpenHands plugins or skills
    started = time.monotonic()
    done = subprocess.run(
        [
            str(venv / "bin" / "orchard-openhands"),
            "run",
            TASK,
            "--model",
            "scripted",
            "--base-url",
            model.base_url,
            "--orchard-url",
            server.url,
            "--out",
            str(out),
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    return done, time.monotonic() - started


def _tool_results(messages: list[dict[str, Any]]) -> list[str]:
    return [str(m["content"]) for m in messages if m["role"] == "tool"]


def test_gold_script_is_resolved(
    openhands_venv: Path,
    server: RunningServer,
    model_server: ScriptedModelServer,
    tmp_path: Path,
) -> None:
    task = load_tasks(BUILTIN, ids=[TASK])[0]
    script = gold_script(task.patch)
    model_server.add(TASK, script)
    out = tmp_path / "trajectories.jsonl"
    done, seconds = _run_cli(openhands_venv, server, model_server, out)
    print(f"openhands gold run on {server.backend}: {seconds:.1f} s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [traj] = read_jsonl(out)
    meta = traj.metadata
    assert traj.to_dict()["schema"] == SCHEMA
    assert (meta.task_id, meta.recipe, meta.harness, meta.model) == (
        TASK,
        "swe",
        "openhands",
        "scripted",
    )
    assert meta.exit_status == "submitted", (meta.error, done.stderr[-4000:])
    assert meta.verdict == "resolved", meta.extra.get("grading")
    assert meta.final_output == task.patch
    assert meta.error is None
    assert meta.steps == len(script.steps)
    assert meta.prompt_tokens > 0 and meta.completion_tokens > 0
    assert meta.finished_at >= meta.started_at and meta.duration_s > 0
    assert meta.extra["grading"]["status"] == "resolved"
    # OpenAI-style messages: system, the task, then assistant turns with tool calls
    roles = [m["role"] for m in traj.messages]
    assert roles[:2] == ["system", "user"] and TASK not in roles
    assert task.problem_statement.strip()[:40] in traj.messages[1]["content"]
    assert all(isinstance(m["content"], str | None) for m in traj.messages)
    assert roles.count("assistant") == len(script.steps)
    check_tool_protocol(traj.messages, open_end=True)
    called = [c["function"]["name"] for m in traj.messages for c in m.get("tool_calls") or []]
    assert called == [s.tool_calls[0].name for s in script.steps]
    assert {t["function"]["name"] for t in traj.tools} >= {"terminal", "file_editor", "finish"}
    sent = [r.body for r in model_server.requests if r.instance_id == TASK]
    assert traj.tools == sent[-1]["tools"]  # the specs exactly as the model got them
    # the tools acted in the sandbox, with a shell session's memory
    results = _tool_results(traj.messages)
    assert "/tmp" in results[1] and "probe=kept" in results[1]
    assert "Here's the result of running `cat -n`" in results[2]
    assert "File created successfully" in results[3]
    assert "zero" not in results[7] and "alpha\ngamma" in results[7]
    changed = task.patch.split("diff --git a/", 1)[1].split(" ", 1)[0]
    assert f" M {changed}" in results[9]  # `git status --short` after `git apply`


def test_giving_up_is_unresolved(
    openhands_venv: Path,
    server: RunningServer,
    model_server: ScriptedModelServer,
    tmp_path: Path,
) -> None:
    model_server.add(TASK, GIVE_UP)
    out = tmp_path / "trajectories.jsonl"
    done, seconds = _run_cli(openhands_venv, server, model_server, out)
    print(f"openhands give-up run on {server.backend}: {seconds:.1f} s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [traj] = read_jsonl(out)
    assert traj.metadata.exit_status == "submitted"
    assert traj.metadata.final_output == ""
    assert traj.metadata.verdict == "unresolved"
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["verdict"] == "unresolved"


def test_step_limit(
    openhands_venv: Path,
    server: RunningServer,
    model_server: ScriptedModelServer,
    tmp_path: Path,
) -> None:
    # a model that only talks: nudged to go on until the step cap
    model_server.add(TASK, Script([Step(content="Hmm, let me think.")], repeat_last=True))
    out = tmp_path / "trajectories.jsonl"
    done, _ = _run_cli(openhands_venv, server, model_server, out, "--max-steps", "3", "--no-grade")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [traj] = read_jsonl(out)
    assert traj.metadata.exit_status == "step_limit", traj.metadata.error
    assert traj.metadata.steps == 3 and traj.metadata.verdict is None


def test_a_model_that_fails_mid_run_keeps_the_run_so_far(
    openhands_venv: Path,
    runner_server: RunningServer,
    model_server: ScriptedModelServer,
    tmp_path: Path,
) -> None:
    # one reply, then the script runs out: the endpoint answers 400 to the second call
    model_server.add(TASK, Script([_terminal("echo before-the-failure", "First a look.")]))
    out = tmp_path / "trajectories.jsonl"
    done, _ = _run_cli(openhands_venv, runner_server, model_server, out, "--no-grade")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]  # an errored attempt
    [traj] = read_jsonl(out)
    assert traj.metadata.exit_status.startswith("error: LLMBadRequestError"), traj.metadata
    assert traj.metadata.error and "traceback" in traj.metadata.extra
    assert any("before-the-failure" in r for r in _tool_results(traj.messages))
    assert traj.metadata.prompt_tokens > 0 and traj.metadata.completion_tokens > 0


def test_the_time_limit_holds_across_continue_messages(
    openhands_venv: Path,
    runner_server: RunningServer,
    model_server: ScriptedModelServer,
    tmp_path: Path,
) -> None:
    """A model that alternates a slow command with plain talk (each talk ends a ``run()``
    and earns a continue message): the deadline stops it however the pause and the next
    ``run()`` interleave."""
    talk = Step(content="Still thinking.")
    model_server.add(TASK, Script([_terminal("sleep 1"), talk] * 50))
    out = tmp_path / "trajectories.jsonl"
    done, _ = _run_cli(
        openhands_venv, runner_server, model_server, out, "--max-time", "4", "--no-grade"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [traj] = read_jsonl(out)
    assert traj.metadata.exit_status == "time_limit", traj.metadata.exit_status
    assert traj.metadata.steps < 40, traj.metadata.steps


def test_an_interrupted_run_stops_calling_the_model_and_leaves_no_sandbox(
    openhands_venv: Path,
    runner_server: RunningServer,
    model_server: ScriptedModelServer,
    tmp_path: Path,
) -> None:
    """Ctrl-C cancels the CLI's asyncio task: the conversation thread is stopped too (it
    would otherwise keep the process alive, calling the model, for ever)."""
    model_server.add(TASK, Script([_terminal("sleep 1")], repeat_last=True))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCHARD_ENV_", "OPENAI_"))}
    env["HOME"] = str(tmp_path)
    argv = [
        str(openhands_venv / "bin" / "orchard-openhands"),
        "run",
        TASK,
        "--model",
        "s",
        "--base-url",
        model_server.base_url,
        "--orchard-url",
        runner_server.url,
        "--out",
        str(tmp_path / "t.jsonl"),
        "--no-grade",
    ]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while len(model_server.requests) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            time.sleep(0.2)
        assert len(model_server.requests) >= 2
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=90)
    finally:
        proc.kill()
        proc.wait()
    calls = len(model_server.requests)
    time.sleep(3)
    assert len(model_server.requests) == calls  # nothing goes on calling the model
    listed = httpx.get(
        f"{runner_server.url}/sandboxes", params={"label": "orchard-harness=openhands"}
    )
    assert listed.json()["sandboxes"] == [], listed.text


def test_event_converter(openhands_venv: Path) -> None:
    """The pure-logic checks of the event converter, with the venv's Python."""
    output = run_checks(openhands_venv, HERE / "py312" / "check_convert.py")
    assert "ok check_messages" in output
