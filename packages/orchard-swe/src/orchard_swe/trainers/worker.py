"""Running a trainer's worker: one process in the training venv, its events and its report.

The workspace venv has no torch, so every trainer (:mod:`.sft_train`, :mod:`.grpo_train`,
:mod:`.value_model`) runs its torch side as a worker module (``*_worker.py``) with the
training venv's python (:func:`~.llm_venv.ensure_train_venv`), as
``python -m orchard_swe.trainers.<name>_worker ARGS`` with :func:`worker_env`'s environment
(offline, and this checkout's torch-free modules importable). :func:`run_worker` starts it,
passes its JSON-lines events (``{"event": ...}`` on stdout) on as they arrive, keeps
everything else it prints in ``OUT/worker.log``, raises :class:`WorkerError` when it fails
and returns the report the worker wrote to ``OUT/report.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Final

from ..data.tokenizer import gguf_tokenizer_dir
from .llm_venv import ensure_train_venv, smollm2_gguf, workspace_pythonpath

__all__ = [
    "MODELS",
    "TAIL_LINES",
    "Event",
    "WorkerError",
    "log_tail",
    "parse_event",
    "print_event",
    "run_worker",
    "worker_env",
    "worker_model_args",
]

MODELS: Final = ("random-tiny", "smollm2")
"""``smollm2``: SmolLM2-135M-Instruct; ``random-tiny``: a random 2-layer Llama, same vocabulary."""

Event = dict[str, Any]
"""A worker's progress or result event (``{"event": "step", ...}``)."""

TAIL_LINES: Final = 40
"""How much of a failed worker's log its :class:`WorkerError` quotes."""


class WorkerError(RuntimeError):
    """A worker exited non-zero; the message ends with the end of its log.

    ``returncode`` is its exit status and ``tail`` the end of its log (``log_path``), for
    callers that give some exit statuses a meaning of their own.
    """

    def __init__(self, message: str, *, returncode: int, log_path: Path, tail: str) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.log_path = log_path
        self.tail = tail


def worker_model_args(model: str) -> list[str]:
    """``--tokenizer DIR`` (SmolLM2's, converted once from its GGUF) and, for ``smollm2``,
    ``--gguf FILE``: what a worker needs to build either of :data:`MODELS`."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r} (one of {', '.join(MODELS)})")
    gguf = smollm2_gguf()
    out = ["--tokenizer", str(gguf_tokenizer_dir(gguf))]
    if model == "smollm2":
        out += ["--gguf", str(gguf)]
    return out


def worker_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker: offline, the checkout's pure modules importable, and
    ``extra`` (the caller's own variables) on top."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        PYTHONPATH=workspace_pythonpath(),
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra or {})
    return env


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ("" when it cannot be read)."""
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
    module: str,
    argv: Sequence[str],
    out_dir: Path,
    *,
    on_event: Callable[[Event], None] | None = None,
    on_output: Callable[[str], None] | None = None,
    merge_stderr: bool = False,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``python -m module argv`` with the training venv's python; the report it wrote.

    The worker writes its result to ``out_dir/report.json`` (removed first, so a stale one is
    never read); that is returned. Events (JSON lines on the worker's stdout,
    :func:`parse_event`) are passed to ``on_event`` as they arrive. Every other line of its
    stdout is appended to ``out_dir/worker.log`` and passed to ``on_output``; its stderr goes
    to the log too, or, with ``merge_stderr``, into its stdout (so ``on_output`` sees its
    progress lines). ``env`` adds to :func:`worker_env`. The worker is killed if this is
    interrupted or a callback raises. Raises :class:`WorkerError` (with the end of the log)
    when it exits non-zero, and :class:`~.llm_venv.LLMVenvError` when the training venv
    cannot be built.
    """
    python = ensure_train_venv()
    out_dir.mkdir(parents=True, exist_ok=True)
    report_path = out_dir / "report.json"
    report_path.unlink(missing_ok=True)
    log_path = out_dir / "worker.log"
    with open(log_path, "a", encoding="utf-8") as log:
        proc = subprocess.Popen(
            [str(python), "-m", module, *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else log,
            text=True,
            env=worker_env(env),
        )
        assert proc.stdout is not None
        try:
            _read_output(proc.stdout, log, on_event, on_output)
        except BaseException:  # interrupted, or a callback failed: do not leave it training
            proc.kill()
            proc.wait()
            raise
        rc = proc.wait()
    if rc != 0:
        tail = log_tail(log_path)
        raise WorkerError(
            f"{module} exited with {rc}; the end of {log_path}:\n{tail}",
            returncode=rc,
            log_path=log_path,
            tail=tail,
        )
    report: dict[str, Any] = json.loads(report_path.read_text())
    return report


def _read_output(
    stdout: IO[str],
    log: IO[str],
    on_event: Callable[[Event], None] | None,
    on_output: Callable[[str], None] | None,
) -> None:
    for line in stdout:
        event = parse_event(line)
        if event is None:
            log.write(line)
            log.flush()
            if on_output is not None:
                on_output(line)
            continue
        if on_event is not None:
            on_event(event)


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
