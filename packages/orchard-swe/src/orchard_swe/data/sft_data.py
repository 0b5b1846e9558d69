"""SFT data: trajectories and credit-assignment samples → tokenized chat samples with loss masks.

Trajectories (every assistant turn trained) and credit samples (per-message
``loss_mask``) go through one tokenization: messages prepared as the tiny LLM server
prepares a request (:mod:`.chat_format`), rendered prefix by prefix so each message owns
an exact token span (:class:`TemplateError` when a template or tokenizer makes that
impossible), assistant turns masked in as the model generates them, :func:`verify_sample`
to prove it. Output: ``tokens`` (``input_ids``/``labels``/``completion_mask`` for TRL) or
``messages`` records.
The rules, the length and filter options and the field mapping for slime and verl are in
``docs/swe-training.md`` (section "orchard-swe sft-data").
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs

from ..algorithms.credit import Segment, SftSample, whole_sample
from ..trajectory import SCHEMA as TRAJECTORY_SCHEMA
from ..trajectory import Trajectory, read_json_lines, trajectory_from_record
from .chat_format import BadRequest, TemplateCaps, prepare_messages

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "END_OF_TURN_TOKENS",
    "IGNORE_INDEX",
    "ChatRenderer",
    "SftConfig",
    "SftStats",
    "TemplateError",
    "TokenizedSample",
    "build_sft_data",
    "read_samples",
    "sample_from_dict",
    "tokenize_sample",
    "verify_sample",
    "write_records",
]

IGNORE_INDEX: Final = -100
"""``labels`` value of a masked-out token (what PyTorch's cross-entropy ignores)."""

END_OF_TURN_TOKENS: Final = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|eom_id|>")
"""Special tokens that end an assistant turn in common templates (besides the EOS token)."""

Format = Literal["tokens", "messages"]


class TemplateError(ValueError):
    """The chat template or tokenizer cannot give an exact per-message token mask."""


# ---------------------------------------------------------------- rendering


class ChatRenderer:
    """A tokenizer's chat template, rendered prefix by prefix into exact per-message spans."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        template = tokenizer.chat_template
        if not template:
            raise TemplateError("the tokenizer has no chat template")
        if isinstance(template, dict):
            template = "\n".join(str(v) for v in template.values())
        self.caps = TemplateCaps(str(template))
        vocab = tokenizer.get_vocab()
        ends: set[str] = {t for t in END_OF_TURN_TOKENS if t in vocab}
        if tokenizer.eos_token:
            ends.add(str(tokenizer.eos_token))
        self.end_tokens = frozenset(ends)
        self.end_ids = frozenset(int(vocab[t]) for t in ends)

    def prepare(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
        """(messages, tools, inserted) as handed to the template (see the module docstring).

        The tools are returned only when the template renders them itself; otherwise they
        are in the system prompt, which is added as a new first message when the
        conversation has none (``inserted`` is then 1, else 0). Otherwise one message in,
        one message out, in order.
        """
        cleaned = [{k: v for k, v in m.items() if k != "weight"} for m in messages]
        offered = [dict(t) for t in tools]
        try:
            prepared = prepare_messages(cleaned, offered, self.caps)
        except BadRequest as exc:
            raise ValueError(f"cannot prepare the messages: {exc.message}") from None
        if offered and not self.caps.tools:
            offered = []
        inserted = len(prepared) - len(cleaned)
        if inserted not in (0, 1):
            raise TemplateError("message preparation changed the number of messages")
        return prepared, offered, inserted

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        *,
        generation_prompt: bool = False,
    ) -> str:
        """The template's text for ``messages`` (``""`` for none)."""
        if not messages:
            return ""
        kwargs: dict[str, Any] = {"tools": list(tools)} if tools else {}
        text = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tokenize=False,
            add_generation_prompt=generation_prompt,
            **kwargs,
        )
        if not isinstance(text, str):
            raise TemplateError(f"apply_chat_template returned {type(text).__name__}, not text")
        return text

    def encode(self, text: str) -> list[int]:
        """``text``'s token ids, no special tokens added (the template writes its own)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        """The exact text of ``ids`` (special tokens kept, no clean-up)."""
        return str(
            self.tokenizer.decode(
                list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        )


@attrs.frozen
class Span:
    """Message ``index`` owns tokens ``[start, stop)``; ``[target_start, target_stop)`` of
    them is the assistant's own turn (empty for other roles)."""

    index: int
    role: str
    start: int
    stop: int
    target_start: int
    target_stop: int
    trained: bool


