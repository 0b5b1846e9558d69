"""The recording proxy in front of the scripted model: streaming, runs, records, trajectories."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from model_tools import CODEX_SHELL, EXEC_TOOL

from orchard_env_client.openai_wire import (
    ChatStreamAssembler,
    SSEEvent,
    SSEParser,
    token_ids_of,
)
from orchard_env_client.recording_proxy import (
    RUN_ID_HEADER,
    Exchange,
    RecordingProxy,
    read_exchanges,
    to_trajectory,
)
from orchard_env_client.testing import ChatRequest, ScriptedModelServer, Step, shell_call
from orchard_env_client.trajectory import Trajectory, TrajectoryMetadata, append_jsonl, read_jsonl


def _policy(request: ChatRequest) -> Step:
    if request.step == 0:
        return shell_call(request, "ls", content="Looking.")
    return Step(content="done: " + str(request.messages[-1].get("content")))


def _sse(response: httpx.Response) -> list[SSEEvent]:
    parser = SSEParser()
    return [e for chunk in response.iter_bytes() for e in parser.feed(chunk)] + parser.close()


def _chat_episode(base_url: str, task: str, headers: dict[str, str] | None = None) -> str:
    """A two-turn streamed chat episode, as openclaw or opencode would run it."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    for _ in range(2):
        body = {
            "model": "m",
            "messages": messages,
            "tools": [EXEC_TOOL],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with httpx.stream(
            "POST", base_url + "/chat/completions", json=body, headers=headers
        ) as response:
            assert response.status_code == 200
            assembler = ChatStreamAssembler()
            for event in _sse(response):
                assembler.add(event.json())
        message = assembler.result()["choices"][0]["message"]
        messages.append(message)
        for call in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"{task}.txt"})
    return str(messages[-1]["content"])


def _responses_episode(base_url: str, task: str) -> str:
    """A two-turn streamed Responses episode, as codex would run it."""
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": task}]
    final = ""
    for _ in range(2):
        body = {
            "model": "m",
            "instructions": "be brief",
            "input": items,
            "tools": [CODEX_SHELL],
            "stream": True,
        }
        with httpx.stream("POST", base_url + "/responses", json=body) as response:
            done = [e.json() for e in _sse(response) if e.event == "response.output_item.done"]
        for event in done:
            item = event["item"]
            items.append(item)
            if item["type"] == "function_call":
                output = {"type": "function_call_output", "call_id": item["call_id"]}
                items.append(output | {"output": f"{task}.txt"})
            else:
                final = item["content"][0]["text"]
    return final


def test_a_streamed_chat_run_is_forwarded_and_recorded(tmp_path: Path) -> None:
    record = tmp_path / "exchanges.jsonl"
    with ScriptedModelServer() as llm, RecordingProxy(llm.base_url, record) as proxy:
        llm.set_default(_policy)
        answer = _chat_episode(proxy.run_url("run-1"), "t1", {"Authorization": "Bearer sk-1"})
        assert httpx.get(proxy.base_url + "/models").json()["data"][0]["id"] == "scripted"
        upstream_host = llm.base_url.split("/")[2]
    assert answer == "done: t1.txt"
    assert llm.requests[0].authorization == "Bearer sk-1"
    assert llm.requests[0].path == "/v1/chat/completions"
    assert llm.requests[0].body["stream_options"] == {"include_usage": True}
    first, second, models = read_exchanges(record)
    assert (first.run_id, first.endpoint, first.status, first.stream) == (
        "run-1",
        "chat/completions",
        200,
        True,
    )
    assert (models.run_id, models.endpoint, models.stream) == ("default", "models", False)
    assert models.response["object"] == "list"
    assert first.events is not None and first.events[-1]["data"] == "[DONE]"
    call = first.response["choices"][0]["message"]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"command": "ls"}
    assert first.usage is not None and first.usage["total_tokens"] > 0
    assert first.started_at <= first.ended_at <= second.started_at
    assert second.request["messages"][-1]["role"] == "tool"
    assert upstream_host.startswith("127.0.0.1:")


