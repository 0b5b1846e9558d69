"""Run inside a sandbox by ``test_bridges.py`` (stdlib only: the images have python3, not
always curl): HTTP calls to a service bridge, their outcome printed as JSON.

    python3 bridge_probe.py request METHOD URL [BODY_BYTES]   one call, its answer as JSON
    python3 bridge_probe.py sse URL                           each line as it arrives
    python3 bridge_probe.py connect PORT                      "connected" or the error
"""

from __future__ import annotations

import hashlib
import json
import socket
import sys
import urllib.error
import urllib.request

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def request(method: str, url: str, size: int | None) -> None:
    data = None if size is None else b"x" * size
    headers = {"X-Probe": "yes", "Content-Type": "text/plain"}
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with OPENER.open(req, timeout=300) as answer:
            status, head, body = answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        status, head, body = exc.code, dict(exc.headers), exc.read()
    text = body.decode("utf-8", "replace") if len(body) < 65536 else ""
    out = {
        "status": status,
        "headers": {k.lower(): v for k, v in head.items()},
        "size": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
        "text": text,
    }
    print(json.dumps(out))


def sse(url: str) -> None:
    with OPENER.open(url, timeout=300) as answer:
        for line in answer:
            print(line.decode().rstrip("\n"), flush=True)


def connect(port: int) -> None:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=10).close()
        print("connected")
    except OSError as exc:
        print(type(exc).__name__)


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "request":
        request(args[0], args[1], int(args[2]) if len(args) > 2 else None)
    elif mode == "sse":
        sse(args[0])
    else:
        connect(int(args[0]))
