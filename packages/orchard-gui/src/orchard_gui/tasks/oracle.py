"""A scripted policy for the offline tasks (tests, demos, a scripted chat endpoint).

``oracle_action`` sees only what a model would: the instruction, the current URL, the
numbered marks (role, name, box) and the actions done so far; it never reads the page. A
task's plan is a list of abstract steps (``click`` a mark by role and name, ``type`` text,
``keys``, ``answer_from_mark``, ``done``); the next step is ``plan[len(history)]``, resolved
against the current marks into an action of the wire form (coordinates = the mark's centre).
Local-site plans come with the task (``extra["plan"]``); MiniWoB++ plans are parsed from the
instruction (the page's utterance).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from orchard_gui.browser import Mark
from orchard_gui.tasks.schema import TaskError, WebTask

__all__ = ["OracleError", "oracle_action", "oracle_plan"]


class OracleError(TaskError):
    """The oracle cannot act: no plan for the task, or the mark it needs is not on screen."""


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def _miniwob_plan(name: str, instruction: str) -> list[dict[str, Any]]:
    def need(pattern: str) -> re.Match[str]:
        match = re.fullmatch(pattern, instruction.strip())
        if match is None:
            raise OracleError(f"oracle: cannot parse the {name} instruction {instruction!r}")
        return match

    submit = {"op": "click", "role": "button", "name": "Submit"}
    if name == "click-button":
        label = need(r'Click on the "(.+)" button\.').group(1)
        return [{"op": "click", "role": "button", "name": label}]
    if name == "click-checkboxes":
        listed = need(r"Select (.*) and click Submit\.").group(1)
        names = [] if listed == "nothing" else [n.strip() for n in listed.split(",")]
        return [{"op": "click", "role": "checkbox", "name": n} for n in names] + [submit]
    if name == "click-dialog":
        need(r'Close the dialog box by clicking the "x"\.')
        return [{"op": "click", "role": "button", "name": "Close"}]
    if name == "click-tab":
        number = need(r"Click on Tab #(\d+)\.").group(1)
        return [{"op": "click", "role": "tab", "name": f"Tab #{number}"}]
    if name == "enter-text":
        text = need(r'Enter "(.+)" into the text field and press Submit\.').group(1)
        return [
            {"op": "click", "role": "textbox", "nth": 0},
            {"op": "type", "text": text},
            submit,
        ]
    if name == "focus-text":
        need(r"Focus into the textbox\.")
        return [{"op": "click", "role": "textbox", "nth": 0}]
    if name == "login-user":
        match = need(
            r'Enter the username "(.+)" and the password "(.+)" into the text fields and press login\.'
        )
        return [
            {"op": "click", "role": "textbox", "nth": 0},
            {"op": "type", "text": match.group(1)},
            {"op": "click", "role": "textbox", "nth": 1},
            {"op": "type", "text": match.group(2)},
            {"op": "click", "role": "button", "name": "Login"},
        ]
    raise OracleError(f"oracle: no scripted plan for MiniWoB++ task {name!r}")


def oracle_plan(task: WebTask, instruction: str) -> list[dict[str, Any]]:
    """The abstract steps that solve ``task`` (ending with ``done`` or an answer)."""
    if task.source == "local":
        plan = task.extra.get("plan")
        if not isinstance(plan, list) or not plan:
            raise OracleError(f"oracle: local task {task.task_id} has no plan")
        return list(plan)
    if task.source == "miniwob":
        steps = _miniwob_plan(str(task.extra.get("miniwob_task", "")), instruction)
        return [*steps, {"op": "done"}]
    raise OracleError(f"oracle: no scripted plan for {task.source} task {task.task_id}")


def _find(marks: Sequence[Mark], step: Mapping[str, Any]) -> Mark:
    role = step.get("role")
    if "nth" in step:  # by position among the marks of a role (unnamed MiniWoB inputs)
        same = sorted((m for m in marks if m.role == role), key=lambda m: (m.y, m.x))
        if len(same) > int(step["nth"]):
            return same[int(step["nth"])]
    else:
        wanted = _norm(str(step["name"]))
        named = [m for m in marks if _norm(m.name) == wanted]
        exact = [m for m in named if m.role == role]
        if exact or named:
            return (exact or named)[0]
    seen = "; ".join(f"[{m.id}] {m.role} {m.name!r}" for m in marks) or "no marks"
    raise OracleError(f"oracle: no mark for {dict(step)} among: {seen}")


def oracle_action(
    task: WebTask,
    instruction: str,
    observation_url: str,
    marks: Sequence[Mark] | None,
    history: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """The next action (wire form) of the scripted solution of an offline task.

    ``history`` is the actions done so far (their count is the position in the plan);
    ``observation_url`` is not needed by the current plans and is accepted for policies
    that check where they are. Raises ``OracleError`` when a needed mark is missing.
    """
    del observation_url
    plan = oracle_plan(task, instruction)
    index = len(history)
    step = plan[index] if index < len(plan) else {"op": "done"}
    op = step["op"]
    marks = list(marks or [])
    if op == "click":
        x, y = _find(marks, step).center
        return {"action": "click", "x": round(x, 1), "y": round(y, 1)}
    if op == "type":
        action: dict[str, Any] = {"action": "type", "text": str(step["text"])}
        if step.get("submit"):
            action["submit"] = True
        return action
    if op == "keys":
        return {"action": "press_keys", "keys": list(step["keys"])}
    if op == "answer_from_mark":
        prefix = _norm(str(step["prefix"])) + " "
        for mark in marks:
            if _norm(mark.name).startswith(prefix):
                return {"action": "done", "answer": mark.name.strip()[len(prefix) :].strip()}
        seen = "; ".join(f"[{m.id}] {m.name!r}" for m in marks) or "no marks"
        raise OracleError(f"oracle: no mark starting {step['prefix']!r} among: {seen}")
    if op == "done":
        return {"action": "done"}
    raise OracleError(f"oracle: unknown plan step {dict(step)}")