@attrs.define(kw_only=True)
class TokenizedSample:
    """One sample: token ids, a 0/1 loss mask over them, and where every message lies."""

    input_ids: list[int]
    loss_mask: list[int]
    messages: list[dict[str, Any]]
    """The prepared messages (as handed to the template), after any cut."""
    tools: list[dict[str, Any]]
    spans: list[Span]
    targets: list[str]
    """The text of each trained assistant turn, from the string render (for verification)."""
    metadata: dict[str, Any] = attrs.field(factory=dict)

    @property
    def trained_tokens(self) -> int:
        """How many tokens the loss covers."""
        return sum(self.loss_mask)

    def digest(self) -> str:
        """sha256 of the ids and mask: equal samples have equal digests."""
        payload = json.dumps([self.input_ids, self.loss_mask], separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()

    def record(self, fmt: Format = "tokens") -> dict[str, Any]:
        """The output record in ``fmt`` (see the module docstring)."""
        meta = dict(self.metadata)
        meta.update(n_tokens=len(self.input_ids), n_trained_tokens=self.trained_tokens)
        if fmt == "tokens":
            return {
                "input_ids": list(self.input_ids),
                "attention_mask": [1] * len(self.input_ids),
                "labels": [
                    t if m else IGNORE_INDEX
                    for t, m in zip(self.input_ids, self.loss_mask, strict=True)
                ],
                "completion_mask": list(self.loss_mask),
                "metadata": meta,
            }
        trained = {s.index for s in self.spans if s.trained}
        messages = []
        for i, message in enumerate(self.messages):
            out = dict(message)
            if message.get("role") == "assistant":
                out["weight"] = int(i in trained)
            messages.append(out)
        return {"messages": messages, "tools": [dict(t) for t in self.tools], "metadata": meta}


def tokenize_sample(
    sample: SftSample,
    renderer: ChatRenderer,
    *,
    max_tokens: int | None = None,
    extra_metadata: Mapping[str, Any] | None = None,
) -> TokenizedSample | None:
    """Tokenize ``sample`` with exact per-message spans; cut to ``max_tokens`` at a turn boundary.

    Returns None when no trained assistant turn fits in ``max_tokens`` (or the sample has
    none). Raises :class:`TemplateError` when the template cannot give exact spans.
    """
    prepared, tools, inserted = renderer.prepare(sample.messages, sample.tools)
    loss = [0] * inserted + list(sample.loss_mask)
    texts = [renderer.render(prepared[:i], tools) for i in range(len(prepared) + 1)]
    ids: list[int] = []
    mask: list[int] = []
    spans: list[Span] = []
    targets: list[str] = []
    by_message: list[int] = []  # each message's text tokenized whole: the boundary check
    for i, message in enumerate(prepared):
        before, after = texts[i], texts[i + 1]
        if not after.startswith(before):
            raise TemplateError(
                f"the template's render of messages[:{i + 1}] does not extend that of "
                f"messages[:{i}]: it rewrites earlier turns, so no exact mask exists"
            )
        piece = after[len(before) :]
        by_message.extend(renderer.encode(piece))
        start = len(ids)
        role = str(message.get("role"))
        t_start = t_stop = start
        trained = False
        if role == "assistant":
            header = renderer.render(prepared[:i], tools, generation_prompt=True)[len(before) :]
            if not header:
                raise TemplateError(
                    "the template renders no generation prompt (add_generation_prompt), so an "
                    "assistant turn's header cannot be told from the turn itself"
                )
            if not piece.startswith(header):
                raise TemplateError(
                    f"messages[{i}] (assistant) does not start with the template's generation "
                    f"prompt {header!r}"
                )
            body = piece[len(header) :]
            head_ids, body_ids = renderer.encode(header), renderer.encode(body)
            piece_ids = head_ids + body_ids
            ends = [k for k, t in enumerate(body_ids) if t in renderer.end_ids]
            stop = ends[-1] + 1 if ends else len(body_ids)
            t_start, t_stop = start + len(head_ids), start + len(head_ids) + stop
            trained = bool(loss[i])
            if trained:  # the turn's text, cut from the string render (not from the tokens)
                end_text = renderer.decode(body_ids[stop - 1 : stop]) if ends else ""
                targets.append(body[: body.rfind(end_text) + len(end_text)] if end_text else body)
        else:
            piece_ids = renderer.encode(piece)
        ids.extend(piece_ids)
        mask.extend(int(trained and t_start <= start + k < t_stop) for k in range(len(piece_ids)))
        spans.append(Span(i, role, start, len(ids), t_start, t_stop, trained))
    full = renderer.encode(texts[-1])
    if full != by_message:
        at = next(
            (k for k, (x, y) in enumerate(zip(full, by_message, strict=False)) if x != y),
            min(len(full), len(by_message)),
        )
        raise TemplateError(
            f"tokenizing message by message differs from tokenizing the whole render "
            f"(first difference at token {at}): the tokenizer merges across messages"
        )
    trained_spans = [s for s in spans if s.trained]
    if not trained_spans:
        return None
    last = trained_spans[-1]
    if max_tokens is not None and last.stop > max_tokens:
        fitting = [s for s in trained_spans if s.stop <= max_tokens]
        if not fitting:
            return None
        last = fitting[-1]
    keep = last.index + 1  # a sample ends with its last trained turn
    spans = spans[:keep]
    end = last.stop
    n_targets = sum(s.trained for s in spans)
    meta: dict[str, Any] = {
        "kind": sample.kind,
        "instance_id": sample.instance_id,
        "attempt": sample.attempt,
        "truncated": last is not trained_spans[-1],
        "messages_kept": keep,
        "messages_total": len(prepared),
    }
    if sample.segment is not None:
        meta.update(turns=[sample.segment.start, sample.segment.stop], gain=sample.segment.gain)
    meta.update(extra_metadata or {})
    return TokenizedSample(
        input_ids=ids[:end],
        loss_mask=mask[:end],
        messages=prepared[:keep],
        tools=tools,
        spans=spans,
        targets=targets[:n_targets],
        metadata=meta,
    )


def _runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for k, m in enumerate(mask):
        if m and runs and runs[-1][1] == k:
            runs[-1] = (runs[-1][0], k + 1)
        elif m:
            runs.append((k, k + 1))
    return runs


def verify_sample(sample: TokenizedSample, renderer: ChatRenderer) -> list[str]:
    """Check a sample's mask by decoding; returns the problems found (empty: all good).

    The masked-in tokens, run by run, must decode to exactly the trained assistant turns'
    texts (taken from the template's string render, not from the tokens); each run must lie
    inside one trained assistant span; the ids must decode to the render of the kept
    messages; and ``input_ids``/``loss_mask`` must have one entry per token.
    """
    problems: list[str] = []
    if len(sample.input_ids) != len(sample.loss_mask):
        return [f"{len(sample.input_ids)} ids but {len(sample.loss_mask)} mask entries"]
    runs = _runs(sample.loss_mask)
    decoded = [renderer.decode(sample.input_ids[a:b]) for a, b in runs]
    if decoded != sample.targets:
        problems.append(f"masked-in tokens decode to {decoded!r}, expected {sample.targets!r}")
    trained = [(s.target_start, s.target_stop) for s in sample.spans if s.trained]
    if runs != trained:
        problems.append(f"masked-in runs {runs} are not the trained assistant spans {trained}")
    whole = renderer.render(sample.messages, sample.tools)
    if renderer.decode(sample.input_ids) != whole:
        problems.append("the ids do not decode to the render of the kept messages")
    return problems


# ---------------------------------------------------------------- inputs


def sample_from_dict(data: Mapping[str, Any]) -> SftSample:
    """An ``SftSample`` from :meth:`SftSample.to_dict` output (assistant ``weight`` → loss)."""
    meta = data.get("metadata") or {}
    raw = [dict(m) for m in data["messages"]]
    loss = tuple(int(m.get("weight", 1)) if m.get("role") == "assistant" else 0 for m in raw)
    messages = tuple({k: v for k, v in m.items() if k != "weight"} for m in raw)
    turns = meta.get("turns")
    segment = Segment(int(turns[0]), int(turns[1]), float(meta.get("gain", 0.0))) if turns else None
    kind = meta.get("kind", "whole")
    if kind not in ("whole", "segment"):
        raise ValueError(f"unknown sample kind {kind!r}")
    return SftSample(
        messages=messages,
        loss_mask=loss,
        tools=tuple(dict(t) for t in data.get("tools") or ()),
        kind=kind,
        instance_id=str(meta.get("instance_id", "")),
        attempt=int(meta.get("attempt", 0)),
        segment=segment,
    )


def read_samples(path: str | os.PathLike[str]) -> Iterator[Trajectory | SftSample]:
    """Trajectories and credit samples from a JSONL file or every ``*.jsonl`` under a directory.

    A line with the trajectory ``schema`` is a :class:`Trajectory`; one with ``messages``
    and a ``metadata.kind`` is a credit :class:`SftSample`. Anything else (or bad JSON)
    raises ``ValueError`` naming the file and line.
    """
    for where, data in read_json_lines(path):
        if str(data.get("schema", "")).startswith(TRAJECTORY_SCHEMA.split("/")[0]):
            yield trajectory_from_record(data, where)
        elif "messages" in data and "kind" in (data.get("metadata") or {}):
            yield sample_from_dict(data)
        else:
            raise ValueError(f"{where}: neither a trajectory nor a credit SFT sample")


# ---------------------------------------------------------------- the pipeline


@attrs.frozen(kw_only=True)
class SftConfig:
    """What to keep and how long samples may be."""

    max_tokens: int | None = None
    """Cut longer samples at a turn boundary (None: no limit)."""
    drop_long: bool = False
    """Drop over-long samples instead of cutting them."""
    only_resolved: bool = False
    """Keep only trajectories graded ``resolved`` (credit samples are kept: they were chosen)."""
    exit_statuses: frozenset[str] | None = None
    """Keep only trajectories with one of these ``exit_status`` values (None: any)."""
    dedupe: bool = True
    """Drop exact duplicates (same ids and mask)."""
    verify: bool = False
    """Run :func:`verify_sample` on every sample; a failure raises ``ValueError``."""


@attrs.define
class SftStats:
    """What :func:`build_sft_data` read, kept and dropped (and why)."""

    read: int = 0
    kept: int = 0
    dropped: Counter[str] = attrs.field(factory=Counter)
    truncated: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    verified: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {
            "read": self.read,
            "kept": self.kept,
            "dropped": dict(sorted(self.dropped.items())),
            "truncated": self.truncated,
            "tokens": self.tokens,
            "trained_tokens": self.trained_tokens,
            "verified": self.verified,
        }


def _status_reason(item: Trajectory | SftSample, cfg: SftConfig) -> str | None:
    if not isinstance(item, Trajectory):
        return None
    meta = item.metadata
    if cfg.only_resolved and meta.verdict != "resolved":
        return "not_resolved"
    if cfg.exit_statuses is not None and meta.exit_status not in cfg.exit_statuses:
        return "exit_status"
    return None


def build_sft_data(
    items: Iterable[Trajectory | SftSample],
    tokenizer: PreTrainedTokenizerBase,
    cfg: SftConfig | None = None,
    *,
    tokenizer_name: str = "",
) -> tuple[list[TokenizedSample], SftStats]:
    """Filter, tokenize, cut, dedupe (and optionally verify) trajectories and credit samples."""
    cfg = cfg or SftConfig()
    renderer = ChatRenderer(tokenizer)
    stats = SftStats()
    seen: set[str] = set()
    out: list[TokenizedSample] = []
    for item in items:
        stats.read += 1
        if (reason := _status_reason(item, cfg)) is not None:
            stats.dropped[reason] += 1
            continue
        extra: dict[str, Any] = {"tokenizer": tokenizer_name} if tokenizer_name else {}
        if isinstance(item, Trajectory):
            extra.update(exit_status=item.metadata.exit_status, verify_status=item.metadata.verdict)
            sample = whole_sample(item)
        else:
            sample = item
        if not any(sample.loss_mask):
            stats.dropped["no_target"] += 1
            continue
        limit = cfg.max_tokens
        tokenized = tokenize_sample(sample, renderer, max_tokens=limit, extra_metadata=extra)
        if tokenized is None:
            stats.dropped["too_long"] += 1
            continue
        if cfg.drop_long and tokenized.metadata["truncated"]:
            stats.dropped["too_long"] += 1
            continue
        if cfg.dedupe:
            digest = tokenized.digest()
            if digest in seen:
                stats.dropped["duplicate"] += 1
                continue
            seen.add(digest)
        if cfg.verify:
            problems = verify_sample(tokenized, renderer)
            if problems:
                raise ValueError(
                    f"mask verification failed for {sample.instance_id} "
                    f"(attempt {sample.attempt}): {'; '.join(problems)}"
                )
            stats.verified += 1
        stats.kept += 1
        stats.truncated += int(bool(tokenized.metadata["truncated"]))
        stats.tokens += len(tokenized.input_ids)
        stats.trained_tokens += tokenized.trained_tokens
        out.append(tokenized)
    return out, stats


def write_records(
    samples: Sequence[TokenizedSample], path: str | os.PathLike[str], fmt: Format = "tokens"
) -> Path:
    """Write the samples' records: parquet for a ``.parquet`` path, else JSON lines.

    In parquet, ``tools`` and ``metadata`` are JSON strings (their shapes vary from row
    to row; TRL parses a string ``tools`` column itself).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    records = [s.record(fmt) for s in samples]
    if target.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = []
        for rec in records:
            row = dict(rec)
            row["metadata"] = json.dumps(rec["metadata"], ensure_ascii=False)
            if "tools" in row:
                row["tools"] = json.dumps(rec["tools"], ensure_ascii=False)
            rows.append(row)
        pq.write_table(pa.Table.from_pylist(rows), target)
        return target
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        for rec in records:
            handle.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
    os.replace(tmp, target)
    return target
