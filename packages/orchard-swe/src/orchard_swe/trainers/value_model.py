"""A learned value model for credit assignment: V(prefix) ~ P(resolved | prefix).

A small value head (linear, on the last hidden state at the end of a prefix) on a causal LM
(``random-tiny`` or ``smollm2``, see :mod:`.sft_train`), trained with BCE on the prefixes of
trajectories, each labelled with its trajectory's final outcome (resolved 1, else 0). The
model runs in the training venv (``value_model_worker.py``); this module is the workspace
side: it renders prefixes with the tokenizer's chat template, trains
(:func:`train_value_model`, ``orchard-swe train-value``) and serves
(:class:`ValueModelEstimator`, the :class:`~orchard_swe.algorithms.credit.Estimator` of
``credit-sft --estimator value``).

**Prefixes.** A trajectory with ``T`` assistant turns has the ``T + 1`` prefixes of
:mod:`orchard_swe.algorithms.credit`: ``V[0]`` before the first assistant turn, ``V[t + 1]``
through turn ``t`` and its observations. Each prefix is rendered as the policy would see it
when about to act: the chat template's render of its messages with the generation prompt
(``<|im_start|>assistant\\n``), the way :mod:`orchard_swe.data.sft_data` renders them (same
message preparation, same exactness checks). Those renders are prefixes of one another, so one
token sequence carries them all and a prefix is a position in it (the last token of its
generation prompt): :func:`prefix_sequence`. The worker scores all the prefixes of a
trajectory with one forward pass.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from ..algorithms.credit import SftSample, is_resolved
from ..data.sft_data import ChatRenderer, tokenize_sample
from ..data.tokenizer import SMOLLM2, load_tokenizer
from ..trajectory import Trajectory, read_trajectories
from .llm_venv import ensure_train_venv
from .worker import MODELS, Event, print_event, run_worker, worker_env, worker_model_args

__all__ = [
    "VALUE_WORKER",
    "PrefixSequence",
    "ValueModelError",
    "ValueModelEstimator",
    "prefix_sequence",
    "train_value_model",
    "write_examples",
]

VALUE_WORKER: Final = "orchard_swe.trainers.value_model_worker"
"""The worker module, run in the training venv (``train``, and ``serve`` for the estimator)."""


class ValueModelError(RuntimeError):
    """The value-model worker failed or answered something unexpected."""


@attrs.frozen
class PrefixSequence:
    """A trajectory's token ids and, for each of its ``T + 1`` prefixes, where it ends."""

    input_ids: list[int]
    positions: list[int]

    def to_dict(self) -> dict[str, Any]:
        """The worker's sequence shape."""
        return {"input_ids": list(self.input_ids), "positions": list(self.positions)}


def prefix_sequence(trajectory: Trajectory, renderer: ChatRenderer) -> PrefixSequence:
    """The ids of ``trajectory`` rendered with ``renderer``'s chat template, and the prefix ends.

    An empty assistant message is appended and every assistant message marked as a target,
    so :func:`~orchard_swe.data.sft_data.tokenize_sample` keeps the whole conversation and
    gives each assistant turn's span; prefix ``t`` ends at the last token of the generation
    prompt of assistant turn ``t`` (turn ``T``: the appended one). The ids stop there.
    """
    messages = [*(dict(m) for m in trajectory.messages), {"role": "assistant", "content": ""}]
    sample = SftSample(
        messages=tuple(messages),
        loss_mask=tuple(int(m.get("role") == "assistant") for m in messages),
        tools=tuple(dict(t) for t in trajectory.tools),
        kind="whole",
        instance_id=trajectory.metadata.task_id,
        attempt=trajectory.metadata.attempt,
    )
    tokenized = tokenize_sample(sample, renderer)
    if tokenized is None:  # cannot happen: the appended turn is a target
        raise ValueError("the trajectory tokenized to nothing")
    positions = [s.target_start - 1 for s in tokenized.spans if s.role == "assistant"]
    expected = sum(m.get("role") == "assistant" for m in trajectory.messages) + 1
    if len(positions) != expected:
        raise ValueError(f"found {len(positions)} prefix ends, expected {expected}")
    return PrefixSequence(list(tokenized.input_ids[: positions[-1] + 1]), positions)


