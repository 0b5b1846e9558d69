"""A real orchestrator process for tests: start, stop, kill, restart on one state dir."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import attrs
import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@attrs.define
class RunningServer:
    """One orchestrator process; ``restart`` keeps its state dir, like a real restart."""

    backend: str
    state_dir: Path
    api_keys: str | None = None
    port: int = attrs.Factory(free_port)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *extra: str) -> None:
        self.log_path = self.state_dir.parent / f"server-{self.port}-{time.monotonic_ns()}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_ENV_")}
        if self.api_keys:
            env["ORCHARD_ENV_API_KEYS"] = self.api_keys
        argv = [
            sys.executable, "-m", "orchard_env_server.cli", "serve",
            "--backend", self.backend, "--port", str(self.port),
            "--state-dir", str(self.state_dir), *extra,
        ]  # fmt: skip
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server did not become healthy:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)
