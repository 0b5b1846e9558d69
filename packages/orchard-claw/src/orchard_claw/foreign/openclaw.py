"""openclaw (npm ``openclaw``, Node >= 24): ``openclaw agent exec``, one headless turn.

Run as ``openclaw agent exec --config <home>/openclaw.json --model orchard/<model> --cwd
<workdir> --json --timeout <s> --message-file <home>/task.md``. The config replaces the
model catalogue with one provider, ``orchard`` (``api: "openai-completions"``: streaming
chat completions with ``stream_options.include_usage``; the key is sent as a Bearer token).
Its shell tool is ``exec {"command": ...}`` (also ``read``, ``write``, ``edit``,
``apply_patch``, ``ls``, ``process`` and tool-search helpers). State (a SQLite session db)
goes under ``HOME``.

``--json`` prints one JSON envelope at the end (pretty-printed; logs go to stderr)::

    {"ok": true, "status": "ok", "final": "...", "payloads": [{"text": ...}],
     "usage": {"input": n, "output": n, ...}, "assistantTurns": n,
     "toolSummary": {"calls": n, "tools": [...], "failures": n}, ...}

and on failure ``{"ok": false, "status": "timeout"|..., "error": {"message", "kind"}}``
(exit code 2; an unreachable endpoint is reported as kind ``timeout`` after its retries).
"""

from __future__ import annotations

import json
from typing import Any

from .base import (
    ForeignHarness,
    ForeignResult,
    HarnessRun,
    Invocation,
    as_dict,
    base_env,
    exit_status_of,
    with_time_limit,
)

__all__ = ["HARNESS", "PROVIDER", "build", "config", "parse"]

PROVIDER = "orchard"
CONTEXT_WINDOW = 128_000
MAX_TOKENS = 8_192


def config(run: HarnessRun) -> dict[str, Any]:
    """openclaw's config: only our provider and model, used as the primary model."""
    return {
        "models": {
            "mode": "replace",
            "providers": {
                PROVIDER: {
                    "baseUrl": run.base_url,
                    "apiKey": run.api_key,
                    "api": "openai-completions",
                    "models": [
                        {
                            "id": run.model,
                            "name": run.model,
                            "contextWindow": CONTEXT_WINDOW,
                            "maxTokens": MAX_TOKENS,
                        }
                    ],
                }
            },
        },
        "agents": {"defaults": {"model": {"primary": f"{PROVIDER}/{run.model}"}}},
    }


def build(run: HarnessRun) -> Invocation:
    """Files, argv and env of one openclaw run (the task is read from a file, so a task
    text that looks like an option stays text)."""
    config_path, task_path = f"{run.home}/openclaw.json", f"{run.home}/task.md"
    # Its own deadline a little before the hard one, so it can still print its envelope.
    inner = max(1, round(run.timeout_s) - 15)
    argv = [
        "openclaw",
        "agent",
        "exec",
        "--config",
        config_path,
        "--model",
        f"{PROVIDER}/{run.model}",
        "--cwd",
        run.workdir,
        "--json",
        "--timeout",
        str(inner),
        "--message-file",
        task_path,
    ]
    return Invocation(
        files={config_path: json.dumps(config(run), indent=2) + "\n", task_path: run.task},
        argv=with_time_limit(argv, run.timeout_s),
        env=base_env(run),
        cwd=run.workdir,
        timeout_s=run.timeout_s,
    )


def _envelope(stdout: str) -> dict[str, Any] | None:
    """The last JSON object in stdout that starts at the beginning of a line."""
    decoder = json.JSONDecoder()
    found: dict[str, Any] | None = None
    pos = 0
    while (start := stdout.find("{", pos)) != -1:
        if start == 0 or stdout[start - 1] == "\n":
            try:
                obj, end = decoder.raw_decode(stdout, start)
            except ValueError:
                pos = start + 1
                continue
            if isinstance(obj, dict):
                found = obj
            pos = end
        else:
            pos = start + 1
    return found


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse(stdout: str, exit_code: int | None) -> ForeignResult:
    """The result of ``openclaw agent exec --json`` from its stdout and exit code."""
    env = _envelope(stdout)
    if env is None:
        missing = "no JSON result on stdout" if exit_code == 0 else None
        return ForeignResult(
            final_text="",
            exit_status=exit_status_of(exit_code, missing),
            exit_code=exit_code,
            error=missing,
        )
    final = env.get("final")
    if not isinstance(final, str) or not final:
        payloads = env.get("payloads") or []
        final = "\n".join(
            str(p.get("text")) for p in payloads if isinstance(p, dict) and p.get("text")
        )
    error: str | None = None
    if env.get("ok") is False:
        err = env.get("error")
        message = err.get("message") if isinstance(err, dict) else err
        error = str(message or f"status {env.get('status')}")
    usage = as_dict(env.get("usage"))
    tools = as_dict(env.get("toolSummary"))
    return ForeignResult(
        final_text=final,
        exit_status=exit_status_of(exit_code, error),
        exit_code=exit_code,
        turns=_int(env.get("assistantTurns")),
        tool_calls=_int(tools.get("calls")),
        prompt_tokens=_int(usage.get("input")),
        completion_tokens=_int(usage.get("output")),
        error=error,
        events=[env],
    )


HARNESS = ForeignHarness(
    name="openclaw", binary="openclaw", api="chat", shell_tools=("exec",), build=build, parse=parse
)