def test_a_streamed_responses_run_becomes_a_trajectory_in_chat_shape(tmp_path: Path) -> None:
    with ScriptedModelServer() as llm, RecordingProxy(llm.base_url) as proxy:
        llm.set_default(_policy)
        assert _responses_episode(proxy.run_url("codex-1"), "t2") == "done: t2.txt"
        exchanges = proxy.exchanges("codex-1")
    assert [(e.endpoint, e.stream, e.status) for e in exchanges] == [("responses", True, 200)] * 2
    assert exchanges[0].response["status"] == "completed"
    assert [i["type"] for i in exchanges[0].response["output"]] == ["message", "function_call"]
    traj = to_trajectory(exchanges, TrajectoryMetadata(task_id="t2", recipe="claw"))
    assert [m["role"] for m in traj.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert traj.messages[2]["tool_calls"][0]["function"]["name"] == "shell"
    assert traj.messages[3] == {
        "role": "tool",
        "tool_call_id": traj.messages[2]["tool_calls"][0]["id"],
        "content": "t2.txt",
    }
    assert traj.tools[0]["function"]["name"] == "shell"
    assert [s.message_index for s in traj.steps] == [2, 4]
    assert traj.steps[0].observation["tool_results"][0]["content"] == "t2.txt"
    meta = traj.metadata
    assert (meta.steps, meta.model, meta.final_output) == (2, "m", "done: t2.txt")
    assert meta.prompt_tokens == sum(e.usage["prompt_tokens"] for e in exchanges if e.usage)
    assert meta.completion_tokens > 0 and meta.extra["api"] == "responses"
    path = tmp_path / "trajectories.jsonl"
    append_jsonl(path, traj)
    assert read_jsonl(path) == [traj] and Trajectory.from_json(traj.to_json()) == traj


def test_a_chat_run_from_the_jsonl_becomes_a_trajectory(tmp_path: Path) -> None:
    record = tmp_path / "exchanges.jsonl"
    with ScriptedModelServer() as llm, RecordingProxy(llm.base_url, record) as proxy:
        llm.set_default(_policy)
        _chat_episode(proxy.run_url("a"), "t3")
        # a side call of the same run (a harness asking for a title) is a step, not a message
        side = {"model": "m", "messages": [{"role": "user", "content": "title?"}]}
        httpx.post(proxy.run_url("a") + "/chat/completions", json=side)
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    traj = to_trajectory(lines, TrajectoryMetadata(task_id="t3", harness="openclaw"))
    assert [m["role"] for m in traj.messages] == ["user", "assistant", "tool", "assistant"]
    assert traj.messages[-1]["content"] == "done: t3.txt"
    assert [s.message_index for s in traj.steps] == [1, 3, None]
    assert traj.steps[0].action is not None and traj.steps[0].action["content"] == "Looking."
    assert traj.metadata.steps == 3 and traj.metadata.extra["run_ids"] == ["a"]
    assert traj.metadata.final_output == "done: t3.txt"
    assert Trajectory.from_json(traj.to_json()) == traj


def test_concurrent_runs_keep_their_records_apart() -> None:
    runs = [f"run-{i}" for i in range(6)]
    answers: dict[str, str] = {}
    with ScriptedModelServer() as llm, RecordingProxy(llm.base_url) as proxy:
        llm.set_default(_policy)

        def drive(run: str) -> None:
            episode = _responses_episode if run.endswith(("1", "3")) else _chat_episode
            answers[run] = episode(proxy.run_url(run), run)

        threads = [threading.Thread(target=drive, args=(run,)) for run in runs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        records = {run: proxy.exchanges(run) for run in runs}
    assert answers == {run: f"done: {run}.txt" for run in runs}
    for run, exchanges in records.items():
        assert len(exchanges) == 2
        traj = to_trajectory(exchanges, TrajectoryMetadata(task_id=run))
        assert traj.messages[-1]["content"] == f"done: {run}.txt"


def test_the_upstream_is_told_the_run_and_a_caller_cannot_forge_it() -> None:
    with ScriptedModelServer() as llm, RecordingProxy(llm.base_url) as proxy:
        llm.set_default(lambda request: str(request.headers.get(RUN_ID_HEADER.lower())))
        body = {"model": "m", "messages": [{"role": "user", "content": "which run?"}]}
        forged = {RUN_ID_HEADER: "someone-else"}
        tagged = httpx.post(f"{proxy.run_url('run-7')}/chat/completions", json=body, headers=forged)
        plain = httpx.post(f"{proxy.base_url}/chat/completions", json=body, headers=forged)
    assert tagged.json()["choices"][0]["message"]["content"] == "run-7"
    assert plain.json()["choices"][0]["message"]["content"] == "None"


def test_an_upstream_event_reaches_the_caller_before_the_upstream_finishes() -> None:
    asked, release = threading.Event(), threading.Event()

    def slow(request: ChatRequest) -> str:
        asked.set()
        assert release.wait(60), "the test never released the responder"
        return "late answer"

    with ScriptedModelServer() as llm, RecordingProxy(llm.base_url) as proxy:
        llm.set_default(slow)
        body = {"model": "m", "input": "x", "stream": True}
        with httpx.stream("POST", proxy.base_url + "/responses", json=body, timeout=60) as r:
            parser = SSEParser()
            chunks = r.iter_bytes()
            first: list[SSEEvent] = []
            while not first:
                first = parser.feed(next(chunks))
            assert first[0].event == "response.created"
            assert not release.is_set()  # the upstream is still inside the responder
            assert asked.wait(60)
            release.set()
            rest = [e for chunk in chunks for e in parser.feed(chunk)]
        (exchange,) = proxy.exchanges()
    assert rest[-1].event == "response.completed"
    assert exchange.response["output"][0]["content"][0]["text"] == "late answer"


def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_upstream_is_a_502_and_an_error_record(tmp_path: Path) -> None:
    record = tmp_path / "x.jsonl"
    with RecordingProxy(f"http://127.0.0.1:{_dead_port()}/v1", record) as proxy:
        chat = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        response = httpx.post(proxy.run_url("r") + "/chat/completions", json=chat)
        assert httpx.get(proxy.base_url.removesuffix("/v1") + "/elsewhere").status_code == 404
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_unreachable"
    (exchange,) = read_exchanges(record)
    assert exchange.status == 502 and exchange.error and "ConnectError" in exchange.error
    traj = to_trajectory([exchange], TrajectoryMetadata(task_id="x"))
    assert traj.messages == [] and traj.steps[0].error == exchange.error
    assert traj.metadata.extra["failed_calls"] == 1


@pytest.mark.fast
def test_token_ids_of_a_vllm_stream_are_kept_and_land_in_the_trajectory() -> None:
    chunks = [
        {"id": "c", "prompt_token_ids": [1, 2, 3], "choices": [{"index": 0, "delta": {}}]},
        {
            "id": "c",
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": "hi"},
                    "token_ids": [7],
                    "logprobs": {"content": [{"token": "hi", "logprob": -0.5}]},
                }
            ],
        },
        {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    assembler = ChatStreamAssembler()
    for chunk in chunks:
        assembler.add(chunk)
    response = assembler.result()
    ids = token_ids_of(response)
    assert ids == {"prompt_ids": [1, 2, 3], "completion_ids": [7], "logprobs": [-0.5]}
    exchange = Exchange(
        run_id="r",
        method="POST",
        endpoint="chat/completions",
        status=200,
        request={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        response=response,
        token_ids=ids,
    )
    traj = to_trajectory([exchange.to_dict()], TrajectoryMetadata(task_id="x"))
    assert [t.to_dict() for t in traj.token_ids] == [
        {"message_index": 1, "prompt_ids": [1, 2, 3], "completion_ids": [7], "logprobs": [-0.5]}
    ]
