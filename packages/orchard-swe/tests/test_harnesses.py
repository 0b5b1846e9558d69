"""Both harnesses against a real local Orchard server and a scripted model.

Each test gets a fresh sandbox (image ``host``) with a tiny git repository in
/workspace/repo: ``calc.py`` has a bug, ``README.md`` documents it. The gold patch (made
with git on the host, from the same files) fixes the bug, edits the README (adding a code
fence, which the mini gold script must carry as base64), adds a new module and a binary
file, so an exact match checks new files and binary safety too.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchard_env_client import AsyncSandbox, AsyncSandboxClient, Sandbox, SandboxClient
from orchard_env_client.llm import ChatClient, ModelConfig, ModelError
from orchard_swe.harness.editor import SandboxEditor, ToolError
from orchard_swe.harness.tools import NO_TOOL_CALL_REMINDER, TOOLS, run_tools_agent
from orchard_swe.testing.replay import (
    Script,
    ScriptedModelServer,
    Step,
    ToolCall,
    empty_script,
    from_trajectory,
    gold_script,
    junk_script,
    mini_action,
)
from orchard_swe.trajectory import append_jsonl, from_mini_traj, read_jsonl
from orchard_testing import RunningServer, check_tool_protocol

integration = pytest.mark.integration
fast = pytest.mark.fast

REPO = "/workspace/repo"
CALC = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
README = "# calc\n\nA calculator.\n"
FILES: dict[str, bytes] = {"calc.py": CALC.encode(), "README.md": README.encode()}
FIX: dict[str, bytes] = {
    "calc.py": CALC.replace("a - b", "a + b").encode(),
    "README.md": (README + "\n```python\nadd(1, 2)  # 3\n```\n").encode(),
    "pkg/util.py": b"def double(x):\n    return 2 * x\n",
    "data.bin": bytes(range(256)) + b"\x00\xff\x00",
}
PROBLEM = "add(1, 2) returns -1 instead of 3. Fix calc.add."


# ---------------------------------------------------------------- fixtures


def _host_git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        env=env,
    )
    return done.stdout.decode()


@pytest.fixture(scope="module")
def gold_patch(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The fix as git on the host writes it (``git add -A; git diff --cached --binary``)."""
    repo = tmp_path_factory.mktemp("gold") / "repo"
    repo.mkdir()
    _host_git(repo, "init", "-q")
    for name, data in FILES.items():
        (repo / name).write_bytes(data)
    _host_git(repo, "add", "-A")
    _host_git(repo, "commit", "-qm", "init")
    for name, data in FIX.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(data)
    _host_git(repo, "add", "-A")
    patch = _host_git(repo, "diff", "--cached", "--binary")
    assert "GIT binary patch" in patch and "new file mode" in patch and "```" in patch
    return patch


@pytest.fixture(scope="module")
def local_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = RunningServer(backend="local", state_dir=tmp_path_factory.mktemp("harness") / "s")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def model_server() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer() as server:
        yield server


@pytest.fixture
def model(model_server: ScriptedModelServer) -> ModelConfig:
    return ModelConfig(
        model="scripted",
        base_url=model_server.base_url,
        api_key_env="ORCHARD_SWE_TEST_NO_KEY",
        price_per_1k_prompt=0.001,
        price_per_1k_completion=0.002,
        max_retries=0,
    )


@pytest.fixture(autouse=True)
def _fail_fast_mini(monkeypatch: pytest.MonkeyPatch) -> None:
    # mini retries a failed model call 10 times with 4-60 s waits; a test bug should fail fast
    monkeypatch.setenv("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")


SETUP = (
    "set -e; cd /workspace/repo; git init -q; git config user.email t@t; "
    "git config user.name t; git add -A; git commit -qm init"
)


async def _make_repo_async(sandbox: AsyncSandbox) -> None:
    for name, data in FILES.items():
        await sandbox.upload_content(f"{REPO}/{name}", data)
    job = await sandbox.exec(SETUP)
    assert job.exit_code == 0, job.stderr


