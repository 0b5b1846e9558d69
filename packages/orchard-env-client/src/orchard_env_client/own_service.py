"""An Orchard Env service for a command that was given none: ``orchard-env serve``, briefly.

A recipe talks to the service only over REST (it depends on the client alone), so a
throwaway service is the ``orchard-env`` command line in a subprocess (installed with the
server package), on a free loopback
port and a temporary state directory, stopped (its sandboxes deleted) when the block ends.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence

import httpx

__all__ = ["answers", "service", "started"]

Say = Callable[[str], object]
"""Where progress lines go (``print``, ``rich.console.Console.print``...)."""


def answers(url: str) -> bool:
    """Whether an Orchard Env service answers ``/health`` at ``url``."""
    try:
        return httpx.get(url.rstrip("/") + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def started(
    backend: str = "local", say: Say | None = None, serve_args: Sequence[str] = ()
) -> Iterator[str]:
    """A new ``orchard-env serve --backend BACKEND [SERVE_ARGS]`` for the block; yields
    its URL."""
    exe = shutil.which("orchard-env")
    if exe is None:
        raise RuntimeError("no Orchard Env service given, and `orchard-env` is not installed")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="orchard-env-service-") as state:
        if say is not None:
            say(f"starting `orchard-env serve --backend {backend}` on port {port}")
        log_path = f"{state}/serve.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [
                    exe,
                    "serve",
                    "--backend",
                    backend,
                    "--port",
                    str(port),
                    "--state-dir",
                    f"{state}/s",
                    *serve_args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        own = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while not answers(own):
                if proc.poll() is not None or time.monotonic() > deadline:
                    with open(log_path, errors="replace") as fh:
                        tail = fh.read()[-2000:]
                    raise RuntimeError(
                        f"the orchard-env service on port {port} did not start:\n{tail}"
                    )
                time.sleep(0.1)
            yield own
        finally:
            proc.terminate()  # the service deletes its sandboxes as it stops
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@contextlib.contextmanager
def service(
    url: str, say: Say | None = None, backend: str = "local", serve_args: Sequence[str] = ()
) -> Iterator[str]:
    """The service at ``url``, or a temporary one on ``backend`` (``orchard-env serve``
    given ``serve_args`` too) when nothing answers there."""
    if answers(url):
        yield url
        return
    if say is not None:
        say(f"no service at {url}")
    with started(backend, say, serve_args) as own:
        yield own
