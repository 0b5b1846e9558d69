"""``orchard-swe credit-sft``: trajectories → credit-assignment SFT samples.

Reads trajectory JSON lines (:func:`orchard_swe.trajectory.read_trajectories`), keeps
resolved trajectories whole, runs the chosen estimator (``mc``:
:class:`~orchard_swe.algorithms.estimators.MonteCarloReplay`, ``judge``:
:class:`~orchard_swe.algorithms.estimators.LLMJudge`, ``value``:
:class:`~orchard_swe.trainers.value_model.ValueModelEstimator`) on the unresolved ones,
extracts rise segments (:func:`~orchard_swe.algorithms.credit.samples_for`) and writes
``SftSample.to_dict()`` lines, which ``orchard-swe sft-data`` reads. Exit codes: 0 done, 2 bad input or arguments, 3 a service
(Orchard, the policy, the judge) is unreachable or the estimation failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..algorithms.credit import (
    CreditConfig,
    Estimator,
    SftSample,
    Smoother,
    assistant_positions,
    ema,
    moving_average,
    samples_for,
)
from ..trajectory import Trajectory, read_trajectories
from .common import DEFAULT_URL, Command

if TYPE_CHECKING:
    from orchard_env_client import AsyncSandboxClient

    from ..algorithms.estimators import MonteCarloReplay
    from ..tasks import Task

__all__ = [
    "COMMAND",
    "EXIT_INPUT",
    "EXIT_SERVICE",
    "InputError",
    "TrajectoryResult",
    "estimate_all",
    "parse_smoother",
    "write_samples",
]

EXIT_INPUT: Final = 2
EXIT_SERVICE: Final = 3
_SHOWN_ROWS: Final = 30


class InputError(ValueError):
    """The input is not what ``credit-sft`` reads (the message names file and line)."""


# ---------------------------------------------------------------- arguments


def _unparseable(value: str) -> float | None:
    if value == "error":
        return None
    number = float(value)
    if not 0.0 <= number <= 1.0:
        raise argparse.ArgumentTypeError("must be 'error' or a number in [0, 1]")
    return number


def parse_smoother(spec: str) -> Smoother | None:
    """``none``, ``ema:ALPHA`` or ``ma:WINDOW`` → a smoother of
    :mod:`orchard_swe.algorithms.credit`."""
    name, _, arg = spec.partition(":")
    try:
        if name == "none" and not arg:
            return None
        if name == "ema":
            return ema(float(arg))
        if name == "ma":
            return moving_average(int(arg))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{spec!r}: {exc}") from None
    raise argparse.ArgumentTypeError(f"{spec!r}: use none, ema:ALPHA or ma:WINDOW")


def _general_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--estimator",
        choices=["mc", "value", "judge"],
        required=True,
        help="mc: Monte-Carlo replay; value: a trained value model; judge: an LLM",
    )
    parser.add_argument(
        "--trajectories",
        type=Path,
        required=True,
        help="trajectory JSONL (distill's trajectories.jsonl) or a directory of them",
    )
    parser.add_argument("--out", type=Path, required=True, help="output JSONL of SFT samples")
    parser.add_argument(
        "--curves",
        type=Path,
        default=None,
        help="also write each estimated value curve and its segments here (JSONL)",
    )
    parser.add_argument("--delta", type=float, default=0.2, help="minimum rise of a segment")
    parser.add_argument(
        "--epsilon", type=float, default=0.05, help="largest single drop tolerated inside a segment"
    )
    parser.add_argument(
        "--smooth",
        type=parse_smoother,
        default=None,
        metavar="SPEC",
        help="smooth V first: none, ema:ALPHA or ma:WINDOW (default: none)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=4, help="sandboxes (mc) or requests (judge) in flight"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def _mc_arguments(parser: argparse.ArgumentParser) -> None:
    mc = parser.add_argument_group("mc: Monte-Carlo replay")
    mc.add_argument("--tasks", default="builtin", help="the trajectories' task file, or 'builtin'")
    mc.add_argument("--k", type=int, default=4, help="continuations per prefix")
    mc.add_argument(
        "--stride",
        type=int,
        default=1,
        help="estimate every STRIDE-th prefix (and the last); fill the rest",
    )
    mc.add_argument("--fill", choices=["interpolate", "carry"], default="interpolate")
    mc.add_argument("--max-steps", type=int, default=10, help="model calls per continuation")
    mc.add_argument(
        "--policy-url",
        default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1"),
        help="the continuing policy: an OpenAI-compatible API root",
    )
    mc.add_argument("--policy-model", default="default")
    mc.add_argument("--policy-api-key-env", default="OPENAI_API_KEY")
    mc.add_argument("--temperature", type=float, default=1.0)
    mc.add_argument("--max-tokens", type=int, default=None, help="per policy call")
    mc.add_argument("--seed", type=int, default=0, help="base of the continuation seeds")
    mc.add_argument(
        "--server-url",
        "--url",
        dest="url",
        default=os.environ.get("ORCHARD_ENV_URL", DEFAULT_URL),
        help="the Orchard Env service (default: $ORCHARD_ENV_URL or :8000)",
    )
    mc.add_argument("--api-key", default=os.environ.get("ORCHARD_ENV_API_KEY"))
    mc.add_argument("--image", default=None, help="sandbox image for repository tasks")


def _judge_arguments(parser: argparse.ArgumentParser) -> None:
    judge = parser.add_argument_group("judge: an LLM judge")
    judge.add_argument(
        "--judge-url",
        default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1"),
        help="an OpenAI-compatible API root",
    )
    judge.add_argument("--judge-model", default="default")
    judge.add_argument("--judge-api-key-env", default="OPENAI_API_KEY")
    judge.add_argument(
        "--judge-retries", type=int, default=2, help="re-asks after an answer without a probability"
    )
    judge.add_argument("--judge-max-tokens", type=int, default=64)
    judge.add_argument(
        "--on-unparseable",
        type=_unparseable,
        default=None,
        metavar="error|P",
        help="when no answer parses: fail (default) or use the value P",
    )
    judge.add_argument(
        "--http-retries",
        type=int,
        default=2,
        help="HTTP retries of the judge and policy clients on 5xx / connection errors",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``orchard-swe credit-sft``."""
    _general_arguments(parser)
    _mc_arguments(parser)
    _judge_arguments(parser)
    value = parser.add_argument_group("value: a trained value model")
    value.add_argument("--value-model", type=Path, default=None, help="the model directory")
    value.add_argument("--batch-size", type=int, default=8)


