"""``.dockerignore`` rules: which build-context paths a build leaves out.

Docker's semantics: one pattern per line (``#`` comments, blank lines skipped), each
cleaned and matched against the slash-separated path relative to the context root with
Go's ``filepath.Match`` plus ``**`` for any number of directories; a path is excluded when
the last pattern matching it (or one of its parent directories) is not an ``!`` exception.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["IgnoreRules"]


def _regex(pattern: str) -> re.Pattern[str]:
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):  # "**/" : zero or more whole directories
                i += 1
                out.append("(?:.*/)?")
            else:
                out.append(".*")
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                out.append(re.escape(char))
            else:
                body = pattern[i + 1 : end]
                if body.startswith("^"):
                    body = "!" + body[1:]
                out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
                i = end
        elif char == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(char))
        i += 1
    return re.compile("".join(out) + r"\Z")


@dataclass(frozen=True)
class IgnoreRules:
    """Parsed ``.dockerignore`` patterns, in order, as (is_exception, regex)."""

    rules: tuple[tuple[bool, re.Pattern[str]], ...] = ()

    @classmethod
    def parse(cls, text: str, extra: tuple[str, ...] = ()) -> IgnoreRules:
        """Rules from a ``.dockerignore``'s text, then ``extra`` patterns (``COPY --exclude``)."""
        rules: list[tuple[bool, re.Pattern[str]]] = []
        for raw in [*text.splitlines(), *extra]:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            exception = line.startswith("!")
            line = line[1:].strip() if exception else line
            cleaned = posixpath.normpath(line).lstrip("/")
            if cleaned in ("", "."):
                continue
            rules.append((exception, _regex(cleaned)))
        return cls(tuple(rules))

    @classmethod
    def of_context(cls, context: Path, extra: tuple[str, ...] = ()) -> IgnoreRules:
        """The context's ``.dockerignore`` (none: nothing excluded) plus ``extra``."""
        path = context / ".dockerignore"
        return cls.parse(path.read_text() if path.is_file() else "", extra)

    def __bool__(self) -> bool:
        return bool(self.rules)

    def excludes(self, relative: str) -> bool:
        """Whether the context-relative path ``relative`` is left out of the build."""
        parts = relative.strip("/").split("/")
        excluded = False
        for exception, regex in self.rules:
            for depth in range(1, len(parts) + 1):
                if regex.match("/".join(parts[:depth])):
                    excluded = not exception
                    break
        return excluded