def _make_repo(sandbox: Sandbox) -> None:
    for name, data in FILES.items():
        sandbox.upload_content(f"{REPO}/{name}", data)
    job = sandbox.exec(SETUP)
    assert job.exit_code == 0, job.stderr


@pytest.fixture
async def asandbox(local_server: RunningServer) -> AsyncIterator[AsyncSandbox]:
    async with AsyncSandboxClient(local_server.url) as client:
        sandbox = await client.create_sandbox(local_server.image)
        await _make_repo_async(sandbox)
        yield sandbox


@pytest.fixture
def sandbox(local_server: RunningServer) -> Iterator[Sandbox]:
    with SandboxClient(local_server.url) as client:
        box = client.create_sandbox(local_server.image)
        _make_repo(box)
        yield box


# ---------------------------------------------------------------- tools harness


@integration
async def test_tools_gold_script_gives_exactly_the_gold_patch(
    asandbox: AsyncSandbox,
    model_server: ScriptedModelServer,
    model: ModelConfig,
    gold_patch: str,
    tmp_path: Path,
) -> None:
    model_server.add("tools-gold", gold_script(gold_patch, "tools"))
    traj = await run_tools_agent(asandbox, PROBLEM, model=model, instance_id="tools-gold")
    meta = traj.metadata
    assert meta.exit_status == "submitted", meta.error
    assert meta.final_output == gold_patch
    assert meta.steps == 3 and meta.harness == "tools" and meta.error is None
    assert meta.prompt_tokens > 0 and meta.completion_tokens > 0
    assert meta.cost == pytest.approx(model.cost(meta.prompt_tokens, meta.completion_tokens))
    assert meta.finished_at >= meta.started_at and meta.duration_s > 0
    assert traj.tools == TOOLS
    assert [m["role"] for m in traj.messages[:2]] == ["system", "user"]
    assert PROBLEM in traj.messages[1]["content"] and REPO in traj.messages[1]["content"]
    check_tool_protocol(traj.messages)
    # the trajectory survives JSON lines, and replays to the same patch
    append_jsonl(tmp_path / "t.jsonl", traj)
    (again,) = read_jsonl(tmp_path / "t.jsonl")
    assert again == traj
    job = await asandbox.exec("git reset -q --hard && git clean -fdq", cwd=REPO)
    assert job.exit_code == 0
    model_server.add("tools-replay", from_trajectory(again))
    replayed = await run_tools_agent(asandbox, PROBLEM, model=model, instance_id="tools-replay")
    assert replayed.metadata.exit_status == "submitted"
    assert replayed.metadata.final_output == gold_patch


@integration
async def test_tools_empty_script_gives_an_empty_patch(
    asandbox: AsyncSandbox, model_server: ScriptedModelServer, model: ModelConfig
) -> None:
    model_server.add("tools-empty", empty_script("tools"))
    traj = await run_tools_agent(asandbox, PROBLEM, model=model, instance_id="tools-empty")
    assert traj.metadata.exit_status == "submitted"
    assert traj.metadata.final_output == ""
    assert traj.metadata.steps == 1


@integration
async def test_tools_junk_model_ends_at_the_step_limit(
    asandbox: AsyncSandbox, model_server: ScriptedModelServer, model: ModelConfig
) -> None:
    model_server.add("tools-junk", junk_script())
    traj = await run_tools_agent(
        asandbox, PROBLEM, model=model, instance_id="tools-junk", max_steps=4
    )
    assert traj.metadata.exit_status == "step_limit"
    assert traj.metadata.steps == 4
    assert traj.metadata.final_output == ""
    reminders = [m for m in traj.messages if m.get("content") == NO_TOOL_CALL_REMINDER]
    assert len(reminders) == 4