# ---------------------------------------------------------------- input and output


def write_samples(records: Sequence[dict[str, Any]], path: Path) -> None:
    """JSON lines, written to a temporary file and renamed (never a half-written output)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------- estimation


@attrs.define
class TrajectoryResult:
    """One trajectory's curve (None when not estimated) and samples."""

    trajectory: Trajectory
    values: list[float] | None = None
    samples: list[SftSample] = attrs.field(factory=list)

    @property
    def turns(self) -> int:
        """Its assistant turns."""
        return len(assistant_positions(self.trajectory.messages))

    def records(self, estimator: str) -> list[dict[str, Any]]:
        """Its samples as ``SftSample.to_dict()``, metadata extended with the estimator
        (and, for segments, the value curve)."""
        out = []
        for sample in self.samples:
            record = sample.to_dict()
            record["metadata"]["estimator"] = estimator if sample.kind == "segment" else None
            if sample.kind == "segment" and self.values is not None:
                record["metadata"]["values"] = [round(v, 6) for v in self.values]
            out.append(record)
        return out

    def curve(self) -> dict[str, Any]:
        """The ``--curves`` line."""
        meta = self.trajectory.metadata
        segments = [[s.segment.start, s.segment.stop] for s in self.samples if s.segment]
        return {
            "instance_id": meta.task_id,
            "attempt": meta.attempt,
            "verify_status": meta.verdict,
            "values": self.values,
            "segments": segments,
        }


async def estimate_all(
    trajectories: Sequence[Trajectory],
    estimator: Estimator,
    cfg: CreditConfig,
    *,
    concurrency: int = 1,
    on_done: Callable[[TrajectoryResult], None] | None = None,
) -> list[TrajectoryResult]:
    """Samples of every trajectory; the estimator runs on unresolved ones with a turn,
    ``concurrency`` trajectories at a time. The first estimator error propagates (and
    cancels the rest)."""
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(traj: Trajectory) -> TrajectoryResult:
        result = TrajectoryResult(traj)
        if not cfg.resolved(traj) and result.turns:
            async with gate:
                result.values = await estimator.values(traj)
        result.samples = samples_for(traj, result.values, cfg) if result.turns else []
        if on_done is not None and result.values is not None:
            on_done(result)
        return result

    from ..algorithms.estimators import gather_all

    return await gather_all(one(t) for t in trajectories)


# ---------------------------------------------------------------- estimators


def _reachable(url: str) -> str | None:
    """None when something answers HTTP at ``url`` (any status), else why not."""
    import httpx

    try:
        httpx.get(url.rstrip("/") + "/models", timeout=10)
    except httpx.TransportError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _model(args: argparse.Namespace, *, judge: bool) -> Any:
    from orchard_env_client.llm import ModelConfig

    if judge:
        return ModelConfig(
            model=args.judge_model,
            base_url=args.judge_url,
            temperature=0.0,
            api_key_env=args.judge_api_key_env,
            max_retries=args.http_retries,
            retry_backoff_s=0.5,
        )
    return ModelConfig(
        model=args.policy_model,
        base_url=args.policy_url,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        api_key_env=args.policy_api_key_env,
        max_retries=args.http_retries,
        retry_backoff_s=0.5,
    )


