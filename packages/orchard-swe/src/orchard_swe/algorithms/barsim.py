"""``orchard-swe bar-sim``: BAR against fixed-n GRPO and DAPO-style dynamic sampling.

A seeded simulation. Tasks have pass rates drawn from ``Beta(alpha, beta)``; a rollout's
latency is lognormal (median ``latency_median``, shape ``latency_sigma``), capped at
``timeout`` (then ``time_exceeded``, reward 0); a rollout is ``aborted`` with probability
``p_aborted`` (after a uniform fraction of its latency) and ``truncated`` with probability
``p_truncated`` (reward 0); otherwise it is ``completed`` with reward ``Bernoulli(pass
rate)``. Rollouts run on ``workers`` slots, first come first served. Training is
synchronous: a step starts when the previous one's rollouts are all done.

Every method reads the same prompt stream and, for the ``i``-th rollout of a prompt, the
same draw (common random numbers), so differences come from the allocation alone.

- ``grpo``: ``batch`` prompts per step, ``n`` rollouts each, every group kept.
- ``dapo``: rounds of ``ceil(oversample * missing)`` prompts with ``n`` rollouts each; groups
  whose rewards are all equal are dropped; rounds repeat until ``batch`` groups are kept
  (surplus valid groups are discarded) or ``dapo_max_rounds`` rounds were run.
- ``bar``: ``batch`` prompts per step, each run by :func:`~.bar.decide` stride by stride
  (prompts concurrently), with :class:`~.bar.DropUniform`, by the public reference's rules;
  ``bar-orchard`` the same by our own allocator's (``BarConfig.profile``).

Metrics: rollouts spent per useful group (a group with a non-zero advantage that reaches the
trainer), the share of formed groups with zero advantage (all rewards equal), and the
simulated wall time.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from .bar import BarConfig, DropUniform, GenerateMore, Profile, Sample, Status, decide, select

__all__ = [
    "METHODS",
    "Cluster",
    "Draw",
    "MethodResult",
    "PromptStream",
    "SimConfig",
    "plot_results",
    "results_table",
    "run_sim",
]

METHODS = ("grpo", "dapo", "bar", "bar-orchard")


@attrs.frozen(kw_only=True)
class SimConfig:
    """The simulation's parameters (defaults: a sparse-reward SWE-like setting)."""

    seed: int = 0
    tasks: int = 500
    alpha: float = 0.5
    beta: float = 1.5
    steps: int = 25
    batch: int = 32
    n: int = 8
    n_max: int = 32
    stride: int = 8
    p_min: float = 0.25
    p_max: float = 0.75
    workers: int = 256
    latency_median: float = 90.0
    latency_sigma: float = 0.5
    timeout: float = 600.0
    p_truncated: float = 0.05
    p_aborted: float = 0.01
    dapo_oversample: float = 1.5
    dapo_max_rounds: int = 8

    def __attrs_post_init__(self) -> None:
        if min(self.tasks, self.steps, self.batch, self.workers, self.dapo_max_rounds) < 1:
            raise ValueError("tasks, steps, batch, workers and dapo_max_rounds must be >= 1")
        if self.alpha <= 0 or self.beta <= 0 or self.latency_median <= 0 or self.timeout <= 0:
            raise ValueError("alpha, beta, latency_median and timeout must be > 0")
        if self.p_truncated < 0 or self.p_aborted < 0 or self.p_truncated + self.p_aborted > 1:
            raise ValueError("p_truncated and p_aborted must be >= 0 with a sum <= 1")
        if self.dapo_oversample < 1:
            raise ValueError("dapo_oversample must be >= 1")
        self.bar_config("orchard")  # validates n, n_max, stride, p_min, p_max for both

    def bar_config(self, profile: Profile = "reference") -> BarConfig:
        """BAR's config for this simulation, by the rules of ``profile``."""
        return BarConfig(
            n=self.n,
            n_max=self.n_max,
            stride=self.stride,
            p_min=self.p_min,
            p_max=self.p_max,
            profile=profile,
        )


@attrs.frozen
class Draw:
    """One simulated rollout: how long it runs, and the sample it yields."""

    latency: float
    sample: Sample


