"""The shared scripted OpenAI-compatible server: scripts, responders, errors."""

from __future__ import annotations

import httpx
import pytest

from orchard_env_client.llm import INSTANCE_ID_HEADER, ChatClient, ModelConfig, ModelError
from orchard_env_client.testing import ChatRequest, ScriptedModelServer, Step, ToolCall

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