def _judge(args: argparse.Namespace, on_unit: Callable[[], None]) -> Estimator:
    from ..algorithms.estimators import JudgeConfig, LLMJudge

    config = JudgeConfig(
        retries=args.judge_retries,
        on_unparseable=args.on_unparseable,
        concurrency=args.concurrency,
        max_tokens=args.judge_max_tokens,
    )
    return LLMJudge(_model(args, judge=True), config, on_unit=on_unit)


def _value(args: argparse.Namespace) -> Estimator:
    if args.value_model is None:
        raise InputError("--estimator value needs --value-model DIR")
    try:
        from ..trainers.value_model import ValueModelEstimator
    except ImportError as exc:
        raise InputError(f"the value-model estimator is not available: {exc}") from exc
    estimator: Estimator = ValueModelEstimator(args.value_model, batch_size=args.batch_size)
    return estimator


def _mc(
    args: argparse.Namespace,
    client: AsyncSandboxClient,
    tasks: Sequence[Task],
    on_unit: Callable[[], None],
) -> MonteCarloReplay:
    from ..algorithms.estimators import MonteCarloConfig, MonteCarloReplay

    config = MonteCarloConfig(
        k=args.k,
        stride=args.stride,
        fill=args.fill,
        max_steps=args.max_steps,
        concurrency=args.concurrency,
        seed=args.seed,
        default_image=args.image,
    )
    return MonteCarloReplay(client, tasks, _model(args, judge=False), config, on_unit=on_unit)


# ---------------------------------------------------------------- summary


def _segments(result: TrajectoryResult) -> str:
    spans = [f"[{s.segment.start},{s.segment.stop})" for s in result.samples if s.segment]
    return " ".join(spans) or "-"