class PromptStream:
    """Prompt ``s`` → a task (its pass rate) and a fixed sequence of rollout draws.

    Task pass rates come from ``Random(seed)``; prompt ``s`` is task ``order[s % tasks]``
    (a seeded shuffle, repeated); the ``i``-th rollout of prompt ``s`` is the ``i``-th draw of
    a generator seeded by ``(seed, s)``, whichever method asks for it.
    """

    def __init__(self, cfg: SimConfig) -> None:
        self._cfg = cfg
        rng = random.Random(cfg.seed)
        self.rates = [rng.betavariate(cfg.alpha, cfg.beta) for _ in range(cfg.tasks)]
        self._order = list(range(cfg.tasks))
        rng.shuffle(self._order)
        self._draws: dict[int, tuple[random.Random, list[Draw]]] = {}

    def rate(self, s: int) -> float:
        """The pass rate of prompt ``s``'s task."""
        return self.rates[self._order[s % len(self._order)]]

    def draw(self, s: int, i: int) -> Draw:
        """The ``i``-th rollout of prompt ``s``."""
        if s not in self._draws:
            self._draws[s] = (random.Random(self._cfg.seed * 1_000_003 + s), [])
        rng, draws = self._draws[s]
        while len(draws) <= i:
            draws.append(self._one(rng, self.rate(s)))
        return draws[i]

    def _one(self, rng: random.Random, rate: float) -> Draw:
        cfg = self._cfg
        latency = rng.lognormvariate(math.log(cfg.latency_median), cfg.latency_sigma)
        u, frac, r = rng.random(), rng.random(), rng.random()
        if latency >= cfg.timeout:
            return Draw(cfg.timeout, Sample(0.0, Status.TIME_EXCEEDED))
        if u < cfg.p_aborted:
            return Draw(latency * frac, Sample(0.0, Status.ABORTED))
        if u < cfg.p_aborted + cfg.p_truncated:
            return Draw(latency, Sample(0.0, Status.TRUNCATED))
        return Draw(latency, Sample(1.0 if r < rate else 0.0, Status.COMPLETED))


@attrs.define
class _Job:
    left: int
    results: list[Sample | None]
    done: Callable[[list[Sample]], None]


class Cluster:
    """``workers`` rollout slots, a FIFO queue, and a virtual clock."""

    def __init__(self, workers: int) -> None:
        self.now = 0.0
        self.samples = 0
        self._free = workers
        self._queue: deque[tuple[_Job, int, Draw]] = deque()
        self._events: list[tuple[float, int, _Job, int, Sample]] = []
        self._seq = 0

    def submit(self, draws: list[Draw], done: Callable[[list[Sample]], None]) -> None:
        """Queue ``draws`` as one job; ``done`` gets its samples, in order, when all finished."""
        job = _Job(len(draws), [None] * len(draws), done)
        self.samples += len(draws)
        self._queue.extend((job, i, d) for i, d in enumerate(draws))
        if not draws:
            done([])
        self._dispatch()

    def _dispatch(self) -> None:
        while self._free and self._queue:
            job, i, d = self._queue.popleft()
            self._free -= 1
            heapq.heappush(self._events, (self.now + d.latency, self._seq, job, i, d.sample))
            self._seq += 1

    def run(self) -> None:
        """Advance the clock until every submitted rollout (and its follow-ups) is done."""
        while self._events:
            self.now, _, job, i, sample = heapq.heappop(self._events)
            self._free += 1
            job.results[i] = sample
            job.left -= 1
            if job.left == 0:
                job.done([s for s in job.results if s is not None])
            self._dispatch()


def _uniform(group: list[Sample]) -> bool:
    return len({s.reward for s in group}) <= 1