def write_examples(
    trajectories: Iterable[Trajectory],
    renderer: ChatRenderer,
    path: Path,
    resolved: Callable[[Trajectory], bool] = is_resolved,
) -> dict[str, int]:
    """Write the worker's training examples (ids, prefix ends, outcome label); counts."""
    counts = {"trajectories": 0, "resolved": 0, "prefixes": 0}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for traj in trajectories:
            seq = prefix_sequence(traj, renderer)
            label = int(resolved(traj))
            handle.write(
                json.dumps(
                    {
                        **seq.to_dict(),
                        "label": label,
                        "instance_id": traj.metadata.task_id,
                        "attempt": traj.metadata.attempt,
                    }
                )
                + "\n"
            )
            counts["trajectories"] += 1
            counts["resolved"] += label
            counts["prefixes"] += len(seq.positions)
    return counts


def train_value_model(
    trajectories_path: Path,
    out_dir: Path,
    *,
    base: str = "random-tiny",
    steps: int = 50,
    batch_size: int = 8,
    lr: float | None = None,
    freeze_backbone: bool | None = None,
    tokenizer: str = SMOLLM2,
    threads: int = 2,
    seed: int = 0,
    on_event: Callable[[Event], None] | None = print_event,
) -> dict[str, Any]:
    """Train a value model on the trajectories at ``trajectories_path``; the worker's report.

    Every prefix is labelled with its trajectory's outcome (``verdict == "resolved"``).
    ``steps`` AdamW steps of ``batch_size`` trajectories each; ``freeze_backbone`` (default:
    only for ``smollm2``) trains the head alone on cached features. ``out_dir`` receives the
    model (``value_model.json``, ``value_head.pt``, ``backbone/``), ``examples.jsonl`` and
    ``report.json`` (losses per step, BCE/accuracy/mean values before and after, timings).
    """
    if base not in MODELS:
        raise ValueError(f"unknown base {base!r} (one of {', '.join(MODELS)})")
    if tokenizer != SMOLLM2:
        raise ValueError("the value model's bases use SmolLM2's tokenizer ('smollm2')")
    out_dir.mkdir(parents=True, exist_ok=True)
    renderer = ChatRenderer(load_tokenizer(tokenizer))
    examples = out_dir / "examples.jsonl"
    trajectories = read_trajectories(trajectories_path)
    if not trajectories:
        raise ValueError(f"{trajectories_path}: no trajectories")
    counts = write_examples(trajectories, renderer, examples)
    if on_event is not None:
        on_event({"event": "examples", **counts})
    argv = [
        "train",
        "--data",
        str(examples),
        "--base",
        base,
        *worker_model_args(base),
        "--tokenizer-name",
        tokenizer,
        "--steps",
        str(steps),
        "--out",
        str(out_dir),
        "--batch-size",
        str(batch_size),
        "--threads",
        str(threads),
        "--seed",
        str(seed),
    ]
    if lr is not None:
        argv += ["--lr", str(lr)]
    if freeze_backbone is not None:
        argv.append("--freeze-backbone" if freeze_backbone else "--no-freeze-backbone")
    return run_worker(VALUE_WORKER, argv, out_dir, on_event=on_event)


_Pending = tuple[PrefixSequence, "asyncio.Future[list[float]]"]