def summarize(
    results: Sequence[TrajectoryResult],
    estimator: str,
    out: Path,
    seconds: float,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The run's totals (what ``--json`` prints)."""
    kinds = Counter(s.kind for r in results for s in r.samples)
    estimated = [r for r in results if r.values is not None]
    return {
        "out": str(out),
        "estimator": estimator,
        "trajectories": len(results),
        "resolved": sum(r.values is None and r.turns > 0 for r in results),
        "estimated": len(estimated),
        "without_turns": sum(r.turns == 0 for r in results),
        "with_segments": sum(any(s.kind == "segment" for s in r.samples) for r in estimated),
        "samples": sum(kinds.values()),
        "whole": kinds.get("whole", 0),
        "segments": kinds.get("segment", 0),
        "trained_turns": sum(sum(s.loss_mask) for r in results for s in r.samples),
        "seconds": round(seconds, 1),
        **(extra or {}),
    }


def summary_table(results: Sequence[TrajectoryResult], summary: dict[str, Any]) -> Table:
    """One row per trajectory (the first 30), then the totals in the caption."""
    table = Table(title=f"credit-sft ({summary['estimator']}): {summary['out']}")
    for column in ("instance", "attempt", "verify", "turns", "V", "segments", "samples"):
        table.add_column(column)
    for r in results[:_SHOWN_ROWS]:
        meta = r.trajectory.metadata
        curve = " ".join(f"{v:.2f}" for v in r.values) if r.values is not None else "(whole)"
        table.add_row(
            escape(meta.task_id),
            str(meta.attempt),
            str(meta.verdict),
            str(r.turns),
            curve,
            _segments(r),
            str(len(r.samples)),
        )
    if len(results) > _SHOWN_ROWS:
        table.add_row(f"... {len(results) - _SHOWN_ROWS} more", "", "", "", "", "", "")
    keys = (
        "trajectories",
        "estimated",
        "with_segments",
        "whole",
        "segments",
        "trained_turns",
        "seconds",
    )
    table.caption = ", ".join(f"{k}: {summary[k]}" for k in keys)
    return table


# ---------------------------------------------------------------- run


class _Bars:
    """The progress bars: trajectories estimated, and rollouts (mc) or requests."""

    def __init__(self, console: Console, trajectories: int, unit_name: str) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self._trajectories = self.progress.add_task("trajectories", total=trajectories)
        self._units = self.progress.add_task(unit_name, total=None)

    def planned(self, total: int) -> None:
        """Set the number of rollouts / requests expected."""
        self.progress.update(self._units, total=total)

    def unit(self) -> None:
        """One rollout / request finished."""
        self.progress.advance(self._units)

    def done(self, _: TrajectoryResult) -> None:
        """One trajectory estimated."""
        self.progress.advance(self._trajectories)


async def _estimate(
    args: argparse.Namespace, trajectories: list[Trajectory], cfg: CreditConfig, console: Console
) -> tuple[list[TrajectoryResult], dict[str, Any]]:
    todo = [t for t in trajectories if not cfg.resolved(t) and assistant_positions(t.messages)]
    bars = _Bars(console, len(todo), "rollouts" if args.estimator == "mc" else "requests")
    with bars.progress:
        if args.estimator == "mc":
            return await _estimate_mc(args, trajectories, todo, cfg, bars)
        estimator = _judge(args, bars.unit) if args.estimator == "judge" else _value(args)
        planned = getattr(estimator, "units", None)
        if planned is not None:
            bars.planned(sum(planned(t) for t in todo))
        # the value model batches concurrent calls (batch_size trajectories a request)
        concurrency = args.concurrency if args.estimator == "judge" else args.batch_size
        try:
            results = await estimate_all(
                trajectories, estimator, cfg, concurrency=concurrency, on_done=bars.done
            )
        finally:
            close = getattr(estimator, "aclose", None)  # the value model's worker process
            if close is not None:
                await close()
        extra = {"unparsed": getattr(estimator, "unparsed", 0)} if args.estimator == "judge" else {}
        return results, extra


async def _estimate_mc(
    args: argparse.Namespace,
    trajectories: list[Trajectory],
    todo: list[Trajectory],
    cfg: CreditConfig,
    bars: _Bars,
) -> tuple[list[TrajectoryResult], dict[str, Any]]:
    from orchard_env_client import AsyncSandboxClient

    from ..tasks import load_tasks

    tasks = load_tasks(args.tasks, ids=sorted({t.metadata.task_id for t in todo}))
    async with AsyncSandboxClient(base_url=args.url, api_key=args.api_key) as client:
        await client.health()
        estimator = _mc(args, client, tasks, bars.unit)
        bars.planned(sum(estimator.units(t) for t in todo))
        results = await estimate_all(
            trajectories, estimator, cfg, concurrency=args.concurrency, on_done=bars.done
        )
        return results, {"mc": estimator.stats()}


def _preflight(args: argparse.Namespace) -> str | None:
    """Why a needed service does not answer (None: all answer)."""
    urls = {"mc": [("policy", args.policy_url)], "judge": [("judge", args.judge_url)]}
    for name, url in urls.get(args.estimator, []):
        if (why := _reachable(url)) is not None:
            return f"the {name} endpoint {url} does not answer: {why}"
    return None


def _fail(console: Console, code: int, message: str) -> int:
    console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    return code


def run(args: argparse.Namespace, console: Console | None = None) -> int:
    """Read, estimate, extract segments, write; print the summary. Returns the exit code."""
    from orchard_env_client import OrchardError
    from orchard_env_client.llm import ModelError

    from ..algorithms.estimators import EstimatorError
    from ..tasks import TaskLoadError

    console = console or Console(stderr=True)
    started = time.monotonic()
    try:
        cfg = CreditConfig(delta=args.delta, epsilon=args.epsilon, smoother=args.smooth)
        trajectories = read_trajectories(args.trajectories)
    except (InputError, FileNotFoundError, ValueError) as exc:
        return _fail(console, EXIT_INPUT, str(exc))
    if (why := _preflight(args)) is not None:
        return _fail(console, EXIT_SERVICE, why)
    try:
        results, extra = asyncio.run(_estimate(args, trajectories, cfg, console))
    except (InputError, TaskLoadError, FileNotFoundError) as exc:
        return _fail(console, EXIT_INPUT, str(exc))
    except OrchardError as exc:
        return _fail(console, EXIT_SERVICE, f"the Orchard Env service at {args.url}: {exc}")
    except (EstimatorError, ModelError) as exc:
        return _fail(console, EXIT_SERVICE, str(exc))
    write_samples([rec for r in results for rec in r.records(args.estimator)], args.out)
    if args.curves is not None:
        write_samples([r.curve() for r in results if r.values is not None], args.curves)
    summary = summarize(results, args.estimator, args.out, time.monotonic() - started, extra)
    _print_summary(args, results, summary)
    return 0


def _print_summary(
    args: argparse.Namespace, results: Sequence[TrajectoryResult], summary: dict[str, Any]
) -> None:
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    out = Console()
    if not out.is_terminal:
        out = Console(width=140)
    out.print(summary_table(results, summary))


COMMAND = Command("credit-sft", "trajectories -> credit-assignment SFT samples", add_arguments, run)