@integration
async def test_tools_malformed_calls_get_error_messages(
    asandbox: AsyncSandbox, model_server: ScriptedModelServer, model: ModelConfig
) -> None:
    script = Script(
        [
            Step(tool_calls=(ToolCall("bash", '{"command": "ls'),)),  # truncated JSON
            Step(tool_calls=(ToolCall("bash", "[1, 2]"),)),  # not an object
            Step(tool_calls=(ToolCall("bash", {"cmd": "ls"}),)),  # missing `command`
            Step(tool_calls=(ToolCall("rm_rf", {}),)),  # unknown tool
            Step(tool_calls=(ToolCall("str_replace_based_edit_tool", {"command": "fly"}),)),
            Step(
                tool_calls=(
                    ToolCall("bash", {"command": "echo out; echo err >&2; exit 3"}),
                    ToolCall("submit", {}),
                    ToolCall("bash", {"command": "echo too late"}),
                )
            ),
        ]
    )
    model_server.add("tools-malformed", script)
    traj = await run_tools_agent(asandbox, PROBLEM, model=model, instance_id="tools-malformed")
    assert traj.metadata.exit_status == "submitted"
    check_tool_protocol(traj.messages)
    results = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert "not valid JSON" in results[0]
    assert "must be a JSON object" in results[1]
    assert "`command`" in results[2]
    assert "Unknown tool 'rm_rf'" in results[3]
    assert "Parameter `path` is required" in results[4]
    assert results[5] == "out\nerr\n[exit code: 3]"
    assert results[6].startswith("Submitted")
    assert results[7].startswith("Not executed")
    assert traj.metadata.extra["tool_errors"] == 5


@integration
async def test_tools_bash_output_is_truncated_head_and_tail(
    asandbox: AsyncSandbox, model_server: ScriptedModelServer, model: ModelConfig
) -> None:
    command = "python3 -c \"print('HEAD' + 'x' * 50000 + 'TAIL')\"; sleep 30"
    script = Script(
        [
            Step(tool_calls=(ToolCall("bash", {"command": command, "timeout": 2}),)),
            Step(tool_calls=(ToolCall("submit", {}),)),
        ]
    )
    model_server.add("tools-long", script)
    traj = await run_tools_agent(
        asandbox, PROBLEM, model=model, instance_id="tools-long", max_output_chars=2000
    )
    (output, _) = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert output.startswith("HEAD") and "TAIL" in output and "characters elided" in output
    assert "timed out after 2 s" in output and output.endswith("[exit code: none]")
    assert len(output) < 3000


@integration
async def test_tools_cost_and_time_limits(
    asandbox: AsyncSandbox, model_server: ScriptedModelServer, model: ModelConfig
) -> None:
    model_server.add("tools-cost", junk_script())
    pricey = ModelConfig(model="scripted", base_url=model.base_url, price_per_1k_prompt=1000.0)
    traj = await run_tools_agent(
        asandbox, PROBLEM, model=pricey, instance_id="tools-cost", max_cost=1.0
    )
    assert traj.metadata.exit_status == "cost_limit" and traj.metadata.steps == 1

    sleepy = Script(
        [Step(tool_calls=(ToolCall("bash", {"command": "sleep 20"}),))], repeat_last=True
    )
    model_server.add("tools-time", sleepy)
    traj = await run_tools_agent(
        asandbox, PROBLEM, model=model, instance_id="tools-time", max_time_s=2
    )
    assert traj.metadata.exit_status == "time_limit"
    assert traj.metadata.duration_s < 15


@integration
async def test_tools_model_errors_end_the_episode_cleanly(
    asandbox: AsyncSandbox, model: ModelConfig
) -> None:
    # a conversation the model server does not know: a clear 400, an error trajectory
    traj = await run_tools_agent(asandbox, PROBLEM, model=model, instance_id="nobody-knows")
    assert traj.metadata.exit_status.startswith("error: ModelError")
    assert "unknown conversation" in (traj.metadata.error or "")
    assert traj.metadata.final_output == "" and traj.metadata.steps == 0


