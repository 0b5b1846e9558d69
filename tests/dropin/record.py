"""Record what the public Orchard Env SDK's own examples send to our server, and what it reads.

Run by ``scripts/record-public-sdk`` (which sets up the SDK's virtualenv): starts our server
on the Docker backend, puts a recording proxy of ours in front of it, runs the checkout's
``examples/getting_started.py`` (each example on its own) and its concurrency benchmarks
(small sizes) through the proxy, and writes every HTTP and WebSocket exchange, ids replaced
by placeholders, with the fields the SDK reads from each answer, to
``tests/dropin/public_sdk_exchanges.json``. The replay test (``test_public_sdk_replay.py``)
plays them back against every backend.

    python tests/dropin/record.py CHECKOUT SDK_PYTHON [--out FILE] [--backend docker]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import httpx
import uvicorn
import websockets
from dropin.exchanges import API_KEY_PLACEHOLDER, IdNames
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from orchard_testing import RunningServer, free_port

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "public_sdk_exchanges.json"
API_KEY = "dropin-recording-key"
_HOP = {
    "host",
    "content-length",
    "connection",
    "transfer-encoding",
    "content-encoding",
    "keep-alive",
    "upgrade",
}

# (name, argv relative to the checkout); {proxy} is the proxy's URL, {tmp} a scratch dir.
EXAMPLES = [
    "basic",
    "files",
    "env",
    "patch",
    "resources",
    "errors",
    "session",
    "pty",
    "async",
    "concurrent",
    "pty-async",
]
SCENARIOS: list[tuple[str, list[str]]] = [
    *((f"getting_started {name}", ["examples/getting_started.py", name]) for name in EXAMPLES),
    (
        "bench_concurrent",
        [
            "tests/integration/bench_concurrent.py",
            "--url",
            "{proxy}",
            "--num",
            "2",
            "--image",
            "python:3.11-slim",
            "--save-timing",
            "{tmp}/timing.json",
        ],
    ),
    (
        "bench_concurrent_pty",
        [
            "tests/integration/bench_concurrent_pty.py",
            "--url",
            "{proxy}",
            "--num",
            "2",
            "--image",
            "ubuntu:22.04",
            "--save-timing",
            "{tmp}/pty_timing.json",
        ],
    ),
]

# What the SDK reads from each answer (orchard_env/client/sandbox_client.py), or, for answers
# it hands to the caller whole (upload, apply_patch), what the public API documents.
JOB = {
    "job_id": "str",
    "sandbox_id": "str",
    "command": "str|list",
    "status": "str",
    "created_at": "number",
    "stdout": "str|absent",
    "stderr": "str|absent",
    "exit_code": "int|null|absent",
    "error": "str|null|absent",
    "started_at": "number|null|absent",
    "completed_at": "number|null|absent",
}
SANDBOX = {
    "sandbox_id": "str",
    "status": "str",
    "ready": "bool|absent",
    "status_message": "str|null|absent",
    "namespace": "any|absent",
    "image": "any|absent",
    "block_network": "any|absent",
}
ENDPOINTS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("GET", r"/health", "health", {}),
    ("POST", r"/sandboxes", "create", {"sandbox_id": "str", "timeout": "number|absent"}),
    ("GET", r"/sandboxes/[^/]+/wait", "wait", SANDBOX),
    ("GET", r"/sandboxes/[^/]+", "get", SANDBOX),
    ("DELETE", r"/sandboxes/[^/]+", "delete", {}),
    ("POST", r"/sandboxes/[^/]+/heartbeat", "heartbeat", {}),
    ("POST", r"/sandboxes/[^/]+/exec", "exec", {"status": "str", "job_id": "str"}),
    ("GET", r"/jobs/[^/]+(/wait)?", "job", JOB),
    (
        "POST",
        r"/sandboxes/[^/]+/apply_patch",
        "apply_patch",
        {"success": "bool", "stdout": "str", "stderr": "str", "exit_code": "int|null"},
    ),
    (
        "POST",
        r"/sandboxes/[^/]+/files",
        "upload",
        {"success": "bool", "path": "str", "size": "int"},
    ),
    (
        "GET",
        r"/sandboxes/[^/]+/files",
        "download",
        {"path": "str", "content": "str", "size": "int"},
    ),
    (
        "GET",
        r"/sandboxes/[^/]+/files/list",
        "list",
        {
            "path": "str",
            "files": "list",
            "files[]": {"name": "str", "type": "str", "size": "int"},
        },
    ),
]
WS_READS = {
    "ready": {"pid": "int|null"},
    "stdout": {"data": "str"},
    "exit": {"code": "int"},
    "error": {"message": "str"},
}
# Output that differs between backends or runs: listings with times or host entries, the
# machine's CPUs and memory, pids, commit hashes. `find` lists in directory order: sorted.
_VOLATILE = re.compile(r"ls -la|ls /|/proc/|\$\$|git commit")
_UNORDERED = re.compile(r"^find ")


def endpoint(method: str, path: str) -> tuple[str, dict[str, Any]]:
    for m, pattern, name, reads in ENDPOINTS:
        if m == method and re.fullmatch(pattern, path):
            return name, reads
    return "unknown", {}


def _command_text(command: Any) -> str:
    return " ".join(command) if isinstance(command, list) else str(command)


def expectations(name: str, request: dict[str, Any], answer: Any) -> dict[str, Any]:
    """The example-visible results a replay must reproduce exactly."""
    if not isinstance(answer, dict):
        return {}
    if name in ("exec", "job") and answer.get("status") in ("succeeded", "failed"):
        expect = {"status": answer["status"], "exit_code": answer.get("exit_code")}
        command = _command_text(answer.get("command") or (request.get("json") or {}).get("command"))
        if _UNORDERED.search(command):
            expect["stdout_lines"] = sorted(answer.get("stdout", "").splitlines())
        elif not _VOLATILE.search(command):
            expect["stdout"] = answer.get("stdout", "")
        return expect
    if name in ("wait", "get"):  # a create may answer pending or ready, by backend
        return {"status": answer.get("status")}
    if name == "download":
        return {"content": answer.get("content")}
    if name == "list":
        return {"entries": sorted([f.get("name"), f.get("type")] for f in answer.get("files", []))}
    if name == "apply_patch":
        return {"success": answer.get("success"), "exit_code": answer.get("exit_code")}
    if name == "upload":
        return {"size": answer.get("size")}
    return {}


def ws_expectations(frames: list[dict[str, Any]], init: dict[str, Any]) -> dict[str, Any]:
    types, stdout, code = [], b"", None
    for frame in frames:
        if frame["dir"] != "s2c" or "json" not in frame:
            continue
        body = frame["json"]
        types.append(body.get("type"))
        if body.get("type") == "stdout":
            stdout += base64.b64decode(body.get("data", ""))
        elif body.get("type") == "exit":
            code = body.get("code")
    expect: dict[str, Any] = {
        "first": types[0] if types else None,
        "last": types[-1] if types else None,
    }
    if code is not None:
        expect["exit_code"] = code
    if not _VOLATILE.search(_command_text(init.get("cmd", ""))):
        expect["stdout"] = stdout.decode(errors="replace")
    return expect


class Proxy:
    """An HTTP and WebSocket proxy to ``upstream`` that keeps every exchange it relays."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._seq = 0
        self._t0 = time.monotonic()
        self.app = Starlette(
            routes=[
                WebSocketRoute("/{path:path}", self.websocket),
                Route(
                    "/{path:path}",
                    self.http,
                    methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"],
                ),
            ]
        )
        self._client: httpx.AsyncClient | None = None

    def reset(self) -> list[dict[str, Any]]:
        with self._lock:
            events, self.events, self._seq = self.events, [], 0
            self._t0 = time.monotonic()
        return events

    def _event(self, kind: str) -> dict[str, Any]:
        with self._lock:
            event = {"seq": self._seq, "t": round(time.monotonic() - self._t0, 4), "kind": kind}
            self._seq += 1
            self.events.append(event)
        return event

    @staticmethod
    def _request_facts(scope: dict[str, Any], headers: Any) -> dict[str, Any]:
        query = parse_qsl(scope["query_string"].decode(), keep_blank_values=True)
        if headers.get("x-api-key") or headers.get("authorization"):
            auth = "header"
        elif any(k == "api_key" for k, _ in query):
            auth = "query"
        else:
            auth = "none"
        query = [[k, API_KEY_PLACEHOLDER if k == "api_key" else v] for k, v in query]
        return {"path": scope["path"], "query": query, "auth": auth}

    async def http(self, request: Request) -> Response:
        if self._client is None:
            self._client = httpx.AsyncClient(base_url=self.upstream, timeout=None)
        event = self._event("http")
        body = await request.body()
        facts = {"method": request.method, **self._request_facts(request.scope, request.headers)}
        if body:
            try:
                facts["json"] = json.loads(body)
            except ValueError:
                facts["raw_bytes"] = len(body)
        event["request"] = facts
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        target = request.scope["raw_path"].decode()
        if request.scope["query_string"]:
            target += "?" + request.scope["query_string"].decode()
        answer = await self._client.request(request.method, target, content=body, headers=headers)
        response: dict[str, Any] = {"status": answer.status_code}
        try:
            response["json"] = answer.json()
        except ValueError:
            response["raw_bytes"] = len(answer.content)
        event["response"] = response
        out = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
        return Response(answer.content, status_code=answer.status_code, headers=out)

    async def websocket(self, ws: WebSocket) -> None:
        event = self._event("ws")
        event["request"] = self._request_facts(ws.scope, ws.headers)
        url = self.upstream.replace("http://", "ws://", 1) + ws.scope["raw_path"].decode()
        if ws.scope["query_string"]:
            url += "?" + ws.scope["query_string"].decode()
        headers = {
            k: v for k, v in ws.headers.items() if k.lower() in ("x-api-key", "authorization")
        }
        frames: list[dict[str, Any]] = []
        event["frames"] = frames
        try:
            upstream = await websockets.connect(url, additional_headers=headers, max_size=None)
        except websockets.InvalidStatus as exc:
            event["accepted"] = False
            event["status"] = exc.response.status_code
            await ws.close(code=1008)
            return
        event["accepted"] = True
        await ws.accept(subprotocol=upstream.subprotocol)
        opened = time.monotonic()

        def keep(direction: str, **what: Any) -> None:
            frames.append({"dir": direction, "t": round(time.monotonic() - opened, 4), **what})

        def frame_facts(data: str | bytes) -> dict[str, Any]:
            if isinstance(data, bytes):
                return {"raw_bytes": len(data)}
            try:
                return {"json": json.loads(data)}
            except ValueError:
                return {"text": data}

        async def client_to_upstream() -> None:
            with contextlib.suppress(websockets.ConnectionClosed):
                while True:
                    message = await ws.receive()
                    if message["type"] == "websocket.disconnect":
                        keep("c2s", close=message.get("code"))
                        return
                    data = message.get("bytes")
                    data = data if data is not None else message.get("text", "")
                    keep("c2s", **frame_facts(data))
                    await upstream.send(data)

        async def upstream_to_client() -> None:
            with contextlib.suppress(
                websockets.ConnectionClosed, WebSocketDisconnect, RuntimeError
            ):
                async for data in upstream:
                    keep("s2c", **frame_facts(data))
                    if isinstance(data, bytes):
                        await ws.send_bytes(data)
                    else:
                        await ws.send_text(data)
            if upstream.close_code is not None:
                keep("s2c", close=upstream.close_code)

        tasks = [
            asyncio.create_task(client_to_upstream()),
            asyncio.create_task(upstream_to_client()),
        ]
        _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await upstream.close()
        with contextlib.suppress(Exception):
            await ws.close(code=upstream.close_code or 1000)


