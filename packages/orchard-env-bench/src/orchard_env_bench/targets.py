"""Figures beside their baselines and targets, so one run judges a change (issue 21).

A *figure* is one measured number with what it is compared to: a ``baseline`` measured in
the same run where one exists (a bare ``bwrap``, ``docker run``, ``bash -c``), else the
number the issue started from (named in ``baseline_name``), the ``ratio`` of the two and
the ``target`` with its sense (``max``: at most, ``min``: at least); ``met`` is None where
the target is not a number (e.g. "flat"). Benches add a ``figures`` list of them to their
JSON and print it as one table.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

# What the issue measured "today" (docs/performance.md, 2026-12-03, 1,000 x 10 local):
# the whole run at 141 commands/s, creates 24.6 s p99 all at once, deleting 13.8 s.
ISSUE21_WHOLE_RUN_COMMANDS_PER_S = 141.0
ISSUE21_CREATE_P99_MS = 24_600.0
ISSUE21_DELETE_WALL_S = 13.8
ISSUE21_SOURCE = "issue 21's start (2026-12-03 run)"
# The same run's `bash -c true` spawn p50 (bench latency's baseline): a yardstick of how
# fast the machine was then; benches without a same-run baseline time it again.
ISSUE21_SPAWN_P50_MS = 1.61


def spawn_reference(runs: int = 100) -> float:
    """p50 ms of ``subprocess.run(["bash", "-c", "true"])`` now (after one warm-up)."""
    import subprocess
    import time

    subprocess.run(["bash", "-c", "true"], check=False)
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(["bash", "-c", "true"], check=False)
        samples.append(time.perf_counter() - started)
    return sorted(samples)[len(samples) // 2] * 1000


def figure(
    name: str,
    measured: float | None,
    unit: str,
    *,
    baseline: float | None = None,
    baseline_name: str = "",
    target: float | None = None,
    sense: str = "max",
    target_text: str | None = None,
) -> dict[str, Any]:
    """One figure; ``ratio`` is measured / baseline, ``met`` compares measured to target."""
    ratio = measured / baseline if measured is not None and baseline else None
    met: bool | None = None
    if target is not None and measured is not None:
        met = measured <= target if sense == "max" else measured >= target
    if target_text is None and target is not None:
        target_text = f"{'≤' if sense == 'max' else '≥'} {target:g} {unit}"
    return {
        "name": name,
        "measured": measured,
        "unit": unit,
        "baseline": baseline,
        "baseline_name": baseline_name,
        "ratio": ratio,
        "target": target,
        "target_sense": sense,
        "target_text": target_text or "",
        "met": met,
    }


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if not unit and float(value).is_integer():
        return str(int(value))
    digits = 0 if abs(value) >= 100 else 2 if abs(value) < 10 else 1
    return f"{value:.{digits}f} {unit}"


def print_figures(figures: list[dict[str, Any]], out: Console | None = None) -> None:
    """The figures as one table: measured, baseline, ratio, target, met."""
    if not figures:
        return
    out = out or Console()
    table = Table(title="issue 21: figures beside their baselines and targets")
    for col in ("figure", "measured", "baseline", "ratio", "target", "met"):
        table.add_column(col, justify="left" if col in ("figure", "target") else "right")
    for f in figures:
        baseline = _number(f["baseline"], f["unit"])
        if f["baseline_name"]:
            baseline += f" ({f['baseline_name']})"
        met = {True: "[green]yes[/green]", False: "[red]no[/red]", None: "—"}[f["met"]]
        ratio = f"{f['ratio']:.2f}x" if f["ratio"] is not None else "—"
        table.add_row(
            f["name"], _number(f["measured"], f["unit"]), baseline, ratio, f["target_text"], met
        )
    out.print(table)
