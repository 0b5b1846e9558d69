"""The OpenHands terminal tool's executor, running commands in an Orchard sandbox.

OpenHands' own executor drives a tmux (or subprocess) shell on the local machine. This one
runs each command with the sandbox's ``exec`` (``bash``, stderr merged into stdout) and
keeps what a persistent shell would keep between commands: the working directory and the
exported environment variables, saved by an ``EXIT`` trap to a state file in the sandbox
and restored before the next command. Not kept: shell functions, aliases, unexported
variables and background jobs. Every command runs to its end or its timeout (then it is
killed); there is no process left running to send input to, so ``is_input`` actions are
answered with an error. Output is cut in the middle to ``max_output_chars``.
"""

from __future__ import annotations

import shlex
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from openhands.sdk.tool import ToolExecutor
from openhands.tools.terminal.constants import MAX_CMD_OUTPUT_SIZE
from openhands.tools.terminal.definition import (
    TerminalAction,
    TerminalObservation,
    looks_like_python_literal_argument,
)
from openhands.tools.terminal.metadata import CmdOutputMetadata

from orchard_env_client import AsyncSandbox, OrchardError
from orchard_swe.harness import truncate_middle
from orchard_swe.harness.tools import MAX_BASH_TIMEOUT_S, SHELL_ENV

from .bridge import LoopBridge

if TYPE_CHECKING:
    from openhands.sdk.conversation import LocalConversation

__all__ = ["DEFAULT_COMMAND_TIMEOUT_S", "SandboxTerminalExecutor"]

DEFAULT_COMMAND_TIMEOUT_S: Final = 180.0
"""Timeout of a command that sets none (OpenHands' soft 30 s no-output timeout has no
equivalent here: a command cannot be resumed, so it gets a hard timeout instead)."""

RESET_TEXT: Final = (
    "Terminal session has been reset. All previous environment variables and session "
    "state have been cleared."
)
NO_PROCESS_TEXT: Final = (
    "There is no running process to interact with: in this sandbox every command runs to "
    "completion (or until its timeout, when it is killed). Run a new command instead."
)
_BRIDGE_MARGIN_S: Final = 60.0