@integration
async def test_editor_tool_calls_through_the_harness(
    asandbox: AsyncSandbox, model_server: ScriptedModelServer, model: ModelConfig
) -> None:
    edit = "str_replace_based_edit_tool"
    script = Script(
        [
            Step(tool_calls=(ToolCall(edit, {"command": "view", "path": "calc.py"}),)),
            Step(
                tool_calls=(
                    ToolCall(
                        edit,
                        {
                            "command": "str_replace",
                            "path": f"{REPO}/calc.py",
                            "old_str": "a - b",
                            "new_str": "a + b",
                        },
                    ),
                    ToolCall(
                        edit, {"command": "create", "path": "notes/todo.txt", "file_text": "x"}
                    ),
                )
            ),
            Step(tool_calls=(ToolCall("submit", {}),)),
        ]
    )
    model_server.add("tools-editor", script)
    traj = await run_tools_agent(asandbox, PROBLEM, model=model, instance_id="tools-editor")
    assert traj.metadata.exit_status == "submitted"
    results = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert "     1\tdef add(a, b):\n     2\t    return a - b" in results[0]
    assert "has been edited" in results[1]
    patch = traj.metadata.final_output
    assert "-    return a - b\n+    return a + b\n" in patch
    assert "+++ b/notes/todo.txt\n@@ -0,0 +1 @@\n+x\n\\ No newline at end of file\n" in patch


# ---------------------------------------------------------------- the editor itself


@integration
async def test_editor_view(asandbox: AsyncSandbox) -> None:
    editor = SandboxEditor(asandbox, REPO)
    await asandbox.upload_content(f"{REPO}/pkg/sub/deep/x.py", b"")
    await asandbox.upload_content(f"{REPO}/.hidden", b"")
    out = await editor({"command": "view", "path": REPO})
    assert f"{REPO}/calc.py" in out and f"{REPO}/pkg/sub/" in out
    assert "sub/deep" not in out and ".hidden" not in out and ".git" not in out
    out = await editor({"command": "view", "path": "calc.py", "view_range": [2, 2]})
    assert out.endswith("     2\t    return a - b\n")
    out = await editor({"command": "view", "path": "calc.py", "view_range": [4, -1]})
    assert "     5\tdef mul(a, b):" in out and "     1\t" not in out
    with pytest.raises(ToolError, match="does not exist"):
        await editor({"command": "view", "path": "nope.py"})
    with pytest.raises(ToolError, match="view_range"):
        await editor({"command": "view", "path": "calc.py", "view_range": [9, 10]})


@integration
async def test_editor_create_and_str_replace(asandbox: AsyncSandbox) -> None:
    editor = SandboxEditor(asandbox, REPO)
    out = await editor({"command": "create", "path": "new/dir/a.txt", "file_text": "one\ntwo\n"})
    assert out.startswith("File created")
    assert await asandbox.download_content(f"{REPO}/new/dir/a.txt") == b"one\ntwo\n"
    out = await editor({"command": "create", "path": "new/dir/a.txt", "file_text": "dup\ndup\n"})
    assert "overwritten" in out

    with pytest.raises(ToolError, match="did not appear verbatim"):
        await editor({"command": "str_replace", "path": "calc.py", "old_str": "a / b"})
    with pytest.raises(ToolError, match=r"occurs 2 times .* lines \[1, 2\]"):
        await editor(
            {"command": "str_replace", "path": "new/dir/a.txt", "old_str": "dup", "new_str": "x"}
        )
    with pytest.raises(ToolError, match="must not be empty"):
        await editor({"command": "str_replace", "path": "calc.py", "old_str": ""})
    with pytest.raises(ToolError, match="not a regular file"):
        await editor({"command": "str_replace", "path": "new", "old_str": "x"})
    assert await asandbox.download_content(f"{REPO}/new/dir/a.txt") == b"dup\ndup\n"

    out = await editor(
        {"command": "str_replace", "path": "calc.py", "old_str": "a - b", "new_str": "a + b"}
    )
    assert "     2\t    return a + b" in out
    assert (
        await asandbox.download_content(f"{REPO}/calc.py")
        == CALC.replace("a - b", "a + b").encode()
    )
    out = await editor({"command": "undo_edit", "path": "calc.py"})
    assert await asandbox.download_content(f"{REPO}/calc.py") == CALC.encode()


