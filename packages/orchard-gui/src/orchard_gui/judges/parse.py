"""Tolerant readers of judge model replies (markdown, extra prose, odd casing)."""

from __future__ import annotations

import re
from typing import Final

__all__ = ["UNKNOWN", "parse_key_points", "parse_score", "parse_verdict"]

UNKNOWN: Final = "unknown"
"""The verdict when a reply states neither success nor failure."""

_KEY_POINTS_HEADER = re.compile(r"key\s*points?\s*\**\s*:?\s*\**", re.IGNORECASE)
_ITEM = re.compile(r"^\s*(?:\d+\s*[.):]|[-*\u2022])\s+(.*\S)\s*$")
_SCORE = re.compile(
    r"score\W{0,6}(?:is|of|=)?\s*\**\s*([1-5](?:\.\d+)?)(?!\d)(?:\s*/\s*5)?", re.IGNORECASE
)
_BARE_SCORE = re.compile(r"^\W*([1-5])(?:\s*/\s*5)?\W*$")
_LABELLED_VERDICT = re.compile(
    r"(?:status|verdict|outcome)\W{0,6}"
    r"(success(?:ful)?|succeeded|failure|failed|fail|not\s+success(?:ful)?|unsuccessful)\b",
    re.IGNORECASE,
)
_BARE_VERDICT = re.compile(
    r"^\W*(success(?:ful)?|failure|failed|fail|not\s+success(?:ful)?|unsuccessful)\W*$",
    re.IGNORECASE,
)


def _strip_markup(text: str) -> str:
    return text.replace("**", "").replace("__", "").replace("`", "")


def parse_key_points(text: str) -> list[str]:
    """The numbered or bulleted items of a key-points reply.

    Reads the items after a ``Key Points:`` header when there is one, else every item in
    the reply; with no list at all, the non-empty lines. Empty when the reply is empty.
    """
    body = _strip_markup(text)
    header = _KEY_POINTS_HEADER.search(body)
    if header:
        body = body[header.end() :]
    lines = body.splitlines()
    items = [m.group(1).strip() for line in lines if (m := _ITEM.match(line))]
    if items:
        return items
    return [line.strip() for line in lines if line.strip()]


def parse_score(text: str) -> int | None:
    """The 1-5 relevance score of a screenshot reply (the last ``Score: N``), or None.

    A fractional score is rounded (``3.5`` counts as 4); a reply that is only a digit
    counts too.
    """
    body = _strip_markup(text)
    found = _SCORE.findall(body)
    if found:
        return min(5, max(1, round(float(found[-1]) + 1e-9)))
    lines = [line for line in body.splitlines() if line.strip()]
    if lines and (bare := _BARE_SCORE.match(lines[-1])):
        return int(bare.group(1))
    return None


def _normalise(word: str) -> str:
    word = " ".join(word.lower().split())
    return "success" if word in ("success", "successful", "succeeded") else "failure"


def parse_verdict(text: str) -> str:
    """``"success"``, ``"failure"`` or :data:`UNKNOWN` from a verdict reply.

    Reads the last labelled verdict (``Status: success``, ``**Verdict**: FAILURE``,
    ``Status: not successful``...); without a label, a last line that is only the word.
    Prose that merely mentions success is not a verdict.
    """
    body = _strip_markup(text)
    found = _LABELLED_VERDICT.findall(body)
    if found:
        return _normalise(found[-1])
    lines = [line for line in body.splitlines() if line.strip()]
    if lines and (bare := _BARE_VERDICT.match(lines[-1])):
        return _normalise(bare.group(1))
    return UNKNOWN
