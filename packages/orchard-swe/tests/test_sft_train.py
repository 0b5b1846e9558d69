"""The CPU SFT proof: TRL's SFTTrainer on credit-assignment samples from the built-in tasks.

Real end to end: the proof's data is made through real sandboxes (a local Orchard Env
service) with scripted models, tokenized with SmolLM2's tokenizer, and a random tiny Llama
with SmolLM2's vocabulary is trained for a few steps in the training venv (torch, TRL).
SmolLM2-135M itself runs in the documented command (docs/swe-train-cpu.md), not here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from orchard_swe.algorithms.credit import CreditConfig, rise_segments
from orchard_swe.cli import main as cli_main
from orchard_swe.data.sft_data import IGNORE_INDEX
from orchard_swe.trainers.sft_train import half_fix_curve
from orchard_swe.trainers.worker import parse_event

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_half_fix_curve_trains_the_write_only() -> None:
    [segment] = rise_segments(
        half_fix_curve(2), delta=CreditConfig().delta, epsilon=CreditConfig().epsilon
    )
    assert (segment.start, segment.stop) == (0, 1)
    assert len(half_fix_curve(5)) == 6 and half_fix_curve(0) == [0.2]


def test_the_proof_data(proof_dir: Path) -> None:
    summary = json.loads((proof_dir / "summary.json").read_text())
    assert summary["trajectories"] == 4
    assert summary["verify_status"] == {
        "tools/scripted-gold: resolved": 2,
        "tools/scripted-half: unresolved": 2,
    }
    assert summary["credit_samples"] == {"whole": 2, "segment": 2}
    assert summary["sft"]["kept"] == summary["sft"]["verified"] == 4
    records = [json.loads(line) for line in (proof_dir / "sft.jsonl").read_text().splitlines()]
    # per task: the gold trajectory whole, then the half one's segment (turn 0, the write)
    assert [r["metadata"]["kind"] for r in records] == ["whole", "segment"] * 2
    for rec in records:
        mask = rec["completion_mask"]
        assert rec["labels"] == [
            t if m else IGNORE_INDEX for t, m in zip(rec["input_ids"], mask, strict=True)
        ]
        assert 0 < sum(mask) < len(mask) and mask[0] == 0
    assert records[1]["metadata"]["turns"] == [0, 1]


def test_random_tiny_sft_lowers_the_loss_on_the_training_batch(
    train_venv: Path, proof_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = proof_dir / "sft.jsonl"
    out = tmp_path / "sft-tiny"
    rc = cli_main(
        [
            "train-sft",
            "--data",
            str(data),
            "--model",
            "random-tiny",
            "--steps",
            "3",
            "--out",
            str(out),
            "--max-samples",
            "2",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    summary = json.loads(captured.out)
    report = json.loads((out / "report.json").read_text())
    assert summary["loss_after"] == report["loss_after"]
    assert report["model"] == "random-tiny" and report["steps"] == 3
    assert 1_000_000 < report["params"] < 10_000_000
    losses = report["losses"]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert math.isfinite(report["loss_after"])
    assert report["loss_after"] < report["loss_before"]
    # the first step's loss (TRL's batch of both samples) is the masked NLL that the model's
    # own full forward gives before training: the trainer optimises the masked objective
    assert losses[0] == pytest.approx(report["loss_before"], rel=1e-4)
    # the mask is really used: the labels TRL built are -100 exactly where completion_mask
    # is 0, and every step trains on exactly the masked-in tokens of the batch
    records = [json.loads(line) for line in data.read_text().splitlines()][:2]
    assert report["mask"]["trl_labels_match_mask"] and report["mask"]["file_labels_match_mask"]
    trained = sum(sum(r["completion_mask"][1:]) for r in records)
    total = sum(len(r["input_ids"]) for r in records)
    assert report["tokens_per_step"] == [[trained, total]] * 3
    assert trained < total / 2
    # progress was streamed as it came
    assert [line.split()[1] for line in captured.err.splitlines() if line.startswith("step")] == [
        "1",
        "2",
        "3",
    ]


def test_worker_events_are_told_from_other_output() -> None:
    assert parse_event('{"event": "step", "step": 1, "loss": 2.0}\n') == {
        "event": "step",
        "step": 1,
        "loss": 2.0,
    }
    assert parse_event("{'loss': '10.78'}") is None
    assert parse_event('{"loss": 1}') is None
    assert parse_event("step 1") is None
