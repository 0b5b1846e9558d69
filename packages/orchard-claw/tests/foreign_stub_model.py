"""A scripted OpenAI-compatible model for the foreign-harness tests, run *inside* the sandbox.

Standard library only (the harness image's python3): ``python3 foreign_stub_model.py PORT
LOG COMMAND`` serves on 127.0.0.1:PORT, under any path prefix (``/r/<run>/v1/...`` or
``/v1/...``):

- ``GET .../models``: one model, ``stub``;
- ``POST .../chat/completions`` (streaming SSE or not) and ``POST .../responses`` (the
  Responses API, streaming or not): while the conversation holds no tool result, one call of
  the request's shell-like tool that runs COMMAND (arguments filled from the tool's JSON
  schema); after it, or when the request offers no tools (title generation and the like),
  a final text answer, ``FINAL_TEXT``.

Every request is appended to LOG as one JSON line (method, path, headers, body), so a test
can tell exactly what a harness asked for.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FINAL_TEXT = "STUB-FINAL: wrote /workspace/out.txt"
MODEL = "stub"
# The shell-like tools of the harnesses we know, best first.
SHELL_TOOLS = ("exec", "bash", "shell", "exec_command", "shell_command", "local_shell")

_lock = threading.Lock()
_counter = [0]


def _next_id(prefix: str) -> str:
    with _lock:
        _counter[0] += 1
        return f"{prefix}_{_counter[0]}"


def _tool_name(tool: dict[str, Any]) -> str:
    if tool.get("type") == "function" and isinstance(tool.get("function"), dict):
        return str(tool["function"].get("name", ""))  # chat completions
    return str(tool.get("name") or tool.get("type") or "")  # Responses API


def _tool_schema(tool: dict[str, Any]) -> dict[str, Any]:
    if isinstance(tool.get("function"), dict):
        return dict(tool["function"].get("parameters") or {})
    return dict(tool.get("parameters") or {})


def pick_shell_tool(tools: list[dict[str, Any]]) -> dict[str, Any] | None:
    by_name = {_tool_name(t): t for t in tools}
    for name in SHELL_TOOLS:
        if name in by_name:
            return by_name[name]
    return None


def fill_arguments(schema: dict[str, Any], command: str) -> dict[str, Any]:
    """The shell tool's arguments: the command where the schema wants it, the other
    required properties filled with plain values of their type."""
    props: dict[str, Any] = schema.get("properties") or {}
    args: dict[str, Any] = {}
    for key in ("command", "cmd", "script"):
        if key in props:
            if props[key].get("type") == "array":
                args[key] = ["bash", "-lc", command]
            else:
                args[key] = command
            break
    else:
        args["command"] = command
    for key in schema.get("required") or []:
        if key in args:
            continue
        kind = (props.get(key) or {}).get("type")
        if key == "description":
            args[key] = "Write the output file"
        elif key in ("workdir", "cwd"):
            args[key] = "/workspace"
        elif kind in ("integer", "number"):
            args[key] = 60000
        elif kind == "boolean":
            args[key] = False
        elif kind == "array":
            args[key] = []
        elif kind == "object":
            args[key] = {}
        else:
            args[key] = ""
    return args


def _chat_has_tool_result(body: dict[str, Any]) -> bool:
    return any(m.get("role") == "tool" for m in body.get("messages") or [])


def _responses_has_tool_result(body: dict[str, Any]) -> bool:
    items = body.get("input")
    if not isinstance(items, list):
        return False
    return any(str(i.get("type", "")).endswith("_call_output") for i in items)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: StubServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _record(self, body: Any) -> None:
        line = {
            "t": time.time(),
            "method": self.command,
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": body,
        }
        with _lock, open(self.server.log_path, "a") as f:
            f.write(json.dumps(line) + "\n")

    def _json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _sse_start(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _sse(self, data: Any, event: str | None = None) -> None:
        text = (f"event: {event}\n" if event else "") + f"data: {data}\n\n"
        self.wfile.write(text.encode())
        self.wfile.flush()

    def do_GET(self) -> None:
        self._record(None)
        if self.path.split("?")[0].rstrip("/").endswith("/models"):
            self._json(
                200,
                {
                    "object": "list",
                    "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "stub"}],
                },
            )
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_raw": raw.decode(errors="replace")}
        self._record(body)
        path = self.path.split("?")[0].rstrip("/")
        if path.endswith("/chat/completions"):
            self._chat(body)
        elif path.endswith("/responses"):
            self._responses(body)
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    # -- chat completions ---------------------------------------------------------------
    def _chat(self, body: dict[str, Any]) -> None:
        tool = pick_shell_tool(body.get("tools") or [])
        call = None
        if tool is not None and not _chat_has_tool_result(body):
            args = fill_arguments(_tool_schema(tool), self.server.command)
            call = {
                "id": _next_id("call"),
                "type": "function",
                "function": {"name": _tool_name(tool), "arguments": json.dumps(args)},
            }
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        cid, created = _next_id("chatcmpl"), int(time.time())
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": None if call else FINAL_TEXT}
            if call:
                message["tool_calls"] = [call]
            self._json(
                200,
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": created,
                    "model": body.get("model", MODEL),
                    "usage": usage,
                    "choices": [
                        {
                            "index": 0,
                            "message": message,
                            "finish_reason": "tool_calls" if call else "stop",
                        }
                    ],
                },
            )
            return

        def chunk(delta: dict[str, Any], finish: str | None) -> str:
            return json.dumps(
                {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": body.get("model", MODEL),
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
            )

        self._sse_start()
        if call:
            fn = call["function"]
            self._sse(
                chunk(
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": call["id"],
                                "type": "function",
                                "function": {"name": fn["name"], "arguments": ""},
                            }
                        ],
                    },
                    None,
                )
            )
            self._sse(
                chunk(
                    {"tool_calls": [{"index": 0, "function": {"arguments": fn["arguments"]}}]}, None
                )
            )
            self._sse(chunk({}, "tool_calls"))
        else:
            self._sse(chunk({"role": "assistant", "content": ""}, None))
            self._sse(chunk({"content": FINAL_TEXT}, None))
            self._sse(chunk({}, "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            self._sse(
                json.dumps(
                    {
                        "id": cid,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": body.get("model", MODEL),
                        "choices": [],
                        "usage": usage,
                    }
                )
            )
        self._sse("[DONE]")

    # -- Responses API ------------------------------------------------------------------
    def _responses(self, body: dict[str, Any]) -> None:
        tool = pick_shell_tool(body.get("tools") or [])
        rid, created = _next_id("resp"), int(time.time())
        item: dict[str, Any]
        if tool is not None and not _responses_has_tool_result(body):
            if tool.get("type") == "local_shell":
                item = {
                    "type": "local_shell_call",
                    "id": _next_id("lsh"),
                    "call_id": _next_id("call"),
                    "status": "completed",
                    "action": {
                        "type": "exec",
                        "command": ["bash", "-lc", self.server.command],
                        "env": {},
                        "working_directory": "/workspace",
                    },
                }
            else:
                args = fill_arguments(_tool_schema(tool), self.server.command)
                item = {
                    "type": "function_call",
                    "id": _next_id("fc"),
                    "call_id": _next_id("call"),
                    "name": _tool_name(tool),
                    "arguments": json.dumps(args),
                    "status": "completed",
                }
        else:
            item = {
                "type": "message",
                "id": _next_id("msg"),
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": FINAL_TEXT, "annotations": []}],
            }
        usage = {
            "input_tokens": 10,
            "output_tokens": 5,
            "total_tokens": 15,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        response = {
            "id": rid,
            "object": "response",
            "created_at": created,
            "status": "completed",
            "model": body.get("model", MODEL),
            "output": [item],
            "usage": usage,
        }
        if not body.get("stream"):
            self._json(200, response)
            return
        seq = [0]

        def event(kind: str, **fields: Any) -> None:
            payload = {"type": kind, "sequence_number": seq[0], **fields}
            seq[0] += 1
            self._sse(json.dumps(payload), event=kind)

        self._sse_start()
        pending = {**response, "status": "in_progress", "output": [], "usage": None}
        event("response.created", response=pending)
        event("response.in_progress", response=pending)
        if item["type"] == "message":
            text = FINAL_TEXT
            event(
                "response.output_item.added",
                output_index=0,
                item={**item, "status": "in_progress", "content": []},
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            event(
                "response.content_part.added",
                item_id=item["id"],
                output_index=0,
                content_index=0,
                part=part,
            )
            event(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=0,
                content_index=0,
                delta=text,
            )
            event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=0,
                content_index=0,
                text=text,
            )
            event(
                "response.content_part.done",
                item_id=item["id"],
                output_index=0,
                content_index=0,
                part={**part, "text": text},
            )
        elif item["type"] == "function_call":
            event(
                "response.output_item.added",
                output_index=0,
                item={**item, "status": "in_progress", "arguments": ""},
            )
            event(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=0,
                delta=item["arguments"],
            )
            event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=0,
                arguments=item["arguments"],
            )
        else:
            event("response.output_item.added", output_index=0, item=item)
        event("response.output_item.done", output_index=0, item=item)
        event("response.completed", response=response)


class StubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, log_path: str, command: str) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.log_path, self.command = log_path, command


def main() -> None:
    port, log_path, command = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    server = StubServer(port, log_path, command)
    print(f"stub model on 127.0.0.1:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
