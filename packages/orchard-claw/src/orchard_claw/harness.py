"""Our ReAct assistant harness: an OpenAI-compatible tool-calling model acts inside the sandbox.

Tools (function calls; one or more per turn, run in order): ``shell`` (a bash command in
the workspace), ``read_file``, ``write_file``, ``list_dir``, ``service_request`` (an HTTP
request to the task's own service inside the sandbox, when the task has one; reached
through the orchestrator's port forwarding) and ``finish`` (the final answer). A reply
with no tool call is taken as the final answer when it has text, else it is a format
error (``max_format_errors`` in a row end the episode). Step and time limits end it too.
Tool output shown to the model is truncated to ``max_observation_chars``.

The episode is an :class:`orchard_env_client.trajectory.Trajectory` (recipe ``claw``,
harness ``react``): the conversation, one step per tool call with its output, tokens.
Seeding the workspace and grading are the runner's job (:mod:`orchard_claw.runner`).
"""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from orchard_env_client import AsyncSandbox
from orchard_env_client.llm import INSTANCE_ID_HEADER, ChatClient, ModelConfig
from orchard_env_client.trajectory import (
    FORMAT_ERROR,
    STEP_LIMIT,
    SUBMITTED,
    TIME_LIMIT,
    Trajectory,
    TrajectoryMetadata,
    TrajectoryStep,
    error_status,
)

from .tasks import ClawTask

__all__ = ["HARNESS_NAME", "HarnessConfig", "run_episode", "system_prompt", "tool_specs"]

HARNESS_NAME: Final = "react"
WORKDIR: Final = "/workspace"
_MAX_SERVICE_BYTES: Final = 1 << 20


@attrs.define(frozen=True, kw_only=True)
class HarnessConfig:
    """How our harness runs an episode."""

    max_steps: int = attrs.field(default=30, validator=attrs.validators.ge(1))
    """Model calls per episode."""
    max_time_s: float = attrs.field(default=600.0, validator=attrs.validators.gt(0))
    """Wall-clock limit of one episode, model calls and tools together."""
    command_timeout_s: float = attrs.field(default=120.0, validator=attrs.validators.gt(0))
    """Kill timer of one ``shell`` command."""
    max_observation_chars: int = attrs.field(default=8000, validator=attrs.validators.ge(200))
    max_format_errors: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    system_prompt: str | None = None
    """Replaces the built-in system prompt."""


_SYSTEM = """You are a capable personal assistant working for the user on their computer.
Their files are under {workdir} (mail, calendar, notes, documents, data). Act with the
tools: run shell commands, read and write files{service}. Work step by step, check your
results, and change only what the task asks for. When the task is complete, call `finish`
with a short summary of what you did (or the answer, if the user asked a question)."""


def system_prompt(task: ClawTask, config: HarnessConfig) -> str:
    """The system prompt for ``task`` (the built-in one unless the config overrides it)."""
    if config.system_prompt is not None:
        return config.system_prompt
    service = ""
    if task.service is not None:
        service = (
            ", and call the task's local service with `service_request`"
            f" ({task.service.docs.strip()})"
        )
    return _SYSTEM.format(workdir=WORKDIR, service=service)


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def tool_specs(task: ClawTask) -> list[dict[str, Any]]:
    """The function tools offered for ``task`` (``service_request`` only with a service)."""
    text = {"type": "string"}
    tools = [
        _tool(
            "shell",
            f"Run a bash command in {WORKDIR}; returns exit code and output.",
            {"command": text},
            ["command"],
        ),
        _tool("read_file", "Read a text file.", {"path": text}, ["path"]),
        _tool(
            "write_file",
            "Create or overwrite a text file (parent folders are created).",
            {"path": text, "content": text},
            ["path", "content"],
        ),
        _tool("list_dir", "List a folder (names; folders end in /).", {"path": text}, ["path"]),
        _tool(
            "finish",
            "Declare the task done, with a short summary or the answer.",
            {"answer": text},
            ["answer"],
        ),
    ]
    if task.service is not None:
        tools.insert(
            4,
            _tool(
                "service_request",
                "Call the task's local HTTP service. " + task.service.docs.strip(),
                {
                    "method": {"type": "string", "enum": ["GET", "POST", "PUT", "PATCH", "DELETE"]},
                    "path": text,
                    "body": {"type": "object", "description": "JSON body, if any"},
                },
                ["method", "path"],
            ),
        )
    return tools


