"""opencode (npm ``opencode-ai``, a single Bun-compiled binary): ``opencode run``.

Run as ``opencode run --pure --model orchard/<model> --format json`` in the workdir with the
task on stdin (a positional message would reach the model quoted: opencode wraps every
argument that holds a space in double quotes and escapes the quotes inside),
with ``OPENCODE_CONFIG=<home>/opencode.json`` (so nothing is written into the task's
workspace): provider ``orchard`` through the bundled ``@ai-sdk/openai-compatible``, key from
``{env:ORCHARD_MODEL_API_KEY}``, ``permission: {edit: allow, bash: allow}``. It speaks
streaming chat completions (``stream_options.include_usage``); besides the agent's requests
(tools ``bash {"command", "timeout"?, "workdir"?}``, ``edit``, ``glob``, ``grep``,
``read``, ``skill``, ``task``, ``todowrite``, ``webfetch``, ``write``) it sends one request
*without tools* to make a session title. The ``OPENCODE_DISABLE_*`` switches keep it from
fetching the models.dev catalogue, plugins, LSP servers or updates (it carries on when
those fetches fail, but they cost time).

``--format json`` prints JSON lines, one per part: ``step_start``, ``tool_use`` (``part.tool``,
``part.state.status/input/output``), ``text`` (``part.text``), ``step_finish``
(``part.reason``: ``tool-calls`` | ``stop``; ``part.tokens``) and ``error``
(``error.name``, ``error.data.message``). Each step is one model call.
"""

from __future__ import annotations

import json
from typing import Any

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

__all__ = ["HARNESS", "PROVIDER", "build", "config", "parse"]

PROVIDER = "orchard"
QUIET_ENV = {
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
}


def config(run: HarnessRun) -> dict[str, Any]:
    """``opencode.json``: our provider and model, every edit and command allowed."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": PROVIDER,
                "options": {"baseURL": run.base_url, "apiKey": f"{{env:{API_KEY_ENV}}}"},
                "models": {run.model: {"name": run.model}},
            }
        },
        "model": f"{PROVIDER}/{run.model}",
        "permission": {"edit": "allow", "bash": "allow"},
        "autoupdate": False,
        "share": "disabled",
    }


def build(run: HarnessRun) -> Invocation:
    """Files, argv and env of one opencode run."""
    config_path = f"{run.home}/opencode.json"
    argv = [
        "opencode",
        "run",
        "--pure",
        "--model",
        f"{PROVIDER}/{run.model}",
        "--format",
        "json",
    ]
    return Invocation(
        files={config_path: json.dumps(config(run), indent=2) + "\n"},
        argv=with_time_limit(argv, run.timeout_s),
        env={**base_env(run), **QUIET_ENV, "OPENCODE_CONFIG": config_path},
        cwd=run.workdir,
        timeout_s=run.timeout_s,
        stdin=run.task,
    )


def _error_message(ev: dict[str, Any]) -> str:
    err = ev.get("error")
    if isinstance(err, dict):
        data = as_dict(err.get("data"))
        return str(data.get("message") or err.get("message") or err.get("name") or "error")
    return str(err or ev.get("message") or "error")


def parse(stdout: str, exit_code: int | None) -> ForeignResult:
    """The result of ``opencode run --format json`` from its JSON lines and exit code."""
    events = list(json_lines(stdout))
    steps = tool_calls = prompt = completion = 0
    texts: list[str] = []
    error: str | None = None
    for ev in events:
        kind = ev.get("type")
        part = as_dict(ev.get("part"))
        if kind == "step_start":
            steps += 1
            texts = []  # the answer is the text of the last step
        elif kind == "text":
            texts.append(str(part.get("text") or ""))
        elif kind == "tool_use":
            tool_calls += 1
        elif kind == "step_finish":
            tokens = as_dict(part.get("tokens"))
            prompt += int(tokens.get("input") or 0)
            completion += int(tokens.get("output") or 0)
        elif kind == "error":
            error = _error_message(ev)
    if steps == 0 and error is None and exit_code == 0:
        error = "no step in its output"
    return ForeignResult(
        final_text="".join(texts).strip(),
        exit_status=exit_status_of(exit_code, error),
        exit_code=exit_code,
        turns=steps,
        tool_calls=tool_calls,
        prompt_tokens=prompt,
        completion_tokens=completion,
        error=error,
        events=events,
    )


HARNESS = ForeignHarness(
    name="opencode", binary="opencode", api="chat", shell_tools=("bash",), build=build, parse=parse
)