@attrs.frozen
class MethodResult:
    """One method's totals over the simulated run."""

    method: str
    steps: int
    prompts: int
    samples: int
    groups: int
    """Groups formed (one per prompt; DAPO's dropped groups included)."""
    zero_adv_groups: int
    useful: int
    """Groups with a non-zero advantage that reached the trainer."""
    balanced: int
    """Useful groups whose positive share lies in ``[p_min, p_max]``."""
    wall_s: float
    detail: dict[str, int] = attrs.field(factory=dict)

    @property
    def samples_per_useful(self) -> float:
        """Rollouts spent per useful group."""
        return self.samples / self.useful if self.useful else math.inf

    @property
    def zero_adv_share(self) -> float:
        """Share of formed groups whose advantages are all zero."""
        return self.zero_adv_groups / self.groups if self.groups else 0.0

    @property
    def balanced_share(self) -> float:
        """Share of useful groups whose positive share lies in ``[p_min, p_max]``."""
        return self.balanced / self.useful if self.useful else 0.0

    @property
    def wall_per_useful(self) -> float:
        """Simulated seconds per useful group."""
        return self.wall_s / self.useful if self.useful else math.inf

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, derived metrics included (``None`` for an infinite ratio)."""

        def num(x: float, digits: int) -> float | None:
            return round(x, digits) if math.isfinite(x) else None

        return attrs.asdict(self) | {
            "samples_per_useful": num(self.samples_per_useful, 3),
            "zero_adv_share": num(self.zero_adv_share, 4),
            "balanced_share": num(self.balanced_share, 4),
            "wall_per_useful_s": num(self.wall_per_useful, 2),
            "useful_per_step": num(self.useful / self.steps, 3),
            "wall_s": num(self.wall_s, 1),
        }


@attrs.define
class _Tally:
    """Counts groups as they are formed and delivered."""

    bounds: tuple[float, float]
    formed: int = 0
    zero: int = 0
    useful: int = 0
    balanced: int = 0

    def formed_group(self, group: list[Sample]) -> bool:
        """Count a formed group; whether it has a non-zero advantage."""
        self.formed += 1
        self.zero += _uniform(group)
        return not _uniform(group)

    def delivered(self, group: list[Sample]) -> None:
        """Count a group that reaches the trainer."""
        if _uniform(group):
            return
        self.useful += 1
        share = sum(s.reward >= 0.5 for s in group) / len(group)
        self.balanced += self.bounds[0] - 1e-9 <= share <= self.bounds[1] + 1e-9

    def result(
        self, method: str, cfg: SimConfig, prompts: int, cluster: Cluster, **detail: int
    ) -> MethodResult:
        return MethodResult(
            method,
            cfg.steps,
            prompts,
            cluster.samples,
            self.formed,
            self.zero,
            self.useful,
            self.balanced,
            cluster.now,
            detail,
        )


def _grpo(cfg: SimConfig, stream: PromptStream) -> MethodResult:
    cluster = Cluster(cfg.workers)
    tally = _Tally((cfg.p_min, cfg.p_max))
    groups: list[list[Sample]] = []
    for step in range(cfg.steps):
        for b in range(cfg.batch):
            s = step * cfg.batch + b
            cluster.submit([stream.draw(s, i) for i in range(cfg.n)], groups.append)
        cluster.run()
    for g in groups:
        tally.formed_group(g)
        tally.delivered(g)
    return tally.result("grpo", cfg, len(groups), cluster)


def _dapo(cfg: SimConfig, stream: PromptStream) -> MethodResult:
    cluster = Cluster(cfg.workers)
    tally = _Tally((cfg.p_min, cfg.p_max))
    prompts = rounds_total = short_steps = 0
    for _ in range(cfg.steps):
        missing, rounds = cfg.batch, 0
        while missing > 0 and rounds < cfg.dapo_max_rounds:
            found: list[list[Sample]] = []
            for _ in range(math.ceil(cfg.dapo_oversample * missing)):
                cluster.submit([stream.draw(prompts, i) for i in range(cfg.n)], found.append)
                prompts += 1
            cluster.run()
            valid = [g for g in found if tally.formed_group(g)]
            for g in valid[:missing]:  # in completion order; the surplus is discarded
                tally.delivered(g)
            missing -= min(len(valid), missing)
            rounds += 1
        rounds_total += rounds
        short_steps += missing > 0
    return tally.result("dapo", cfg, prompts, cluster, rounds=rounds_total, short_steps=short_steps)


def _bar(cfg: SimConfig, stream: PromptStream, profile: Profile = "reference") -> MethodResult:
    cluster = Cluster(cfg.workers)
    tally = _Tally((cfg.p_min, cfg.p_max))
    bcfg = cfg.bar_config(profile)
    filters = (DropUniform(threshold=bcfg.positive_threshold),)
    outcomes: Counter[str] = Counter()

    def advance(s: int, samples: list[Sample], requested: int) -> None:
        decision = decide(samples, bcfg, requested=requested)
        if isinstance(decision, GenerateMore):
            draws = [stream.draw(s, requested + i) for i in range(decision.count)]
            cluster.submit(draws, lambda res: advance(s, samples + res, requested + len(draws)))
            return
        result = select(samples, decision, bcfg, filters, requested=requested)
        outcomes[result.outcome] += 1
        tally.formed_group(list(result.selected.samples))
        if result.group is not None:
            tally.delivered(list(result.group.samples))

    for step in range(cfg.steps):
        for b in range(cfg.batch):
            advance(step * cfg.batch + b, [], 0)
        cluster.run()
    counts = {k: outcomes[k] for k in ("found", "relaxed", "fallback")}
    method = "bar" if profile == "reference" else f"bar-{profile}"
    return tally.result(method, cfg, cfg.steps * cfg.batch, cluster, **counts)


def run_sim(cfg: SimConfig, methods: tuple[str, ...] = METHODS) -> list[MethodResult]:
    """Simulate each of ``methods`` (``grpo``, ``dapo``, ``bar`` by the reference's rules,
    ``bar-orchard`` by ours) on the same prompt stream."""
    runners: dict[str, Callable[[SimConfig, PromptStream], MethodResult]] = {
        "grpo": _grpo,
        "dapo": _dapo,
        "bar": _bar,
        "bar-orchard": lambda cfg, stream: _bar(cfg, stream, "orchard"),
    }
    unknown = set(methods) - set(runners)
    if unknown:
        raise ValueError(f"unknown methods: {sorted(unknown)}")
    stream = PromptStream(cfg)
    return [runners[m](cfg, stream) for m in methods]


def results_table(results: list[MethodResult]) -> Any:
    """A rich table of the results (details, such as BAR's outcomes, in the caption)."""
    from rich.table import Table

    caption = "; ".join(
        f"{r.method}: " + ", ".join(f"{k}={v}" for k, v in r.detail.items())
        for r in results
        if r.detail
    )
    table = Table(title="bar-sim", caption=caption or None)
    columns = (
        "method",
        "prompts",
        "rollouts",
        "useful",
        "rollouts/useful",
        "zero-adv",
        "balanced",
        "wall h",
        "wall/useful s",
    )
    for col in columns:
        table.add_column(col, justify="left" if col == "method" else "right")
    for r in results:
        table.add_row(
            r.method,
            str(r.prompts),
            str(r.samples),
            str(r.useful),
            f"{r.samples_per_useful:.2f}",
            f"{r.zero_adv_share:.1%}",
            f"{r.balanced_share:.1%}",
            f"{r.wall_s / 3600:.2f}",
            f"{r.wall_per_useful:.1f}",
        )
    return table


def plot_results(results: list[MethodResult], path: Path, title: str = "") -> None:
    """Save a four-panel bar chart of the results to ``path`` (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError(
            "--plot needs matplotlib: install orchard-swe[plot] (or uv sync --all-packages)"
        ) from exc
    names = [r.method for r in results]
    panels = [
        ("rollouts per useful group", [r.samples_per_useful for r in results]),
        ("zero-advantage share of groups", [r.zero_adv_share for r in results]),
        ("balanced share of useful groups", [r.balanced_share for r in results]),
        ("simulated seconds per useful group", [r.wall_per_useful for r in results]),
    ]
    colors = ["#888888", "#4c72b0", "#55a868", "#dd8452"]
    fig, axes = plt.subplots(1, 4, figsize=(12, 3.2))
    for ax, (label, values) in zip(axes, panels, strict=True):
        bars = ax.bar(names, values, color=colors[: len(names)])
        ax.set_title(label, fontsize=9)
        ax.bar_label(bars, fmt="%.2f" if "share" in label else "%.1f", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.margins(y=0.15)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