@integration
async def test_editor_edits_are_exact_and_keep_the_mode(asandbox: AsyncSandbox) -> None:
    editor = SandboxEditor(asandbox, REPO)
    # CRLF line endings, Latin-1 bytes and no final newline survive an edit untouched
    raw = b"#!/bin/sh\r\necho caf\xe9\r\nexit 0"
    await asandbox.upload_content(f"{REPO}/run.sh", raw)
    await asandbox.exec(["chmod", "755", f"{REPO}/run.sh"])
    await editor(
        {"command": "str_replace", "path": "run.sh", "old_str": "exit 0", "new_str": "exit 1"}
    )
    assert await asandbox.download_content(f"{REPO}/run.sh") == raw.replace(b"exit 0", b"exit 1")
    job = await asandbox.exec(["stat", "-c", "%a", f"{REPO}/run.sh"])
    assert job.stdout.strip() == "755"
    await editor({"command": "insert", "path": "run.sh", "insert_line": 3, "new_str": "# end"})
    assert await asandbox.download_content(f"{REPO}/run.sh") == raw.replace(
        b"exit 0", b"exit 1\n# end"
    )


@integration
async def test_editor_insert(asandbox: AsyncSandbox) -> None:
    editor = SandboxEditor(asandbox, REPO)
    await editor({"command": "insert", "path": "calc.py", "insert_line": 0, "new_str": "import os"})
    await editor(
        {"command": "insert", "path": "calc.py", "insert_line": 3, "new_str": "# a\n# b\n"}
    )
    lines = (await asandbox.download_content(f"{REPO}/calc.py")).decode().split("\n")
    assert lines[:5] == ["import os", "def add(a, b):", "    return a - b", "# a", "# b"]
    n = len(lines) - 1
    out = await editor({"command": "insert", "path": "calc.py", "insert_line": n, "new_str": "END"})
    assert f"{n + 1:6}\tEND" in out
    assert (await asandbox.download_content(f"{REPO}/calc.py")).endswith(b"a * b\nEND\n")
    with pytest.raises(ToolError, match="Invalid `insert_line`"):
        await editor({"command": "insert", "path": "calc.py", "insert_line": 99, "new_str": "x"})
    with pytest.raises(ToolError, match="`insert_line` is required"):
        await editor({"command": "insert", "path": "calc.py", "new_str": "x"})
    with pytest.raises(ToolError, match="must be an integer"):
        await editor({"command": "insert", "path": "calc.py", "insert_line": "two", "new_str": "x"})


# ---------------------------------------------------------------- mini-swe-agent


def _mini(
    sandbox: Sandbox, model: ModelConfig, instance_id: str, traj_dir: Path, **kwargs: Any
) -> Any:
    from orchard_swe.harness.mini import run_mini_agent

    return run_mini_agent(
        sandbox, PROBLEM, model=model, instance_id=instance_id, traj_dir=traj_dir, **kwargs
    )


