"""Start the tiny LLM server (:mod:`.tiny_llm_server`) in the tiny-LLM venv, for tests.

The server runs with the venv's python (:func:`orchard_swe.trainers.llm_venv.ensure_llm_venv`)
as ``python -m orchard_swe.testing.tiny_llm_server``, with ``PYTHONPATH`` naming this
checkout's source roots so it can import :mod:`orchard_swe.data.chat_format`. See
``docs/tiny-llm.md``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Final

from ..trainers.llm_venv import ensure_llm_venv, workspace_pythonpath

__all__ = ["SERVER_MODULE", "TinyLLMServer"]

SERVER_MODULE: Final = "orchard_swe.testing.tiny_llm_server"
"""The server, run with ``python -m`` (see :mod:`.tiny_llm_server`)."""


class TinyLLMServer:
    """Run :mod:`orchard_swe.testing.tiny_llm_server` in the tiny-LLM venv; a context manager.

    `start()` ensures the venv, starts the server on a free port and waits until it has
    written its port file (it does so only once the model is loaded); `base_url` is then
    `http://127.0.0.1:PORT/v1`. `stop()` sends SIGTERM (then SIGKILL after a grace).
    """

    def __init__(
        self,
        *,
        max_new_tokens: int = 128,
        startup_timeout_s: float = 120.0,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
    ) -> None:
        self.max_new_tokens = max_new_tokens
        self.startup_timeout_s = startup_timeout_s
        self.extra_args = tuple(extra_args)
        self.log_path = log_path
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("the server is not started")
        return f"http://127.0.0.1:{self.port}/v1"

    def _log_tail(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])

    def start(self) -> TinyLLMServer:
        python = ensure_llm_venv()
        self._tmpdir = tempfile.TemporaryDirectory(prefix="orchard-tiny-llm-")
        port_file = Path(self._tmpdir.name) / "port"
        if self.log_path is None:
            self.log_path = Path(self._tmpdir.name) / "server.log"
        cmd = [
            str(python),
            "-m",
            SERVER_MODULE,
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--max-new-tokens",
            str(self.max_new_tokens),
            *self.extra_args,
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": workspace_pythonpath(), "HF_HUB_OFFLINE": "1"},
            )
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if port_file.exists():
                text = port_file.read_text().strip()
                if text.isdigit():
                    self.port = int(text)
                    return self
            rc = self.proc.poll()
            if rc is not None:
                tail = self._log_tail()
                self.stop()
                raise RuntimeError(f"tiny LLM server exited with {rc} while starting:\n{tail}")
            time.sleep(0.2)
        tail = self._log_tail()
        self.stop()
        raise RuntimeError(
            f"tiny LLM server not ready after {self.startup_timeout_s:.0f}s:\n{tail}"
        )

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None
        self.port = None

    def __enter__(self) -> TinyLLMServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