class ValueModelEstimator:
    """The :class:`~orchard_swe.algorithms.credit.Estimator` of a trained value model (the
    directory ``train_value_model`` wrote).

    ``values(trajectory)`` returns its ``T + 1`` prefix values in ``[0, 1]``. One worker
    process (training venv, ``value_model_worker.py serve``) is started on first use and kept
    for later calls; concurrent calls are sent together, up to ``batch_size`` trajectories a
    request. ``aclose()`` (or ``async with``) stops it.
    """

    def __init__(self, model_dir: Path, *, batch_size: int = 8) -> None:
        self.model_dir = Path(model_dir)
        self.batch_size = max(1, batch_size)
        meta = json.loads((self.model_dir / "value_model.json").read_text())
        self.meta: dict[str, Any] = meta
        self._renderer: ChatRenderer | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._log: Any = None
        self._lock = asyncio.Lock()
        self._queue: list[_Pending] = []
        self._next_id = 0

    def sequence(self, trajectory: Trajectory) -> PrefixSequence:
        """The ids and prefix ends the worker scores (with the model's tokenizer)."""
        if self._renderer is None:
            self._renderer = ChatRenderer(load_tokenizer(str(self.meta.get("tokenizer", SMOLLM2))))
        return prefix_sequence(trajectory, self._renderer)

    async def _start(self) -> asyncio.subprocess.Process:
        if self._proc is not None and self._proc.returncode is None:
            return self._proc
        python = await asyncio.to_thread(ensure_train_venv)
        if self._log is not None:  # a previous worker's
            self._log.close()
        # the worker's stderr, kept for error messages; closed by aclose()
        self._log = tempfile.TemporaryFile(mode="w+", prefix="orchard-value-serve-")  # noqa: SIM115
        self._proc = await asyncio.create_subprocess_exec(
            str(python),
            "-m",
            VALUE_WORKER,
            "serve",
            "--model-dir",
            str(self.model_dir),
            "--batch-size",
            str(self.batch_size),
            "--threads",
            os.environ.get("ORCHARD_LLM_THREADS", "2"),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._log,
            env=worker_env(),
            limit=1 << 24,
        )
        while True:
            line = await self._readline()
            if line.get("event") == "ready":
                return self._proc

    def _log_tail(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return "\n".join(self._log.read().splitlines()[-30:])

    async def _readline(self) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        while True:
            raw = await self._proc.stdout.readline()
            if not raw:
                rc = await self._proc.wait()
                raise ValueModelError(f"the value-model worker exited ({rc}):\n{self._log_tail()}")
            try:
                data = json.loads(raw)
            except ValueError:
                continue  # not ours (a library printing to stdout)
            if isinstance(data, dict):
                return data

    async def _request(self, sequences: Sequence[PrefixSequence]) -> list[list[float]]:
        proc = await self._start()
        assert proc.stdin is not None
        self._next_id += 1
        rid = self._next_id
        body = {"id": rid, "sequences": [s.to_dict() for s in sequences]}
        proc.stdin.write((json.dumps(body) + "\n").encode())
        await proc.stdin.drain()
        while True:
            answer = await self._readline()
            if answer.get("id") == rid:
                break
        if "error" in answer:
            raise ValueModelError(f"the value-model worker failed: {answer['error']}")
        values = [[float(v) for v in row] for row in answer["values"]]
        if [len(v) for v in values] != [len(s.positions) for s in sequences]:
            raise ValueModelError("the worker answered the wrong number of values")
        return values

    async def values(self, trajectory: Trajectory) -> list[float]:
        """``V[0..T]`` for the ``T`` assistant turns of ``trajectory`` (see
        :mod:`orchard_swe.algorithms.credit`)."""
        future: asyncio.Future[list[float]] = asyncio.get_running_loop().create_future()
        self._queue.append((self.sequence(trajectory), future))
        while not future.done():
            async with self._lock:
                if future.done():
                    break
                batch, self._queue = self._queue[: self.batch_size], self._queue[self.batch_size :]
                try:
                    results = await self._request([seq for seq, _ in batch])
                except asyncio.CancelledError:  # ours was cancelled: the others wait again
                    self._queue[:0] = [p for p in batch if p[1] is not future and not p[1].done()]
                    raise
                except BaseException as exc:  # the others in this batch fail with it
                    for _, f in batch:
                        if f is not future and not f.done():
                            f.set_exception(exc)
                    raise
                for (_, f), result in zip(batch, results, strict=True):
                    f.set_result(result)
        return future.result()

    async def aclose(self) -> None:
        """Stop the worker (it exits at the end of its input)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), timeout=30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    async def __aenter__(self) -> ValueModelEstimator:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