def finish(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], IdNames]:
    """Ids to placeholders; each exchange gets its endpoint, thread, SDK reads and expectations."""
    names = IdNames()
    for event in sorted(events, key=lambda e: e["seq"]):
        if event["kind"] == "http":
            names.learn(event["response"].get("json"))
    job_sandbox = {}
    done = []
    for event in sorted(events, key=lambda e: e["seq"]):
        event = names.hide(event)
        request = event["request"]
        if event["kind"] == "http":
            name, reads = endpoint(request["method"], request["path"])
            answer = event["response"].get("json")
            event["endpoint"] = name
            event["response"]["reads"] = reads
            event["response"]["expect"] = expectations(name, request, answer)
            if isinstance(answer, dict) and "job_id" in answer and "sandbox_id" in answer:
                job_sandbox[answer["job_id"]] = answer["sandbox_id"]
            sandbox = answer.get("sandbox_id") if isinstance(answer, dict) else None
        else:
            event["endpoint"] = "pty"
            init = next(
                (f["json"] for f in event["frames"] if f["dir"] == "c2s" and "json" in f), {}
            )
            event["reads"] = WS_READS
            event["expect"] = ws_expectations(event["frames"], init)
            sandbox = None
        found = re.match(r"/(sandboxes|jobs)/([^/]+)", request["path"])
        if found and found.group(1) == "sandboxes":
            sandbox = found.group(2)
        elif found:
            sandbox = job_sandbox.get(found.group(2), sandbox)
        event["thread"] = sandbox
        done.append(event)
    return done, names


