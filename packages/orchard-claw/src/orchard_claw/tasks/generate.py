"""``generate(template, seed)``: a fresh task from a template, deterministic in the seed."""

from __future__ import annotations

import random

from orchard_claw.tasks.schema import ClawTask, TaskError
from orchard_claw.tasks.templates import TEMPLATES

__all__ = ["generate", "generate_many", "template_names"]


def template_names(kind: str | None = None) -> list[str]:
    """The registered templates' names (of one ``kind``, if given), sorted."""
    return sorted(n for n, t in TEMPLATES.items() if kind is None or t.kind == kind)


def generate(template: str, seed: int, *, task_id: str | None = None) -> ClawTask:
    """The task ``template`` makes from ``seed`` (same seed, same task, on any machine).

    Its id is ``gen-<template>-<seed>`` unless ``task_id`` is given; ``meta`` records the
    template and seed.
    """
    try:
        tpl = TEMPLATES[template]
    except KeyError:
        raise TaskError(f"no template {template!r}; known: {template_names()}") from None
    rng = random.Random(f"{template}:{seed}")
    task = tpl.make(rng, task_id or f"gen-{template}-{seed}")
    task.meta = {"template": template, "seed": seed}
    return task


def generate_many(what: str, count: int, seed: int = 0) -> list[ClawTask]:
    """``count`` tasks from ``what`` (a template name, a kind, or ``all``), cycling through
    its templates, with seeds ``seed``, ``seed + 1``, ..."""
    if what in TEMPLATES:
        names = [what]
    else:
        names = template_names(None if what == "all" else what)
        if not names:
            raise TaskError(f"{what!r} is neither a template, a kind nor 'all'")
    if count < 1:
        raise TaskError(f"count must be at least 1, not {count}")
    return [generate(names[i % len(names)], seed + i) for i in range(count)]