@integration
def test_mini_gold_script_gives_exactly_the_gold_patch(
    sandbox: Sandbox,
    model_server: ScriptedModelServer,
    model: ModelConfig,
    gold_patch: str,
    tmp_path: Path,
) -> None:
    model_server.add("mini-gold", gold_script(gold_patch, "mini"))
    traj = _mini(sandbox, model, "mini-gold", tmp_path / "traj", attempt=2)
    meta = traj.metadata
    assert meta.exit_status == "submitted", meta.error
    assert meta.final_output == gold_patch
    assert meta.harness == "mini" and meta.model == "scripted" and meta.attempt == 2
    assert meta.steps == 3 and meta.prompt_tokens > 0 and meta.completion_tokens > 0
    assert meta.cost == pytest.approx(model.cost(meta.prompt_tokens, meta.completion_tokens))
    assert traj.tools == []
    assistant = traj.assistant_messages()
    assert len(assistant) == 3 and "```mswea_bash_command\nbase64 -d" in assistant[0]["content"]
    # mini's own prompt, with the repository path instead of mini's /testbed
    assert PROBLEM in traj.messages[1]["content"] and "/testbed" not in traj.messages[1]["content"]
    assert REPO in traj.messages[1]["content"]

    # the .traj.json mini wrote is kept, and converts to the same conversation
    traj_file = Path(meta.extra["mini_traj_path"])
    assert traj_file.parent == tmp_path / "traj" and traj_file.name.endswith(".traj.json")
    raw = json.loads(traj_file.read_text())
    assert raw["info"]["exit_status"] == "Submitted" and raw["instance_id"] == "mini-gold"
    assert raw["info"]["config"]["environment_type"] == (
        "orchard_swe.harness.mini.OrchardEnvironment"
    )
    converted = from_mini_traj(traj_file, instance_id="mini-gold", attempt=2)
    assert converted.messages == traj.messages
    assert converted.metadata.exit_status == "submitted"
    assert converted.metadata.final_output == meta.extra["mini"]["submission"]
    assert "+    return a + b" in converted.metadata.final_output

    append_jsonl(tmp_path / "t.jsonl", traj)
    append_jsonl(tmp_path / "t.jsonl", converted)
    assert read_jsonl(tmp_path / "t.jsonl") == [traj, converted]


