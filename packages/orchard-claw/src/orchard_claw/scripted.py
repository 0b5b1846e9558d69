"""Scripted models for the demo and the tests: policies that drive any harness.

:func:`reference_responder` is an OpenAI-compatible "model" (a responder of
:class:`orchard_env_client.testing.ScriptedModelServer`) that solves a task by running its
reference solution through whatever shell-like tool the harness offers (ours: ``shell``;
openclaw: ``exec``; codex and opencode: their own), then answers in plain text. The same
policy under every harness is what makes a cross-harness table meaningful: the harness is
the only thing that changes.

``flaky`` makes it a weaker policy, deterministically: for the tasks it picks (by a hash of
the task id and the seed), every second episode it starts answers at once without acting,
so pass@k and pass^k part ways the same way under every harness, whatever the order in
which trials run.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence

from orchard_env_client.llm import INSTANCE_ID_HEADER
from orchard_env_client.recording_proxy import RUN_ID_HEADER
from orchard_env_client.testing import ChatRequest, ReplyLike, message_text, shell_call

from .tasks import ClawTask

__all__ = ["reference_responder"]

DONE_TEXT = "Done: the task is complete."
GAVE_UP_TEXT = "I could not finish this task."


def _first_user_text(request: ChatRequest) -> str:
    return " ".join(message_text(m) for m in request.messages if m.get("role") == "user")


def _picked(task_id: str, seed: int) -> bool:
    digest = hashlib.sha256(f"{seed}:{task_id}".encode()).digest()
    return digest[0] % 2 == 0


class _Policy:
    def __init__(self, tasks: Sequence[ClawTask], flaky: bool, seed: int) -> None:
        # Longest instruction first: one instruction may contain another.
        self.tasks = sorted(tasks, key=lambda t: len(t.instruction), reverse=True)
        self.flaky, self.seed = flaky, seed
        self.episodes: dict[str, int] = {}
        self.lock = threading.Lock()

    def task_for(self, request: ChatRequest) -> ClawTask | None:
        """The task by the request's instance id (our harness) or run id (a foreign harness
        through the recording proxy: ``<task id>-<attempt>-<hex>``), else by the instruction
        (tasks of one template share it)."""
        by_id = {t.id: t for t in self.tasks}
        instance = request.headers.get(INSTANCE_ID_HEADER.lower())
        run = request.headers.get(RUN_ID_HEADER.lower())
        if instance in by_id:
            return by_id[instance]
        if run is not None and run.rsplit("-", 2)[0] in by_id:
            return by_id[run.rsplit("-", 2)[0]]
        text = _first_user_text(request)
        return next((t for t in self.tasks if t.instruction.strip() in text), None)

    def __call__(self, request: ChatRequest) -> ReplyLike:
        if not request.tools:  # a side call (opencode's session title): no way to act
            return "Assistant task"
        task = self.task_for(request)
        if task is None:
            return GAVE_UP_TEXT
        if request.step == 0:
            with self.lock:
                seen = self.episodes.get(task.id, 0)
                self.episodes[task.id] = seen + 1
            if self.flaky and _picked(task.id, self.seed) and seen % 2 == 1:
                return GAVE_UP_TEXT
            return shell_call(request, task.reference)
        return DONE_TEXT


def reference_responder(
    tasks: Sequence[ClawTask], *, flaky: bool = False, seed: int = 0
) -> _Policy:
    """A responder that runs each task's reference solution, then says it is done (see the
    module doc); the task is found by its instruction in the conversation."""
    return _Policy(tasks, flaky, seed)