class SandboxTerminalExecutor(ToolExecutor[TerminalAction, TerminalObservation]):
    """``terminal`` actions as ``sandbox.exec`` calls (see the module doc)."""

    def __init__(
        self,
        sandbox: AsyncSandbox,
        bridge: LoopBridge,
        repo_dir: str,
        *,
        default_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S,
        max_output_chars: int = MAX_CMD_OUTPUT_SIZE,
        env: Mapping[str, str] = SHELL_ENV,
        deadline: float | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.bridge = bridge
        self.repo_dir = repo_dir
        self.default_timeout_s = default_timeout_s
        self.max_output_chars = max_output_chars
        self.env = dict(env)
        self.deadline = deadline
        """``time.monotonic()`` after which commands are cut off (None: no deadline)."""
        self.working_dir = repo_dir
        """The working directory after the last command (as its ``EXIT`` trap saw it)."""
        nonce = uuid.uuid4().hex
        self.state_file = f"/tmp/.orchard-openhands-{nonce}.sh"
        """Where the ``EXIT`` trap saves the working directory and exported variables."""
        self._marker = f"__ORCHARD_OPENHANDS_CWD_{nonce}__"

    def script(self, command: str) -> str:
        """The bash script that runs ``command`` with the saved state, then saves it."""
        state = shlex.quote(self.state_file)
        save = (
            f'__orchard_rc=$?; {{ export -p; printf "cd -- %q\\n" "$PWD"; }} > {state} '
            f'2>/dev/null; printf "\\n%s%s\\n" {shlex.quote(self._marker)} "$PWD"; '
            "exit $__orchard_rc"
        )
        return (
            "exec 2>&1\n"
            f"cd -- {shlex.quote(self.repo_dir)} 2>/dev/null\n"
            f"[ -f {state} ] && . {state} >/dev/null 2>&1\n"
            f"trap {shlex.quote(save)} EXIT\n"
            f"{command}\n"
        )

    def _timeout(self, requested: float | None) -> float:
        timeout = self.default_timeout_s if not requested else float(requested)
        timeout = min(timeout, MAX_BASH_TIMEOUT_S)
        if self.deadline is not None:
            timeout = max(1.0, min(timeout, self.deadline - time.monotonic()))
        return timeout

    def _split_marker(self, output: str) -> tuple[str, str | None]:
        """The command's own output, and the working directory its trap printed."""
        at = output.rfind("\n" + self._marker)
        if at < 0:
            return output, None
        cwd = output[at + 1 + len(self._marker) :].strip("\n") or None
        return output[:at], cwd

    def reset(self) -> None:
        """Forget the saved working directory and environment."""
        self.working_dir = self.repo_dir
        self.bridge.run(self.sandbox.exec(["rm", "-f", self.state_file], timeout=60), 120)

    def run_command(self, command: str, timeout: float | None = None) -> TerminalObservation:
        """Run one shell command in the sandbox; the observation the model will see."""
        limit = self._timeout(timeout)
        job = self.bridge.run(
            self.sandbox.exec(self.script(command), timeout=limit, env=self.env),
            limit + _BRIDGE_MARGIN_S,
        )
        output, cwd = self._split_marker(job.stdout + job.stderr)
        if cwd:
            self.working_dir = cwd
        notes = []
        if job.stdout_truncated or job.stderr_truncated:
            notes.append("[The sandbox capped this output; only its beginning was kept.]")
        if job.timed_out:
            notes.append(
                f"[The command timed out after {limit:g} seconds and was killed. Use the "
                "timeout parameter for commands that need longer, and avoid interactive "
                "programs.]"
            )
        elif job.exit_code is None:
            notes.append(f"[The command could not run: {job.error or job.status}]")
        text = truncate_middle(output, self.max_output_chars)
        exit_code = -1 if job.exit_code is None else job.exit_code
        metadata = CmdOutputMetadata(
            exit_code=exit_code,
            working_dir=self.working_dir,
            suffix=("\n" + "\n".join(notes)) if notes else "",
        )
        return TerminalObservation.from_text(
            text=text,
            command=command,
            exit_code=exit_code,
            timeout=job.timed_out,
            metadata=metadata,
        )

    def __call__(
        self, action: TerminalAction, conversation: LocalConversation | None = None
    ) -> TerminalObservation:
        """Execute one ``terminal`` action."""
        del conversation  # secrets are not injected: the sandbox gets none
        if action.is_input:
            return TerminalObservation.from_text(
                text=NO_PROCESS_TEXT, command=action.command, is_error=True, exit_code=-1
            )
        literal = looks_like_python_literal_argument(action.command)
        if literal is not None:
            return TerminalObservation.from_text(
                text=(
                    f"[Tool-argument error] The `command` argument looks like a Python/JSON "
                    f"{literal}, not a shell command. Write a script to a file and run it."
                ),
                command=action.command,
                is_error=True,
                exit_code=-1,
            )
        try:
            if action.reset:
                self.reset()
                if not action.command.strip():
                    return TerminalObservation.from_text(
                        text=RESET_TEXT, command="[RESET]", exit_code=0
                    )
            if not action.command.strip():
                return TerminalObservation.from_text(
                    text=f"No command was given. {NO_PROCESS_TEXT}",
                    command="",
                    is_error=True,
                    exit_code=-1,
                )
            observation = self.run_command(action.command, action.timeout)
        except (OrchardError, TimeoutError) as exc:
            return TerminalObservation.from_text(
                text=f"The sandbox could not run the command: {type(exc).__name__}: {exc}",
                command=action.command,
                is_error=True,
                exit_code=-1,
            )
        if action.reset:
            return observation.model_copy(update={"command": f"[RESET] {action.command}"})
        return observation