@integration
def test_mini_empty_script_gives_an_empty_patch(
    sandbox: Sandbox,
    model_server: ScriptedModelServer,
    model: ModelConfig,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model_server.add("mini-empty", empty_script("mini"))
    # a key from a variable of our own reaches the server but not mini's trajectory file
    monkeypatch.setenv("ORCHARD_SWE_TEST_KEY", "sk-test-secret-123")
    keyed = ModelConfig(
        model="scripted", base_url=model.base_url, api_key_env="ORCHARD_SWE_TEST_KEY"
    )
    traj = _mini(sandbox, keyed, "mini-empty", tmp_path)
    assert traj.metadata.exit_status == "submitted"
    assert traj.metadata.final_output == ""
    assert traj.metadata.steps == 1
    assert model_server.requests[-1].authorization == "Bearer sk-test-secret-123"
    saved = Path(traj.metadata.extra["mini_traj_path"]).read_text()
    assert "sk-test-secret-123" not in saved and "<redacted>" in saved


@integration
def test_mini_junk_model_ends_without_crashing(
    sandbox: Sandbox, model_server: ScriptedModelServer, model: ModelConfig, tmp_path: Path
) -> None:
    model_server.add("mini-junk", junk_script())
    # mini's own rule: 3 unparseable replies in a row end the episode
    traj = _mini(sandbox, model, "mini-junk", tmp_path, step_limit=5)
    assert traj.metadata.exit_status == "format_error"
    assert traj.metadata.steps == 3 and traj.metadata.final_output == ""
    # with that rule off, the step limit ends it
    traj = _mini(
        sandbox, model, "mini-junk", tmp_path, step_limit=4, max_consecutive_format_errors=0
    )
    assert traj.metadata.exit_status == "step_limit"
    assert traj.metadata.steps == 4
    errors = [m for m in traj.messages if "EXACTLY ONE action" in str(m.get("content"))]
    assert len(errors) == 4


@integration
def test_mini_tool_calling_config(
    sandbox: Sandbox,
    model_server: ScriptedModelServer,
    model: ModelConfig,
    gold_patch: str,
    tmp_path: Path,
) -> None:
    model_server.add("mini-tc", gold_script(gold_patch, "mini", toolcalls=True))
    traj = _mini(sandbox, model, "mini-tc", tmp_path, mini_config="swebench.yaml")
    assert traj.metadata.exit_status == "submitted", traj.metadata.error
    assert traj.metadata.final_output == gold_patch
    assert [t["function"]["name"] for t in traj.tools] == ["bash"]
    assert all(m.get("tool_calls") for m in traj.assistant_messages())
    check_tool_protocol(traj.messages, open_end=True)
    assert model_server.requests[-1].tools == ["bash"]


@integration
def test_mini_replays_a_recorded_trajectory(
    sandbox: Sandbox,
    model_server: ScriptedModelServer,
    model: ModelConfig,
    gold_patch: str,
    tmp_path: Path,
) -> None:
    model_server.add("mini-rec", gold_script(gold_patch, "mini"))
    first = _mini(sandbox, model, "mini-rec", tmp_path)
    assert sandbox.exec("git reset -q --hard && git clean -fdq", cwd=REPO).exit_code == 0
    model_server.add("mini-rep", from_trajectory(first))
    again = _mini(sandbox, model, "mini-rep", tmp_path)
    assert again.metadata.exit_status == "submitted"
    assert again.metadata.final_output == gold_patch


@integration
def test_orchard_environment_from_mini_config(
    sandbox: Sandbox, local_server: RunningServer
) -> None:
    from minisweagent.environments import get_environment
    from minisweagent.exceptions import Submitted

    env: Any = get_environment(
        {
            "environment_class": "orchard_swe.harness.mini.OrchardEnvironment",
            "base_url": local_server.url,
            "sandbox_id": sandbox.sandbox_id,
            "cwd": REPO,
            "timeout": 5,
            "env": {"GREETING": "hi"},
        }
    )
    try:
        out = env.execute({"command": "echo $GREETING; pwd; echo err >&2; exit 4"})
        assert out == {"output": f"hi\n{REPO}\nerr\n", "returncode": 4, "exception_info": ""}
        out = env.execute({"command": "pwd"}, cwd="/tmp")
        assert out["output"] == "/tmp\n"
        out = env.execute({"command": "echo started; sleep 10"}, timeout=1)
        assert out["returncode"] == -1 and "timed out after 1 seconds" in out["exception_info"]
        assert out["output"] == "started\n"
        out = env.execute({"command": "true"}, cwd="/no/such/dir")
        assert out["returncode"] == -1 and "not a directory" in out["exception_info"]
        # mini's submit protocol: the sentinel as first line of a successful command
        assert (
            env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; false"})[
                "returncode"
            ]
            == 1
        )
        with pytest.raises(Submitted) as info:
            env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo my patch"})
        assert info.value.messages[0]["extra"] == {
            "exit_status": "Submitted",
            "submission": "my patch\n",
        }
        variables = env.get_template_vars(extra_var=1)
        assert variables["system"] == "Linux" and variables["cwd"] == REPO
        assert variables["extra_var"] == 1
        serialized = env.serialize()["info"]["config"]
        assert serialized["environment"]["sandbox_id"] == sandbox.sandbox_id
        assert serialized["environment_type"] == "orchard_swe.harness.mini.OrchardEnvironment"
    finally:
        env.close()


# ---------------------------------------------------------------- pure units (no sandbox)


