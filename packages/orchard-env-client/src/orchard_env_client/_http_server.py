"""A standard-library HTTP server on 127.0.0.1 in a background thread (test servers, the
recording proxy): lifetime, a free port, and the few answers every handler writes."""

from __future__ import annotations

import json
import threading
import types
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

MAX_BODY = 64 * 1024 * 1024
"""Largest request body read (a bigger one is answered 413)."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many harnesses connecting at once


class BackgroundServer:
    """Serves a handler class on ``127.0.0.1:<free port>`` from a daemon thread."""

    _thread_name = "http-server"

    def __init__(self) -> None:
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    @property
    def port(self) -> int:
        """The port served on."""
        if self._httpd is None:
            raise RuntimeError("the server is not running")
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        """Start serving in a background thread (it accepts connections on return)."""
        if self._httpd is not None:
            raise RuntimeError("the server is already running")
        httpd = _Server(("127.0.0.1", 0), self._handler())
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, name=self._thread_name
        )
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and join the thread."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        self.stop()


class Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 handler with JSON, error and chunked-streaming answers."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send_json(self, status: int, payload: Mapping[str, Any]) -> None:
        """A complete JSON answer."""
        data = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_error_json(
        self, status: int, message: str, kind: str = "invalid_request_error"
    ) -> None:
        """An OpenAI-style error answer."""
        self.send_json(status, {"error": {"message": message, "type": kind, "code": status}})

    def start_stream(self, status: int, headers: Mapping[str, str]) -> None:
        """Send the head of a chunked answer (write parts with :meth:`write_chunk`)."""
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def write_chunk(self, data: bytes) -> None:
        """One chunk of a chunked answer, sent at once (no buffering)."""
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_stream(self) -> None:
        """The last chunk of a chunked answer."""
        self.wfile.write(b"0\r\n\r\n")

    def read_body(self) -> bytes | None:
        """The request body (Content-Length or chunked); None after answering 413."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts: list[bytes] = []
            size = 0
            while True:
                length = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if length == 0:
                    while self.rfile.readline().strip():  # trailers
                        pass
                    return b"".join(parts)
                size += length
                if size > MAX_BODY:
                    self.close_connection = True
                    self.send_error_json(413, "the request body is too large")
                    return None
                parts.append(self.rfile.read(length))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self.close_connection = True
            self.send_error_json(413, "the request body is too large")
            return None
        return self.rfile.read(length)
