"""Personal-assistant tasks: schema, built-in set, templates, and running them in a sandbox.

- ``load_tasks(spec)``: ``"builtin"``, ``"builtin:<kind>"``, ``"gen:<template|kind|all>:<n>
  [:seed=N]"``, a ``.json``/``.jsonl`` file or a task directory -> ``list[ClawTask]``.
- ``generate(template, seed)``: a fresh task from a template (``template_names()``).
- In a sandbox (all async, on ``AsyncSandbox``): ``prepare`` (= ``seed_workspace`` +
  ``start_service``), ``run_reference``, ``check`` -> ``CheckResult``.
- Checkers are registered by name (``register_checker``) and read a ``FinalState``.

The file layout inside ``/workspace`` is described in ``docs/claw-tasks.md``.
"""

from orchard_claw.tasks.checkers import (
    CHECKERS,
    Checks,
    FinalState,
    get_checker,
    register_checker,
)
from orchard_claw.tasks.generate import generate, generate_many, template_names
from orchard_claw.tasks.loaders import builtin_tasks, load_tasks, read_task_dir, save_tasks
from orchard_claw.tasks.sandbox import (
    SERVICE_DIR,
    check,
    prepare,
    reset_workspace,
    run_reference,
    seed_workspace,
    snapshot,
    start_service,
    stop_service,
)
from orchard_claw.tasks.schema import KINDS, WORKSPACE, CheckResult, ClawTask, Service, TaskError

__all__ = [
    "CHECKERS",
    "KINDS",
    "SERVICE_DIR",
    "WORKSPACE",
    "CheckResult",
    "Checks",
    "ClawTask",
    "FinalState",
    "Service",
    "TaskError",
    "builtin_tasks",
    "check",
    "generate",
    "generate_many",
    "get_checker",
    "load_tasks",
    "prepare",
    "read_task_dir",
    "register_checker",
    "reset_workspace",
    "run_reference",
    "save_tasks",
    "seed_workspace",
    "snapshot",
    "start_service",
    "stop_service",
    "template_names",
]
