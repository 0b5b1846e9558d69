"""CLI: ``orchard-env-agent [--host H] [--port P] [--multi] ...`` runs the agent on uvicorn."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import sys

import uvicorn

from . import enter
from .app import create_app
from .config import Settings, parse_args
from .oslimits import raise_open_file_limit


def _write_port_file(path: str, port: int) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(str(port))
    os.replace(tmp, path)


def _listen(settings: Settings) -> tuple[socket.socket, str]:
    if settings.uds:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(settings.uds)  # a socket left by an earlier run of this sandbox
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(settings.uds)
        # The orchestrator may run as another user than the image's; the token guards it.
        os.chmod(settings.uds, 0o666)
        where = settings.uds
    else:
        family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((settings.host, settings.port))
        where = f"{settings.host}:{sock.getsockname()[1]}"
    sock.listen(1024)
    sock.set_inheritable(False)
    return sock, where


def main(argv: list[str] | None = None) -> None:
    settings = parse_args(argv)
    raise_open_file_limit()
    if settings.multi:
        enter.helper()  # build it now (once per version) rather than on the first command
    sock, where = _listen(settings)
    config = uvicorn.Config(
        create_app(settings),
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
        ws="websockets-sansio",
        access_log=False,
        log_level="warning",
        lifespan="on",
        timeout_keep_alive=75,
        proxy_headers=False,  # nothing reads the caller's address: skip the rewriting layer
    )
    server = uvicorn.Server(config)
    if settings.port_file and not settings.uds:
        _write_port_file(settings.port_file, sock.getsockname()[1])
    print(f"orchard-env-agent listening on {where}", file=sys.stderr, flush=True)
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