def run_scenario(
    proxy: Proxy, url: str, checkout: Path, python: str, argv: list[str], tmp: Path
) -> tuple[int, str, list[dict[str, Any]]]:
    proxy.reset()
    env = {
        **os.environ,
        "SANDBOX_BASE_URL": url,
        "SANDBOX_API_KEY": API_KEY,
        "PYTHONUNBUFFERED": "1",
    }
    args = [a.format(proxy=url, tmp=tmp) for a in argv]
    done = subprocess.run(
        [python, *args], cwd=checkout, env=env, capture_output=True, text=True, timeout=900
    )
    time.sleep(0.5)  # the last WebSocket closes behind the client's back
    exchanges, names = finish(proxy.reset())
    return done.returncode, names.hide(done.stdout + done.stderr), exchanges


def commit_of(checkout: Path) -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if done.returncode == 0:
            return done.stdout.strip()
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "checkout", type=Path, help="the SDK's folder (orchard_env/ of microsoft/Orchard)"
    )
    parser.add_argument("python", help="a python with that SDK's dependencies installed")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--backend", default="docker")
    parser.add_argument("--only", action="append", help="scenario name (repeatable)")
    parser.add_argument("--commit", help="the checkout's commit, when it is no git work tree")
    args = parser.parse_args()
    checkout = args.checkout.resolve()
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"record-public-sdk-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    server = RunningServer(backend=args.backend, state_dir=tmp / "state", api_keys=API_KEY)
    server.start()
    proxy = Proxy(server.url)
    port = free_port()
    config = uvicorn.Config(
        proxy.app, host="127.0.0.1", port=port, log_level="warning", ws_max_size=64 * 1024 * 1024
    )
    web = uvicorn.Server(config)
    thread = threading.Thread(target=web.run, daemon=True)
    thread.start()
    while not web.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    scenarios = []
    failed = []
    try:
        for name, argv in SCENARIOS:
            if args.only and name not in args.only:
                continue
            t0 = time.monotonic()
            code, output, exchanges = run_scenario(proxy, url, checkout, args.python, argv, tmp)
            print(
                f"{name}: exit {code}, {len(exchanges)} exchanges, {time.monotonic() - t0:.1f} s",
                file=sys.stderr,
            )
            if code != 0:
                failed.append(name)
                print(output[-3000:], file=sys.stderr)
            scenario: dict[str, Any] = {
                "name": name,
                "argv": argv,
                "exit_code": code,
                "exchanges": exchanges,
            }
            if name.startswith("getting_started"):
                scenario["output"] = output
            scenarios.append(scenario)
    finally:
        web.should_exit = True
        thread.join(timeout=10)
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    data = {
        "source": {
            "repository": "microsoft/Orchard",
            "path": "orchard_env",
            "commit": args.commit or commit_of(checkout),
        },
        "recorded": {
            "backend": args.backend,
            "images": ["python:3.11-slim", "ubuntu:22.04"],
            "by": "scripts/record-public-sdk",
        },
        "notes": (
            "Placeholders {{sandbox_N}}/{{job_N}} stand for the ids of the answers; "
            "{{api_key}} for the key. 'reads': the fields the SDK reads from an answer "
            "(or the public API documents, for answers the SDK returns whole), as type "
            "specs; 'expect': the example-visible results a replay must reproduce; "
            "WebSocket frames carry 't', seconds since the socket opened."
        ),
        "scenarios": scenarios,
    }
    args.out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    if failed:
        print(f"scenarios that failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
