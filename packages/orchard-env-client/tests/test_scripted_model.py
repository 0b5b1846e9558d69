"""The shared scripted OpenAI-compatible server: scripts, responders, errors."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from model_tools import CODEX_SHELL, EXEC_TOOL

from orchard_env_client.llm import INSTANCE_ID_HEADER, ChatClient, ModelConfig, ModelError
from orchard_env_client.openai_wire import (
    ChatStreamAssembler,
    ResponsesStreamAssembler,
    SSEEvent,
    SSEParser,
)
from orchard_env_client.testing import (
    ChatRequest,
    ScriptedModelServer,
    Step,
    ToolCall,
    message_text,
    shell_call,
)

pytestmark = pytest.mark.fast


async def test_scripts_replay_by_turn_and_responders_see_the_request() -> None:
    seen: list[ChatRequest] = []

    def policy(request: ChatRequest) -> Step:
        seen.append(request)
        return Step(content="ok", tool_calls=(ToolCall("click", {"x": 1, "y": 2}),))

    with ScriptedModelServer() as llm:
        llm.add("task-a", ["first", {"tool": "done", "arguments": {"answer": "42"}}])
        llm.add("task-b", policy)
        async with ChatClient(ModelConfig(model="m", base_url=llm.base_url)) as chat:
            first = await chat.complete([{"role": "user", "content": "do task-a"}])
            second = await chat.complete(
                [
                    {"role": "user", "content": "do task-a"},
                    {"role": "assistant", "content": "first"},
                    {"role": "user", "content": "next"},
                ]
            )
            tools = [{"type": "function", "function": {"name": "click", "parameters": {}}}]
            image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
            third = await chat.complete(
                [{"role": "user", "content": [{"type": "text", "text": "task-b"}, image]}], tools
            )
        assert first.message["content"] == "first"
        assert second.message["tool_calls"][0]["function"] == {
            "name": "done",
            "arguments": '{"answer": "42"}',
        }
        assert third.message["tool_calls"][0]["function"]["name"] == "click"
        assert seen[0].key == "task-b" and seen[0].tool_names == ["click"] and seen[0].step == 0
        assert [r.instance_id for r in llm.requests] == ["task-a", "task-a", "task-b"]
        assert llm.requests[2].body["messages"][0]["content"][1] == image


async def test_header_matching_default_responder_and_clear_errors() -> None:
    with ScriptedModelServer() as llm:
        llm.add("k", ["only"])
        base = llm.base_url
        async with ChatClient(
            ModelConfig(model="m", base_url=base, max_retries=0), headers={INSTANCE_ID_HEADER: "k"}
        ) as chat:
            assert (await chat.complete([{"role": "user", "content": "x"}])).message["content"]
            with pytest.raises(ModelError, match="has 1 steps; step 1"):
                await chat.complete(
                    [{"role": "user", "content": "x"}, {"role": "assistant", "content": "only"}]
                )
        async with ChatClient(ModelConfig(model="m", base_url=base, max_retries=0)) as chat:
            with pytest.raises(ModelError, match="unknown conversation"):
                await chat.complete([{"role": "user", "content": "nobody"}])
            llm.set_default(lambda request: "fallback")
            assert (await chat.complete([{"role": "user", "content": "nobody"}])).message[
                "content"
            ] == "fallback"
            llm.set_default(lambda request: 1 / 0)
            with pytest.raises(ModelError, match="responder failed: ZeroDivisionError"):
                await chat.complete([{"role": "user", "content": "nobody"}])
        assert httpx.get(base + "/models").json()["data"][0]["id"] == "scripted"
        assert httpx.post(base + "/chat/completions", content=b"{").status_code == 400


# ---------------------------------------------------------------- both APIs, streamed or not


def _policy(request: ChatRequest) -> Step:
    """Run `ls` first, then say what the tool answered."""
    if request.step == 0:
        return shell_call(request, "ls /workspace", content="Looking.")
    return Step(content="saw: " + message_text(request.messages[-1]))


def _sse(response: httpx.Response) -> list[SSEEvent]:
    parser = SSEParser()
    events = [e for chunk in response.iter_bytes() for e in parser.feed(chunk)]
    return events + parser.close()


def test_chat_streams_text_and_tool_call_deltas_then_usage_and_done() -> None:
    with ScriptedModelServer() as llm:
        llm.set_default(_policy)
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "list"}],
            "tools": [EXEC_TOOL],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        plain = httpx.post(llm.base_url + "/chat/completions", json=body | {"stream": False})
        with httpx.stream("POST", llm.base_url + "/chat/completions", json=body) as response:
            assert response.headers["content-type"] == "text/event-stream"
            events = _sse(response)
        without_usage = httpx.post(
            llm.base_url + "/chat/completions", json=body | {"stream_options": {}}
        )
    assert events[-1].data == "[DONE]"
    chunks = [e.json() for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    opening = next(c for c in chunks if c["choices"] and "tool_calls" in c["choices"][0]["delta"])
    call = opening["choices"][0]["delta"]["tool_calls"][0]
    assert call["index"] == 0 and call["id"] and call["type"] == "function"
    assert call["function"] == {"name": "exec", "arguments": ""}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
    assert all(c["usage"] is None for c in chunks[:-1])
    assembler = ChatStreamAssembler()
    for chunk in chunks:
        assembler.add(chunk)
    streamed = assembler.result()["choices"][0]["message"]
    message = plain.json()["choices"][0]["message"]
    assert streamed["content"] == message["content"] == "Looking."
    assert [c["function"] for c in streamed["tool_calls"]] == [
        c["function"] for c in message["tool_calls"]
    ]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {
        "command": "ls /workspace"
    }
    plain_chunks = [e.json() for e in SSEParser().feed(without_usage.content)][:-1]
    assert plain_chunks and all("usage" not in c and c["choices"] for c in plain_chunks)


def _responses_body(stream: bool) -> dict[str, Any]:
    return {
        "model": "m",
        "instructions": "You are codex.",
        "input": [
            {"type": "message", "role": "developer", "content": "sandbox: none"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
            {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
        ],
        "tools": [CODEX_SHELL],
        "stream": stream,
    }


def test_responses_api_plain_and_streamed_with_the_conversation_in_chat_shape() -> None:
    seen: list[ChatRequest] = []

    def policy(request: ChatRequest) -> Step:
        seen.append(request)
        return shell_call(request, "cat a.txt", content="Reading.")

    with ScriptedModelServer() as llm:
        llm.set_default(policy)
        plain = httpx.post(llm.base_url + "/responses", json=_responses_body(False)).json()
        with httpx.stream("POST", llm.base_url + "/responses", json=_responses_body(True)) as r:
            events = _sse(r)
    assert seen[0].api == "responses" and seen[0].step == 1
    assert seen[0].messages == [
        {"role": "system", "content": "You are codex."},
        {"role": "system", "content": "sandbox: none"},
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
    ]
    message, call = plain["output"]
    assert message["content"][0] == {"type": "output_text", "text": "Reading.", "annotations": []}
    assert call["type"] == "function_call" and call["name"] == "shell" and call["call_id"]
    assert json.loads(call["arguments"]) == {"command": ["bash", "-lc", "cat a.txt"]}
    assert plain["usage"]["input_tokens"] > 0 and plain["usage"]["output_tokens"] > 0
    kinds = [e.event for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed"
    assert (
        "response.output_text.delta" in kinds and "response.function_call_arguments.delta" in kinds
    )
    payloads = [e.json() for e in events]
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    assert all(p["type"] == e.event for p, e in zip(payloads, events, strict=True))
    assembler = ResponsesStreamAssembler()
    for payload in payloads:
        assembler.add(payload)
    final = assembler.result()
    assert final["status"] == "completed" and final["usage"]["total_tokens"] > 0
    assert [i["type"] for i in final["output"]] == ["message", "function_call"]
    arguments = "".join(
        p["delta"] for p in payloads if p["type"] == "response.function_call_arguments.delta"
    )
    assert arguments == call["arguments"]


def test_any_path_prefix_before_v1_and_previous_response_ids_are_understood() -> None:
    seen: list[ChatRequest] = []

    def policy(request: ChatRequest) -> str:
        seen.append(request)
        return f"turn {request.step}"

    with ScriptedModelServer() as llm:
        llm.set_default(policy)
        root = llm.base_url.removesuffix("/v1")
        assert httpx.get(root + "/r/run-1/v1/models").json()["data"][0]["id"] == "scripted"
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(root + "/r/run-1/v1/chat/completions", json=chat).status_code == 200
        first = httpx.post(root + "/x/v1/responses", json={"model": "m", "input": "hi"}).json()
        httpx.post(
            llm.base_url + "/responses",
            json={"model": "m", "input": "and?", "previous_response_id": first["id"]},
        )
        assert httpx.post(root + "/v1/nothing", json=chat).status_code == 404
    assert [r.path for r in llm.requests][:2] == [
        "/r/run-1/v1/chat/completions",
        "/x/v1/responses",
    ]
    assert [m["content"] for m in seen[-1].messages] == ["hi", "turn 0", "and?"]
    assert seen[-1].step == 1


def test_a_responder_failing_mid_stream_ends_the_stream_with_an_error_event() -> None:
    with ScriptedModelServer() as llm:
        llm.set_default(lambda request: 1 / 0)
        chat = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
        with httpx.stream("POST", llm.base_url + "/chat/completions", json=chat) as r:
            chat_events = _sse(r)
        body = {"model": "m", "input": "x", "stream": True}
        with httpx.stream("POST", llm.base_url + "/responses", json=body) as r:
            responses_events = _sse(r)
    assert "ZeroDivisionError" in chat_events[-2].json()["error"]["message"]
    assert chat_events[-1].data == "[DONE]"
    assert responses_events[-1].event == "response.failed"
    assert "ZeroDivisionError" in responses_events[-1].json()["response"]["error"]["message"]
    assert [r.status for r in llm.requests] == [500, 500]


# ---------------------------------------------------------------- shell_call


def _request(*tools: dict[str, Any]) -> ChatRequest:
    return ChatRequest(body={"messages": [], "tools": list(tools)}, headers={}, key=None)


def _function(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


STRING = {"type": "string"}


@pytest.mark.parametrize(
    ("tools", "name", "arguments"),
    [
        ([EXEC_TOOL], "exec", {"command": "ls"}),
        (
            [
                _function("read", {"path": STRING}, ["path"]),
                _function(
                    "bash",
                    {"command": STRING, "timeout": {"type": "number"}, "description": STRING},
                    ["command", "description"],
                ),
            ],
            "bash",
            {"command": "ls", "description": "ls"},
        ),
        ([CODEX_SHELL], "shell", {"command": ["bash", "-lc", "ls"]}),
        (
            [
                _function(
                    "exec_command",
                    {"cmd": STRING, "yield_time_ms": {"type": "integer"}, "workdir": STRING},
                    ["cmd", "yield_time_ms", "workdir"],
                )
            ],
            "exec_command",
            {"cmd": "ls", "yield_time_ms": 120000, "workdir": "."},
        ),
        (
            [
                _function(
                    "run_in_terminal", {"script": STRING, "mode": {"enum": ["a", "b"]}}, ["mode"]
                )
            ],
            "run_in_terminal",
            {"script": "ls", "mode": "a"},
        ),
        (
            [{"type": "local_shell"}],
            "local_shell",
            {"type": "exec", "command": ["bash", "-lc", "ls"], "env": {}},
        ),
    ],
)
def test_shell_call_fills_the_shell_tool_of_each_harness(
    tools: list[dict[str, Any]], name: str, arguments: dict[str, Any]
) -> None:
    step = shell_call(_request(*tools), "ls", content="Listing.")
    assert step.content == "Listing."
    assert step.tool_calls == (ToolCall(name, arguments),)


def test_shell_call_names_the_tools_when_none_is_shell_like() -> None:
    with pytest.raises(ValueError, match=r"no shell-like tool .*\['read', 'write'\]"):
        shell_call(_request(_function("read", {}, []), _function("write", {}, [])), "ls")
