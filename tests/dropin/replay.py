"""Play recorded public-SDK exchanges against a server and say where it answers otherwise.

Each scenario's exchanges are grouped by the sandbox they concern (their "thread") and the
threads run at once, as the SDK's concurrent examples do; within a thread, in recorded order.
Ids are put back from the answers (``sandbox_id``/``job_id``); every answer must have the
recorded status code, be JSON, have each field the SDK reads with its type, and reproduce the
recorded example-visible results. Terminal sessions send the recorded frames on the recorded
schedule (after ``ready``) and must answer ``ready``, output, ``exit`` with the recorded code.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlencode

import httpx
from dropin.exchanges import API_KEY_PLACEHOLDER, problems, put_back
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

_READY_S = 10.0
_END_S = 20.0


class Replay:
    """One scenario played against ``url`` (a server whose API key is ``api_key``)."""

    def __init__(self, url: str, api_key: str, scenario: dict[str, Any]) -> None:
        self.url = url
        self.api_key = api_key
        self.scenario = scenario
        self.ids: dict[str, str] = {}
        self.problems: list[str] = []
        self._lock = threading.Lock()
        self.terminal_output: list[str] = []  # each session's output, for the tests' own checks

    def run(self) -> list[str]:
        threads: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
        for exchange in sorted(self.scenario["exchanges"], key=lambda e: e["seq"]):
            threads[exchange["thread"]].append(exchange)
        with ThreadPoolExecutor(max_workers=len(threads)) as pool:
            list(pool.map(self._thread, threads.values()))
        return self.problems

    def _fail(self, exchange: dict[str, Any], message: str) -> None:
        with self._lock:
            self.problems.append(f"#{exchange['seq']} {exchange['endpoint']}: {message}")

    def _thread(self, exchanges: list[dict[str, Any]]) -> None:
        for exchange in exchanges:
            try:
                if exchange["kind"] == "http":
                    self._http(exchange)
                else:
                    self._terminal(exchange)
            except (httpx.HTTPError, OSError, KeyError, TimeoutError) as exc:
                self._fail(exchange, f"{type(exc).__name__}: {exc}")
                return  # later exchanges of this sandbox would only repeat the failure

    def _put_back(self, value: Any) -> Any:
        with self._lock:
            ids = dict(self.ids)
        return put_back(value, ids)

    def _query(self, pairs: list[list[str]]) -> list[tuple[str, str]]:
        return [
            (k, self.api_key if v == API_KEY_PLACEHOLDER else self._put_back(v)) for k, v in pairs
        ]

    def _learn(self, recorded: Any, answer: Any) -> None:
        if not isinstance(recorded, dict) or not isinstance(answer, dict):
            return
        with self._lock:
            for key in ("sandbox_id", "job_id"):
                placeholder, real = recorded.get(key), answer.get(key)
                if isinstance(placeholder, str) and placeholder.startswith("{{") and real:
                    self.ids.setdefault(placeholder, real)

    def _http(self, exchange: dict[str, Any]) -> None:
        request, recorded = exchange["request"], exchange["response"]
        headers = {"X-API-Key": self.api_key} if request["auth"] == "header" else {}
        content = None
        if "json" in request:
            content = json.dumps(self._put_back(request["json"])).encode()
            headers["Content-Type"] = "application/json"
        elif "raw_bytes" in request:
            content = b"x" * request["raw_bytes"]
        answer = httpx.request(
            request["method"],
            self.url + self._put_back(request["path"]),
            params=self._query(request["query"]),
            content=content,
            headers=headers,
            timeout=600,
        )
        if answer.status_code != recorded["status"]:
            self._fail(
                exchange,
                f"status {answer.status_code}, recorded {recorded['status']}: {answer.text[:300]}",
            )
            return
        try:
            body = answer.json()
        except ValueError:
            self._fail(
                exchange,
                f"the answer is not JSON (the SDK parses every answer): {answer.text[:200]!r}",
            )
            return
        where = f"#{exchange['seq']} {exchange['endpoint']}"
        with self._lock:
            self.problems += problems(recorded["reads"], body, where)
        for key, want in recorded["expect"].items():
            got = _expected_field(key, body)
            if got != want:
                self._fail(exchange, f"{key} is {got!r}, the example saw {want!r}")
        self._learn(recorded.get("json"), body)

    def _terminal(self, exchange: dict[str, Any]) -> None:
        request = exchange["request"]
        query = self._query(request["query"])
        url = self.url.replace("http://", "ws://", 1) + self._put_back(request["path"])
        if query:
            url += "?" + urlencode(query)
        headers = {"X-API-Key": self.api_key} if request["auth"] == "header" else {}
        try:
            with connect(url, additional_headers=headers, open_timeout=30, max_size=None) as ws:
                if not exchange["accepted"]:
                    self._fail(exchange, "the handshake was accepted; the recording was refused")
                heard = self._session(ws, exchange["frames"])
        except InvalidStatus as exc:
            if exchange["accepted"]:
                self._fail(exchange, f"the handshake was refused: {exc}")
            return
        self._check_terminal(exchange, heard.frames)

    def _session(self, ws: Any, frames: list[dict[str, Any]]) -> _Heard:
        heard = _Heard()

        def read() -> None:
            try:
                for data in ws:
                    heard.add(json.loads(data) if isinstance(data, str) else {"binary": len(data)})
            except (ConnectionClosed, ValueError):
                pass
            heard.add(None)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            self._send_schedule(ws, frames, heard)
            reader.join(_END_S)
        finally:
            ws.close()
            reader.join(5)
        return heard

    @staticmethod
    def _send_schedule(ws: Any, frames: list[dict[str, Any]], heard: _Heard) -> None:
        """The client's frames (and close) as recorded: each once the server frames that
        came before it in the recording have come (the types, and as many output bytes:
        the SDK's calls wait for them), and not before its recorded delay after ``ready``."""
        types: set[str] = set()
        output = 0
        ready_at = started = None
        for frame in frames:
            body = frame.get("json", {})
            if frame["dir"] == "s2c":
                if body.get("type") == "stdout":
                    output += len(base64.b64decode(body.get("data", "")))
                elif body.get("type"):
                    types.add(body["type"])
                    if body["type"] == "ready":
                        ready_at = frame["t"]
                continue
            if "close" not in frame and not heard.wait(types, output):
                raise TimeoutError(
                    f"the server did not answer {sorted(types)} and {output} "
                    f"bytes of output within {_READY_S:g} s"
                )
            if ready_at is not None:
                if started is None:
                    started = heard.ready_at or time.monotonic()
                time.sleep(max(0.0, started + frame["t"] - ready_at - time.monotonic()))
            if "close" in frame:
                heard.wait(types, output)  # the SDK closes once it has what it read
                ws.close()
                return
            try:
                if "json" in frame:
                    ws.send(json.dumps(frame["json"]))
                elif "text" in frame:
                    ws.send(frame["text"])
                else:
                    ws.send(b"x" * frame["raw_bytes"])
            except ConnectionClosed:
                return

    def _check_terminal(self, exchange: dict[str, Any], received: list[dict[str, Any]]) -> None:
        where = f"#{exchange['seq']} pty"
        texts = [f for f in received if "binary" not in f]
        if len(texts) != len(received):
            self._fail(exchange, "binary frames in the JSON protocol")
        for frame in texts:
            reads = exchange["reads"].get(frame.get("type"), {})
            with self._lock:
                self.problems += problems(reads, frame, f"{where} {frame.get('type')} frame")
        types = [f.get("type") for f in texts]
        stdout = b"".join(
            base64.b64decode(f.get("data", "")) for f in texts if f.get("type") == "stdout"
        ).decode(errors="replace")
        with self._lock:
            self.terminal_output.append(stdout)
        expect = exchange["expect"]
        code = next((f.get("code") for f in texts if f.get("type") == "exit"), None)
        seen = {
            "first": types[0] if types else None,
            "last": types[-1] if types else None,
            "exit_code": code,
            "stdout": stdout,
        }
        for key, want in expect.items():
            if seen[key] != want:
                self._fail(exchange, f"{key} is {seen[key]!r}, the example saw {want!r}")


class _Heard:
    """What a terminal session has received so far; ``None`` marks its end."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.ready_at: float | None = None
        self._types: set[str] = set()
        self._output = 0
        self._ended = False
        self._changed = threading.Condition()

    def add(self, frame: dict[str, Any] | None) -> None:
        with self._changed:
            if frame is None:
                self._ended = True
            else:
                self.frames.append(frame)
                kind = frame.get("type")
                if kind == "stdout":
                    self._output += len(base64.b64decode(frame.get("data", "")))
                elif isinstance(kind, str):
                    self._types.add(kind)
                    if kind == "ready":
                        self.ready_at = time.monotonic()
            self._changed.notify_all()

    def wait(self, types: set[str], output: int) -> bool:
        """Until these frame types and this much output came (or the session ended)."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._ended or (types <= self._types and self._output >= output),
                _READY_S,
            )


def _expected_field(key: str, body: dict[str, Any]) -> Any:
    if key == "stdout_lines":
        return sorted(str(body.get("stdout", "")).splitlines())
    if key == "entries":
        return sorted([f.get("name"), f.get("type")] for f in body.get("files", []))
    return body.get(key)
