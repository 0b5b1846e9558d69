"""codex (npm ``@openai/codex``, a static Rust binary): ``codex exec``, non-interactive.

Run as ``codex exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox -C
<workdir> --json -- <task>`` with stdin from /dev/null (else it waits on stdin) and
``CODEX_HOME=<home>/.codex`` holding ``config.toml``: model provider ``orchard`` with
``wire_api = "responses"`` — codex speaks only the Responses API (``POST
<base_url>/responses``, always ``stream: true``, ``store: false``), key from
``env_key``. Its own sandbox (landlock/seccomp) cannot start in ours, hence the bypass: the
Orchard sandbox is the boundary. Its shell tool is ``exec_command {"cmd": ...}`` (0.171;
older versions offered ``shell {"command": [argv]}``), also ``write_stdin``, ``view_image``,
goal tools and a hosted ``web_search`` the proxy can ignore.

``--json`` prints JSON lines: ``thread.started``, ``turn.started``, ``item.started`` /
``item.completed`` (items ``command_execution``, ``file_change``, ``mcp_tool_call``,
``agent_message``, ``reasoning``, ``error`` — a warning such as unknown model metadata),
``turn.completed {usage}``, ``turn.failed {error}`` and top-level ``error`` (it retries an
unreachable endpoint without end: the time limit ends such a run).
"""

from __future__ import annotations

import json

from .base import (
    API_KEY_ENV,
    ForeignHarness,
    ForeignResult,
    HarnessRun,
    Invocation,
    as_dict,
    base_env,
    exit_status_of,
    json_lines,
    with_time_limit,
)

__all__ = ["HARNESS", "PROVIDER", "build", "config_toml", "parse"]

PROVIDER = "orchard"
TOOL_ITEMS = frozenset({"command_execution", "file_change", "mcp_tool_call", "web_search"})


def _toml_str(value: str) -> str:
    # A JSON string is a valid TOML basic string for everything json.dumps emits.
    return json.dumps(value)


def config_toml(run: HarnessRun) -> str:
    """``$CODEX_HOME/config.toml``: our provider over the Responses API, no approvals."""
    return "\n".join(
        [
            f"model = {_toml_str(run.model)}",
            f"model_provider = {_toml_str(PROVIDER)}",
            'approval_policy = "never"',
            'sandbox_mode = "danger-full-access"',
            "",
            f"[model_providers.{PROVIDER}]",
            f"name = {_toml_str(PROVIDER)}",
            f"base_url = {_toml_str(run.base_url)}",
            f"env_key = {_toml_str(API_KEY_ENV)}",
            'wire_api = "responses"',
            "request_max_retries = 1",
            "stream_max_retries = 1",
            "",
        ]
    )


def build(run: HarnessRun) -> Invocation:
    """Files, argv and env of one codex run."""
    codex_home = f"{run.home}/.codex"
    argv = [
        "codex",
        "exec",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "-C",
        run.workdir,
        "--json",
        "--",
        run.task,
    ]
    return Invocation(
        files={f"{codex_home}/config.toml": config_toml(run)},
        argv=with_time_limit(argv, run.timeout_s),
        env={**base_env(run), "CODEX_HOME": codex_home},
        cwd=run.workdir,
        timeout_s=run.timeout_s,
    )


def parse(stdout: str, exit_code: int | None) -> ForeignResult:
    """The result of ``codex exec --json`` from its JSON lines and exit code."""
    events = list(json_lines(stdout))
    final, error = "", None
    tool_calls = prompt = completion = 0
    completed = False
    for ev in events:
        kind = ev.get("type")
        item = as_dict(ev.get("item"))
        if kind == "item.completed":
            if item.get("type") == "agent_message":
                final = str(item.get("text") or "")
            elif item.get("type") in TOOL_ITEMS:
                tool_calls += 1
        elif kind == "turn.completed":
            completed, error = True, None
            usage = as_dict(ev.get("usage"))
            prompt += int(usage.get("input_tokens") or 0)
            completion += int(usage.get("output_tokens") or 0)
        elif kind == "turn.failed":
            err = ev.get("error")
            error = str((err.get("message") if isinstance(err, dict) else err) or "turn failed")
        elif kind == "error" and not completed:
            error = str(ev.get("message") or "error")
    if not completed and error is None and exit_code == 0:
        error = "the turn did not complete"
    return ForeignResult(
        final_text=final,
        exit_status=exit_status_of(exit_code, error),
        exit_code=exit_code,
        turns=None,
        tool_calls=tool_calls,
        prompt_tokens=prompt if completed else None,
        completion_tokens=completion if completed else None,
        error=error,
        events=events,
    )


HARNESS = ForeignHarness(
    name="codex",
    binary="codex",
    api="responses",
    shell_tools=("exec_command", "shell", "shell_command", "local_shell"),
    build=build,
    parse=parse,
)