class ToolError(Exception):
    """A tool call the harness could not run (bad arguments); shown to the model."""


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: limit // 2] + f"\n... [{len(text) - limit} chars cut] ...\n" + text[-limit // 2 :]


def _arguments(raw: object) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(str(raw or "{}"))
    except json.JSONDecodeError as exc:
        raise ToolError(f"the arguments are not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ToolError("the arguments must be a JSON object")
    return value


def _text_arg(args: Mapping[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise ToolError(f"argument {name!r} (a string) is required")
    return value


def _path(args: Mapping[str, Any]) -> str:
    path = _text_arg(args, "path")
    return path if path.startswith("/") else f"{WORKDIR}/{path}"


class _Tools:
    """Runs the model's tool calls in one sandbox."""

    def __init__(self, sandbox: AsyncSandbox, task: ClawTask, config: HarnessConfig) -> None:
        self.sandbox, self.task, self.config = sandbox, task, config

    async def run(self, name: str, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The tool's output for the model and the small observation fields to record."""
        if name == "shell":
            job = await self.sandbox.exec(
                _text_arg(args, "command"), cwd=WORKDIR, timeout=self.config.command_timeout_s
            )
            output = job.stdout + (f"\n[stderr]\n{job.stderr}" if job.stderr else "")
            status = "timed out" if job.timed_out else f"exit code {job.exit_code}"
            return f"{status}\n{output}", {"exit_code": job.exit_code, "timed_out": job.timed_out}
        if name == "read_file":
            data = await self.sandbox.download_content(_path(args))
            return data.decode("utf-8", "replace"), {"bytes": len(data)}
        if name == "write_file":
            path, content = _path(args), _text_arg(args, "content")
            parent = path.rsplit("/", 1)[0] or "/"
            await self.sandbox.exec(["mkdir", "-p", parent], timeout=30)
            await self.sandbox.upload_content(path, content)
            return f"wrote {len(content.encode())} bytes to {path}", {"path": path}
        if name == "list_dir":
            job = await self.sandbox.exec(
                f"ls -1Ap -- {shlex.quote(_path(args))}", cwd=WORKDIR, timeout=30
            )
            return (job.stdout or job.stderr or "(empty)"), {"exit_code": job.exit_code}
        if name == "service_request" and self.task.service is not None:
            method = _text_arg(args, "method").upper()
            body = args.get("body")
            response = await self.sandbox.port_request(
                self.task.service.port,
                method,
                _text_arg(args, "path"),
                json=body if body is not None else None,
                timeout=60,
                max_bytes=_MAX_SERVICE_BYTES,
            )
            return f"HTTP {response.status_code}\n{response.text}", {"status": response.status_code}
        raise ToolError(f"unknown tool {name!r}")


@attrs.define
class _Episode:
    messages: list[dict[str, Any]] = attrs.field(factory=list)
    steps: list[TrajectoryStep] = attrs.field(factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    calls: int = 0
    answer: str = ""


async def _act(
    tools: _Tools, state: _Episode, calls: list[dict[str, Any]], chosen_by: int, limit: int
) -> bool:
    """Run a reply's tool calls; True when one of them was ``finish``."""
    finished = False
    for i, call in enumerate(calls):
        function = call.get("function") or {}
        call_id = str(call.get("id") or f"call_{chosen_by}_{i}")
        call["id"] = call_id
        name = str(function.get("name"))
        error: str | None = None
        observed: dict[str, Any] = {}
        try:
            args = _arguments(function.get("arguments"))
            if finished:
                output = "ignored: the task was already finished"
            elif name == "finish":
                state.answer, output, finished = str(args.get("answer") or ""), "ok", True
            else:
                output, observed = await tools.run(name, args)
        except ToolError as exc:
            output = error = str(exc)
        except Exception as exc:  # a tool's failure is the model's to see, not the episode's end
            output = error = f"{type(exc).__name__}: {exc}"
        state.messages.append(
            {"role": "tool", "tool_call_id": call_id, "content": _clip(output, limit)}
        )
        state.steps.append(
            TrajectoryStep(
                index=len(state.steps),
                action={"tool": name, "arguments": function.get("arguments")},
                observation={**observed, "output": _clip(output, 2000)},
                message_index=chosen_by,
                error=error,
            )
        )
    return finished


async def run_episode(
    sandbox: AsyncSandbox,
    task: ClawTask,
    model: ModelConfig,
    *,
    config: HarnessConfig | None = None,
    attempt: int = 0,
    chat_factory: Callable[[ModelConfig, Mapping[str, str]], ChatClient] | None = None,
) -> Trajectory:
    """Run one episode of ``task`` in an already seeded ``sandbox`` (see the module doc).

    Never raises for what happens inside the episode: a model or sandbox failure ends it
    with ``exit_status`` ``error: ...`` and the trajectory so far. ``reward`` is left for
    the runner's checker.
    """
    config = config or HarnessConfig()
    headers = {INSTANCE_ID_HEADER: task.id}
    make_chat = chat_factory or (lambda m, h: ChatClient(m, headers=h))
    tools = _Tools(sandbox, task, config)
    specs = tool_specs(task)
    state = _Episode()
    state.messages += [
        {"role": "system", "content": system_prompt(task, config)},
        {"role": "user", "content": task.instruction},
    ]
    started_at, t0 = time.time(), time.monotonic()
    exit_status, error = "", None
    try:
        async with asyncio.timeout(config.max_time_s), make_chat(model, headers) as chat:
            format_errors = 0
            while True:
                if state.calls >= config.max_steps:
                    exit_status = STEP_LIMIT
                    break
                result = await chat.complete(state.messages, specs)
                state.calls += 1
                state.prompt_tokens += result.prompt_tokens
                state.completion_tokens += result.completion_tokens
                state.cost += result.cost
                state.messages.append(result.message)
                calls = result.message.get("tool_calls") or []
                if not calls:
                    text = str(result.message.get("content") or "").strip()
                    if text:  # a plain answer ends the episode, as in most assistant harnesses
                        state.answer, exit_status = text, SUBMITTED
                        break
                    format_errors += 1
                    if format_errors >= config.max_format_errors:
                        exit_status = FORMAT_ERROR
                        break
                    state.messages.append(
                        {"role": "user", "content": "Use a tool, or call `finish` when done."}
                    )
                    continue
                format_errors = 0
                chosen_by = len(state.messages) - 1
                if await _act(tools, state, calls, chosen_by, config.max_observation_chars):
                    exit_status = SUBMITTED
                    break
    except TimeoutError:
        exit_status = TIME_LIMIT
    except Exception as exc:
        exit_status, error = error_status(exc), f"{type(exc).__name__}: {exc}"
    metadata = TrajectoryMetadata(
        task_id=task.id,
        recipe="claw",
        harness=HARNESS_NAME,
        model=model.model,
        attempt=attempt,
        exit_status=exit_status,
        steps=state.calls,
        prompt_tokens=state.prompt_tokens,
        completion_tokens=state.completion_tokens,
        cost=state.cost,
        started_at=started_at,
        finished_at=time.time(),
        duration_s=time.monotonic() - t0,
        final_output=state.answer,
        error=error,
        extra={"instruction": task.instruction, "harness_config": attrs.asdict(config)},
    )
    return Trajectory(metadata=metadata, messages=state.messages, tools=specs, steps=state.steps)
