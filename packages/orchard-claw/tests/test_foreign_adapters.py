"""The foreign-harness adapters as pure functions: the configs, argv and env they build,
and their parsers over real outputs (``foreign_samples/``: captured from runs of the pinned
harness versions against the stub model of ``foreign_stub_model.py``)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from orchard_claw.foreign import HARNESSES, HarnessRun
from orchard_claw.foreign.base import API_KEY_ENV, DUMMY_API_KEY, HARNESS_PATH, KILL_GRACE_S

pytestmark = pytest.mark.fast

SAMPLES = Path(__file__).parent / "foreign_samples"
FINAL = "STUB-FINAL: wrote /workspace/out.txt"
RUN = HarnessRun(
    model="Qwen/Qwen3-8B",
    base_url="http://127.0.0.1:4000/r/run-7/v1",
    task="--not-an-option: sort the files in /workspace",
    home="/tmp/h",
    timeout_s=300,
)


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


def test_registry_names_every_harness():
    assert set(HARNESSES) == {"openclaw", "codex", "opencode"}
    assert {h.api for h in HARNESSES.values()} == {"chat", "responses"}
    for name, harness in HARNESSES.items():
        assert harness.name == name
        assert harness.shell_tools


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_invocation_is_bounded_and_keeps_the_workspace_clean(name):
    inv = HARNESSES[name].invocation(RUN)
    # Everything the harness needs goes to the scratch home, nothing into the workspace.
    assert inv.files and all(path.startswith("/tmp/h/") for path in inv.files)
    assert inv.cwd == "/workspace"
    assert inv.argv[:3] == ["timeout", f"--kill-after={KILL_GRACE_S}", "300"]
    assert inv.argv[3] == HARNESSES[name].binary
    assert inv.exec_timeout_s > inv.timeout_s + KILL_GRACE_S
    assert inv.env["HOME"] == "/tmp/h"
    assert inv.env["PATH"] == HARNESS_PATH
    assert inv.env[API_KEY_ENV] == DUMMY_API_KEY
    assert all(isinstance(v, str) for v in inv.env.values())


def test_openclaw_config_and_argv():
    inv = HARNESSES["openclaw"].invocation(RUN)
    config = json.loads(inv.files["/tmp/h/openclaw.json"])
    provider = config["models"]["providers"]["orchard"]
    assert config["models"]["mode"] == "replace"
    assert provider["baseUrl"] == RUN.base_url
    assert provider["api"] == "openai-completions"
    assert provider["apiKey"] == DUMMY_API_KEY
    assert provider["models"][0]["id"] == RUN.model
    assert config["agents"]["defaults"]["model"]["primary"] == "orchard/Qwen/Qwen3-8B"
    argv = inv.argv[3:]
    assert argv[:3] == ["openclaw", "agent", "exec"]
    assert argv[argv.index("--config") + 1] == "/tmp/h/openclaw.json"
    assert argv[argv.index("--cwd") + 1] == "/workspace"
    assert "--json" in argv
    # The task goes through a file: a task starting with "--" is not an option.
    assert inv.files[argv[argv.index("--message-file") + 1]] == RUN.task
    assert int(argv[argv.index("--timeout") + 1]) < 300


def test_codex_config_and_argv():
    inv = HARNESSES["codex"].invocation(RUN)
    assert inv.env["CODEX_HOME"] == "/tmp/h/.codex"
    config = tomllib.loads(inv.files["/tmp/h/.codex/config.toml"])
    assert config["model"] == RUN.model
    assert config["model_provider"] == "orchard"
    provider = config["model_providers"]["orchard"]
    assert provider["base_url"] == RUN.base_url
    assert provider["wire_api"] == "responses"
    assert provider["env_key"] == API_KEY_ENV
    argv = inv.argv[3:]
    assert argv[:2] == ["codex", "exec"]
    assert "--skip-git-repo-check" in argv
    assert "--dangerously-bypass-approvals-and-sandbox" in argv
    assert argv[argv.index("-C") + 1] == "/workspace"
    assert argv[-2:] == ["--", RUN.task]


def test_codex_config_escapes_strings():
    odd = HarnessRun(model='m"x\\y', base_url="http://127.0.0.1:4000/v1", task="t")
    config = tomllib.loads(
        HARNESSES["codex"].invocation(odd).files[f"{odd.home}/.codex/config.toml"]
    )
    assert config["model"] == 'm"x\\y'


def test_opencode_config_and_argv():
    inv = HARNESSES["opencode"].invocation(RUN)
    assert inv.env["OPENCODE_CONFIG"] == "/tmp/h/opencode.json"
    assert inv.env["OPENCODE_DISABLE_MODELS_FETCH"] == "1"
    config = json.loads(inv.files["/tmp/h/opencode.json"])
    provider = config["provider"]["orchard"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": RUN.base_url, "apiKey": "{env:ORCHARD_MODEL_API_KEY}"}
    assert RUN.model in provider["models"]
    assert config["permission"] == {"edit": "allow", "bash": "allow"}
    argv = inv.argv[3:]
    assert argv[:2] == ["opencode", "run"]
    assert argv[argv.index("--model") + 1] == "orchard/Qwen/Qwen3-8B"
    assert argv[argv.index("--format") + 1] == "json"
    assert RUN.task not in argv
    assert inv.stdin == RUN.task  # verbatim: a positional message would be quoted


def test_openclaw_parses_its_envelope():
    result = HARNESSES["openclaw"].parse("some banner\n" + sample("openclaw_ok.json"), 0)
    assert result.exit_status == "submitted"
    assert result.final_text == FINAL
    assert (result.turns, result.tool_calls) == (2, 1)
    assert (result.prompt_tokens, result.completion_tokens) == (20, 10)
    assert result.error is None


def test_openclaw_failure_is_an_error():
    result = HARNESSES["openclaw"].parse(sample("openclaw_refused.json"), 2)
    assert result.exit_status.startswith("error: ")
    assert "connection refused" in result.exit_status
    assert result.final_text == ""


def test_codex_parses_its_events():
    result = HARNESSES["codex"].parse(sample("codex_ok.jsonl"), 0)
    # The "model metadata not found" warning item is not a failure.
    assert result.exit_status == "submitted"
    assert result.final_text == FINAL
    assert result.tool_calls == 1
    assert result.turns is None
    assert (result.prompt_tokens, result.completion_tokens) == (20, 10)


def test_codex_killed_while_retrying_is_a_time_limit():
    result = HARNESSES["codex"].parse(sample("codex_refused.jsonl"), 124)
    assert result.exit_status == "time_limit"
    assert result.error is not None and "Reconnecting" in result.error
    assert result.prompt_tokens is None


def test_codex_turn_failed_is_an_error():
    stdout = '{"type":"turn.started"}\n{"type":"turn.failed","error":{"message":"bad key"}}\n'
    result = HARNESSES["codex"].parse(stdout, 1)
    assert result.exit_status == "error: bad key"


def test_opencode_parses_its_events():
    result = HARNESSES["opencode"].parse(sample("opencode_ok.jsonl"), 0)
    assert result.exit_status == "submitted"
    assert result.final_text == FINAL
    assert (result.turns, result.tool_calls) == (2, 1)
    assert (result.prompt_tokens, result.completion_tokens) == (20, 10)


def test_opencode_error_event_is_an_error():
    stdout = (
        '{"type":"step_start","part":{}}\n'
        '{"type":"error","error":{"name":"APIError","data":{"message":"Unauthorized"}}}\n'
    )
    result = HARNESSES["opencode"].parse(stdout, 1)
    assert result.exit_status == "error: Unauthorized"


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_parsers_survive_empty_and_garbage_output(name):
    for stdout, code in (("", 0), ("", 1), ("not json\n{broken\n", 0), ("[1, 2]\n", 0)):
        result = HARNESSES[name].parse(stdout, code)
        assert result.exit_status != "submitted"
        assert result.final_text == ""
    assert HARNESSES[name].parse("", 124).exit_status == "time_limit"