@fast
async def test_chat_client_retries_transient_failures() -> None:
    answers = [
        httpx.Response(503, text="busy"),
        httpx.Response(429, headers={"retry-after": "0"}, text="slow down"),
        httpx.Response(
            200,
            json={
                "model": "m",
                "choices": [{"message": {"role": "assistant", "content": "hi"}}],
                "usage": {"prompt_tokens": 1000, "completion_tokens": 500},
            },
        ),
    ]
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append({"url": str(request.url), "auth": request.headers.get("authorization")})
        return answers[len(seen) - 1]

    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    os.environ["ORCHARD_SWE_TEST_KEY"] = "sekrit"
    try:
        config = ModelConfig(
            model="m",
            base_url="http://127.0.0.1:1/v1",
            api_key_env="ORCHARD_SWE_TEST_KEY",
            price_per_1k_prompt=1.0,
            price_per_1k_completion=2.0,
        )
        client = ChatClient(config, transport=httpx.MockTransport(handler), sleep=sleep)
        result = await client.complete([{"role": "user", "content": "x"}])
        await client.aclose()
    finally:
        del os.environ["ORCHARD_SWE_TEST_KEY"]
    assert result.message == {"role": "assistant", "content": "hi"}
    assert (result.prompt_tokens, result.completion_tokens, result.cost) == (1000, 500, 2.0)
    assert len(seen) == 3 and seen[0]["url"] == "http://127.0.0.1:1/v1/chat/completions"
    assert seen[0]["auth"] == "Bearer sekrit"
    assert len(sleeps) == 2 and sleeps[1] == 0.0


@fast
async def test_chat_client_gives_clear_errors() -> None:
    def bad_request(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": "context too long"}})

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    async def no_sleep(seconds: float) -> None:
        return None

    config = ModelConfig(model="m", base_url="http://127.0.0.1:1/v1", max_retries=2)
    async with ChatClient(config, transport=httpx.MockTransport(bad_request)) as client:
        with pytest.raises(ModelError, match=r"HTTP 400.*context too long") as info:
            await client.complete([{"role": "user", "content": "x"}])
        assert info.value.status_code == 400
    async with ChatClient(config, transport=httpx.MockTransport(down), sleep=no_sleep) as client:
        with pytest.raises(ModelError, match=r"after 3 attempts.*ConnectError"):
            await client.complete([{"role": "user", "content": "x"}])


@fast
def test_scripted_server_selects_scripts_and_rejects_strangers() -> None:
    with ScriptedModelServer() as server:
        server.add("repo__issue-1", [{"tool": "bash", "arguments": {"command": "ls"}}, "done"])
        server.add("repo__issue-12", [mini_action("pwd")])
        assert server.base_url.startswith("http://127.0.0.1:") and server.base_url.endswith("/v1")
        url = server.base_url + "/chat/completions"
        # found by the id in the messages (the longest registered id that occurs)
        answer = httpx.post(url, json={"messages": [{"role": "user", "content": "repo__issue-12"}]})
        assert answer.status_code == 200
        assert (
            "```mswea_bash_command\npwd\n```" in answer.json()["choices"][0]["message"]["content"]
        )
        # by header; the step is the number of assistant messages so far
        messages = [{"role": "user", "content": "?"}]
        headers = {"X-Orchard-Instance-Id": "repo__issue-1"}
        first = httpx.post(url, json={"messages": messages}, headers=headers).json()
        call = first["choices"][0]["message"]["tool_calls"][0]
        assert call["function"] == {"name": "bash", "arguments": '{"command": "ls"}'}
        assert first["choices"][0]["finish_reason"] == "tool_calls"
        assert first["usage"]["prompt_tokens"] > 0
        messages.append(first["choices"][0]["message"])
        second = httpx.post(url, json={"messages": messages}, headers=headers).json()
        assert second["choices"][0]["message"]["content"] == "done"
        messages.append(second["choices"][0]["message"])
        exhausted = httpx.post(url, json={"messages": messages}, headers=headers)
        assert exhausted.status_code == 400 and "has 2 steps" in exhausted.text
        stranger = httpx.post(url, json={"messages": [{"role": "user", "content": "who?"}]})
        assert stranger.status_code == 400
        assert "unknown conversation" in stranger.json()["error"]["message"]
        assert httpx.get(server.base_url + "/models").json()["data"][0]["id"] == "scripted"
