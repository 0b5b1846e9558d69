"""Per-stream output buffer keeping the head and the tail beyond a byte cap."""

from __future__ import annotations

MARKER = "\n[... {n} bytes truncated ...]\n"


def _trim_incomplete_end(data: bytes) -> bytes:
    """Drop a UTF-8 sequence cut off at the end (at most 3 bytes)."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b < 0x80:
            return data
        if b >= 0xC0:  # lead byte: is its sequence complete?
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return data if back >= need else data[:-back]
    return data


def _trim_incomplete_start(data: bytes) -> bytes:
    """Drop continuation bytes at the start (at most 3)."""
    i = 0
    while i < min(3, len(data)) and 0x80 <= data[i] < 0xC0:
        i += 1
    return data[i:]


class CappedBuffer:
    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def write(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.tail_cap:
                del self.tail[: len(self.tail) - self.tail_cap]

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def text(self) -> str:
        if not self.truncated:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", "replace")
        tail = bytes(self.tail[-self.tail_cap :])
        dropped = self.total - len(self.head) - len(tail)
        head = _trim_incomplete_end(bytes(self.head))
        tail = _trim_incomplete_start(tail)
        return (
            head.decode("utf-8", "replace")
            + MARKER.format(n=dropped)
            + tail.decode("utf-8", "replace")
        )
