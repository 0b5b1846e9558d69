"""A tiny JSON records API for claw tasks, run inside the sandbox (stdlib only).

    python3 service.py --port 8765 --state seed.json --persist state.json

State: ``{collection: [record, ...]}``, each record with an ``id`` (POST assigns the next
integer when absent). Routes: ``GET /<c>`` (``?field=value`` filters, compared as text),
``POST /<c>``, ``GET|PUT|PATCH|DELETE /<c>/<id>``; ``GET /_health``, ``GET /_state`` (all
collections), ``POST /_shutdown``. Every change is written to ``--persist``.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

STATE: dict[str, list[dict[str, Any]]] = {}
LOCK = threading.Lock()
PERSIST = ""


def save() -> None:
    tmp = PERSIST + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(STATE, fh, indent=1, sort_keys=True)
    os.replace(tmp, PERSIST)


def next_id(records: list[dict[str, Any]]) -> int:
    ints = [r["id"] for r in records if isinstance(r.get("id"), int)]
    return max(ints, default=0) + 1


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def reply(self, status: int, body: Any) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw.strip() else None

    def route(self, method: str) -> None:
        url = urlsplit(self.path)
        parts = [p for p in url.path.split("/") if p]
        if parts == ["_health"]:
            return self.reply(200, {"ok": True})
        if parts == ["_state"]:
            with LOCK:
                return self.reply(200, STATE)
        if parts == ["_shutdown"] and method == "POST":
            self.reply(200, {"ok": True})
            threading.Thread(target=self.server.shutdown, daemon=True).start()
            return None
        if not parts or len(parts) > 2 or parts[0] not in STATE:
            return self.reply(404, {"error": f"no such collection; have {sorted(STATE)}"})
        try:
            data = self.body() if method in ("POST", "PUT", "PATCH") else None
        except json.JSONDecodeError:
            return self.reply(400, {"error": "the body is not JSON"})
        with LOCK:
            return self.handle_records(method, parts, dict(parse_qsl(url.query)), data)

    def handle_records(
        self, method: str, parts: list[str], query: dict[str, str], data: Any
    ) -> None:
        records = STATE[parts[0]]
        if len(parts) == 1:
            if method == "GET":
                found = [r for r in records if all(str(r.get(k)) == v for k, v in query.items())]
                return self.reply(200, found)
            if method == "POST" and isinstance(data, dict):
                record = {"id": next_id(records), **data}
                records.append(record)
                save()
                return self.reply(201, record)
            return self.reply(405 if method != "POST" else 400, {"error": "bad request"})
        match = [r for r in records if str(r.get("id")) == parts[1]]
        if not match:
            return self.reply(404, {"error": f"no {parts[0]} record with id {parts[1]}"})
        record = match[0]
        if method == "GET":
            return self.reply(200, record)
        if method == "DELETE":
            records.remove(record)
            save()
            return self.reply(200, {"deleted": record["id"]})
        if method in ("PUT", "PATCH") and isinstance(data, dict):
            if method == "PUT":
                keep = record["id"]
                record.clear()
                record["id"] = keep
            record.update({k: v for k, v in data.items() if k != "id"})
            save()
            return self.reply(200, record)
        return self.reply(400, {"error": "expected a JSON object body"})

    def do_GET(self) -> None:
        self.route("GET")

    def do_POST(self) -> None:
        self.route("POST")

    def do_PUT(self) -> None:
        self.route("PUT")

    def do_PATCH(self) -> None:
        self.route("PATCH")

    def do_DELETE(self) -> None:
        self.route("DELETE")


def main() -> None:
    global PERSIST
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state", required=True)
    parser.add_argument("--persist", required=True)
    parser.add_argument("--pid-file")
    args = parser.parse_args()
    with open(args.state, encoding="utf-8") as fh:
        STATE.update(json.load(fh))
    PERSIST = args.persist
    save()
    if args.pid_file:
        with open(args.pid_file, "w") as fh:
            fh.write(str(os.getpid()))
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.serve_forever()


if __name__ == "__main__":
    main()
