"""What every foreign-harness adapter is made of: a run's inputs, the invocation it becomes
and the result parsed from the harness's output. Pure data and functions, no I/O."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs

from orchard_env_client.trajectory import SUBMITTED, TIME_LIMIT, error_status

__all__ = [
    "API_KEY_ENV",
    "DEFAULT_HOME",
    "DEFAULT_TIMEOUT_S",
    "DUMMY_API_KEY",
    "HARNESS_PATH",
    "KILL_GRACE_S",
    "TIMEOUT_EXIT_CODES",
    "ForeignHarness",
    "ForeignResult",
    "HarnessRun",
    "Invocation",
    "as_dict",
    "base_env",
    "exit_status_of",
    "json_lines",
    "with_time_limit",
]

HARNESS_PATH = "/opt/harnesses/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""``PATH`` inside the sandbox: the harness image keeps node and the harnesses in
``/opt/harnesses/bin`` (also linked from ``/usr/local/bin``)."""
API_KEY_ENV = "ORCHARD_MODEL_API_KEY"
"""The environment variable the harness reads its API key from (where it can)."""
DUMMY_API_KEY = "sk-orchard-sandbox"
"""The key a harness sends: the model endpoint seen from the sandbox is the recording proxy
behind a service bridge, which holds the real key; nothing secret enters the sandbox."""
DEFAULT_HOME = "/tmp/orchard-harness"
DEFAULT_TIMEOUT_S = 600.0
KILL_GRACE_S = 10
"""Seconds between ``timeout``'s TERM and its KILL."""
TIMEOUT_EXIT_CODES = frozenset({124, 137})
"""Exit codes of coreutils ``timeout`` (TERM, then KILL after the grace)."""


@attrs.frozen(kw_only=True)
class HarnessRun:
    """One run of a harness: which model, where it is, what to do and where."""

    model: str
    """The model name the harness asks for (the proxy's upstream model)."""
    base_url: str
    """The OpenAI-compatible base URL *inside the sandbox*, ending in ``/v1``, e.g.
    ``http://127.0.0.1:4000/r/<run>/v1`` (a service bridge to the recording proxy)."""
    task: str
    """The instruction, passed to the harness as its one user message."""
    workdir: str = "/workspace"
    home: str = DEFAULT_HOME
    """A scratch directory for the harness's own state (``HOME``, config, session db). It
    lies outside ``workdir``, so the task's workspace only holds what the agent did."""
    api_key: str = DUMMY_API_KEY
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Time limit of the whole run (the harness is killed after it)."""


@attrs.frozen(kw_only=True)
class Invocation:
    """How to run a harness in a sandbox: write ``files``, then run ``argv`` in ``cwd`` with
    ``env`` and ``stdin`` (``None``: /dev/null, the Orchard agent's default; a harness that
    is not given stdin may wait on it). ``argv`` is already bounded by ``timeout_s``
    (coreutils ``timeout``); give the exec call a few seconds more (:attr:`exec_timeout_s`)."""

    files: Mapping[str, str]
    """Absolute path in the sandbox → text content (configs, the task file)."""
    argv: list[str]
    env: Mapping[str, str]
    cwd: str
    timeout_s: float
    stdin: str | None = None
    """Text for the harness's stdin (opencode reads its task there, verbatim)."""

    @property
    def exec_timeout_s(self) -> float:
        """The server-side timeout for the exec call: the time limit plus the kill grace."""
        return self.timeout_s + KILL_GRACE_S + 20


@attrs.frozen(kw_only=True)
class ForeignResult:
    """What a harness run came to, as far as its own output tells."""

    final_text: str
    """The agent's last answer (empty when it gave none)."""
    exit_status: str
    """``submitted`` (the harness finished its turn), ``time_limit`` or ``error: ...``
    (see :mod:`orchard_env_client.trajectory`)."""
    exit_code: int | None
    turns: int | None = None
    """Model calls, when the harness reports them (codex does not)."""
    tool_calls: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    events: list[dict[str, Any]] = attrs.field(factory=list, repr=False)
    """The parsed JSON events (or the one JSON envelope) of the harness's stdout."""


Builder = Callable[[HarnessRun], Invocation]
Parser = Callable[[str, int | None], ForeignResult]


@attrs.frozen(kw_only=True)
class ForeignHarness:
    """A third-party agent CLI run inside the sandbox: how to invoke it and read its output."""

    name: str
    binary: str
    """The executable in the harness image (on ``PATH``)."""
    api: str
    """The model API it speaks: ``chat`` (streaming chat completions) or ``responses``."""
    shell_tools: tuple[str, ...]
    """Its shell-like tool names (for scripting a model for it)."""
    build: Builder
    parse: Parser

    def invocation(self, run: HarnessRun) -> Invocation:
        """The files, argv and env for ``run``."""
        return self.build(run)


def base_env(run: HarnessRun) -> dict[str, str]:
    """Environment common to all harnesses: scratch ``HOME`` and XDG dirs, ``PATH``, the
    dummy key, no colour, no terminal."""
    return {
        "HOME": run.home,
        "XDG_CONFIG_HOME": f"{run.home}/.config",
        "XDG_CACHE_HOME": f"{run.home}/.cache",
        "XDG_DATA_HOME": f"{run.home}/.local/share",
        "XDG_STATE_HOME": f"{run.home}/.local/state",
        "PATH": HARNESS_PATH,
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "CI": "1",
        API_KEY_ENV: run.api_key,
    }


def with_time_limit(argv: list[str], timeout_s: float) -> list[str]:
    """``argv`` under coreutils ``timeout``: TERM at the limit, KILL after the grace."""
    return ["timeout", f"--kill-after={KILL_GRACE_S}", f"{max(1, round(timeout_s))}", *argv]


def as_dict(value: object) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one (for reading untrusted output)."""
    return value if isinstance(value, dict) else {}


def json_lines(text: str) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSON-lines stream; other lines (logs, banners) are skipped."""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                yield obj


def exit_status_of(exit_code: int | None, error: str | None) -> str:
    """The episode status from the process's exit code and the error its output showed."""
    if exit_code in TIMEOUT_EXIT_CODES:
        return TIME_LIMIT
    if error:
        return error_status(error)
    if exit_code not in (0, None):
        return error_status(f"exit code {exit_code}")
    return SUBMITTED
