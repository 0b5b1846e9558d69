"""The tiny real LLM (SmolLM2-135M on CPU) behind an OpenAI-compatible chat endpoint.

The integration tests build (or reuse) the model's own venv and start the server once per
session; the fast tests check the request/response plumbing without torch.
"""

from __future__ import annotations

import json

import httpx
import pytest

from orchard_swe.data import chat_format
from orchard_swe.testing import tiny_llm_server as tls
from orchard_swe.trainers.llm_venv import (
    LLM_REQUIREMENTS,
    venv_key,
)

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a bash command and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the command"}},
            "required": ["command"],
        },
    },
}


def chat(base_url: str, body: dict, timeout: float = 300) -> httpx.Response:
    return httpx.post(f"{base_url}/chat/completions", json=body, timeout=timeout)


def check_completion(body: dict) -> dict:
    """Assert the OpenAI chat.completion shape; return choices[0]."""
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert isinstance(body["created"], int)
    assert isinstance(body["model"], str)
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length", "tool_calls")
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0
    assert usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    return choice


# ---------------------------------------------------------------- against the real model


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_models_and_health(tiny_llm: str) -> None:
    models = httpx.get(f"{tiny_llm}/models", timeout=30).json()
    assert models["object"] == "list"
    assert models["data"][0]["id"]
    health = httpx.get(tiny_llm.removesuffix("/v1") + "/health", timeout=30)
    assert health.status_code == 200
    assert health.json()["status"] == "ok"


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_plain_chat(tiny_llm: str) -> None:
    r = chat(
        tiny_llm,
        {
            "model": "smollm2",
            "messages": [
                {"role": "system", "content": "Answer in one short sentence."},
                {"role": "user", "content": "What is the capital of France?"},
            ],
            "max_tokens": 24,
        },
    )
    assert r.status_code == 200, r.text
    choice = check_completion(r.json())
    assert isinstance(choice["message"]["content"], str)
    assert choice["message"]["content"].strip()
    assert r.json()["model"] == "smollm2"
    assert r.json()["usage"]["completion_tokens"] <= 24


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_greedy_is_deterministic(tiny_llm: str) -> None:
    body = {"messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 8}
    first, second = chat(tiny_llm, body).json(), chat(tiny_llm, body).json()
    assert first["choices"][0]["message"] == second["choices"][0]["message"]


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_stop_sequence_ends_generation(tiny_llm: str) -> None:
    r = chat(
        tiny_llm,
        {
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "stop": ["."],
            "max_tokens": 40,
        },
    )
    choice = check_completion(r.json())
    assert "." not in choice["message"]["content"]
    assert choice["finish_reason"] == "stop"
    assert r.json()["usage"]["completion_tokens"] < 40


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_request_with_tools(tiny_llm: str) -> None:
    r = chat(
        tiny_llm,
        {
            "messages": [{"role": "user", "content": "List the files in the current directory."}],
            "tools": [BASH_TOOL],
            "tool_choice": "auto",
            "max_tokens": 48,
        },
    )
    assert r.status_code == 200, r.text
    choice = check_completion(r.json())
    message = choice["message"]
    if message.get("tool_calls"):  # the model may or may not call the tool
        assert choice["finish_reason"] == "tool_calls"
        for call in message["tool_calls"]:
            assert call["type"] == "function"
            assert call["id"]
            assert call["function"]["name"] == "bash"
            assert isinstance(json.loads(call["function"]["arguments"]), dict)
    else:
        assert isinstance(message["content"], str)
        assert message["content"].strip()


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_malformed_json_is_400(tiny_llm: str) -> None:
    r = httpx.post(
        f"{tiny_llm}/chat/completions",
        content=b'{"messages": [',
        timeout=30,
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400
    assert "JSON" in r.json()["error"]["message"]


@pytest.mark.integration
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "body",
    [
        {},
        {"messages": []},
        {"messages": [{"role": "wizard", "content": "hi"}]},
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0},
        {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
    ],
    ids=["no-messages", "empty-messages", "bad-role", "zero-max-tokens", "bad-tool"],
)
def test_bad_requests_are_400(tiny_llm: str, body: dict) -> None:
    r = chat(tiny_llm, body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"]


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_conversation_with_tool_calls_and_tool_results(tiny_llm: str) -> None:
    r = chat(
        tiny_llm,
        {
            "messages": [
                {"role": "system", "content": "You are a shell agent."},
                {"role": "user", "content": "How many files are here?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {
                                "name": "bash",
                                "arguments": json.dumps({"command": "ls"}),
                            },
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb.txt\n"},
                {
                    "role": "assistant",
                    "content": "There are two files. Anything else?",
                    "tool_calls": [],
                },
                {"role": "user", "content": [{"type": "text", "text": "Thanks, say goodbye."}]},
            ],
            "tools": [BASH_TOOL],
            "max_tokens": 24,
        },
    )
    assert r.status_code == 200, r.text
    check_completion(r.json())


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_streaming(tiny_llm: str) -> None:
    r = chat(
        tiny_llm,
        {
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 8,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [line[len("data: ") :] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text.strip()
    assert chunks[-1]["usage"]["completion_tokens"] > 0


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_openai_sdk_reads_the_responses(tiny_llm: str) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=tiny_llm, api_key="unused", timeout=300, max_retries=0)
    reply = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Hi!"}],
        max_tokens=8,
        tools=[BASH_TOOL],
    )
    assert reply.choices[0].message.role == "assistant"
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="smollm2", messages=[])


# ---------------------------------------------------------------- plumbing, no model


NAMES = {"bash"}


@pytest.mark.fast
@pytest.mark.parametrize(
    ("text", "content", "args"),
    [
        (
            '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>',
            "",
            {"command": "ls"},
        ),
        (
            'Let me look.\n<tool_call>{"name": "bash", "arguments": {"command": "ls -la"}}',
            "Let me look.",
            {"command": "ls -la"},
        ),
        ('{"name": "bash", "arguments": {"command": "pwd"}}', "", {"command": "pwd"}),
        ('```json\n{"name": "bash", "parameters": {"command": "id"}}\n```', "", {"command": "id"}),
        (
            'I will run it: {"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}',
            "I will run it:",
            {"command": "ls"},
        ),
        (
            '[{"type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}]',
            "",
            {"command": "ls"},
        ),
    ],
    ids=["tagged", "tagged-unclosed", "bare", "fenced-parameters", "inline-string-args", "list"],
)
def test_tool_calls_are_parsed(text: str, content: str, args: dict) -> None:
    rest, calls = chat_format.parse_tool_calls(text, NAMES)
    assert rest == content
    assert [c["name"] for c in calls] == ["bash"]
    assert json.loads(calls[0]["arguments"]) == args


@pytest.mark.fast
@pytest.mark.parametrize(
    "text",
    [
        "Just text.",
        '{"name": "python", "arguments": {"code": "1"}}',  # not an offered tool
        '<tool_call>{"name": "bash", "arguments": "not json"}</tool_call>',
        '<tool_call>{"name": "bash", "arguments": {"command": "ls"</tool_call>',  # truncated
        '{"answer": 42}',
    ],
)
def test_non_tool_text_stays_content(text: str) -> None:
    assert chat_format.parse_tool_calls(text, NAMES) == (text, [])


@pytest.mark.fast
def test_no_tools_offered_means_no_tool_calls() -> None:
    text = '{"name": "bash", "arguments": {"command": "ls"}}'
    assert chat_format.parse_tool_calls(text, set()) == (text, [])
    assert tls.tool_names([BASH_TOOL], "none") == set()
    assert tls.tool_names([BASH_TOOL], "auto") == {"bash"}


@pytest.mark.fast
def test_messages_are_flattened_for_a_plain_chatml_template() -> None:
    caps = chat_format.TemplateCaps("{{'<|im_start|>' + message['role'] + message['content']}}")
    messages = chat_format.prepare_messages(
        [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        ],
        [BASH_TOOL],
        caps,
    )
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"].startswith("Be brief.\n\n")
    assert "<tools>" in messages[0]["content"] and '"name": "bash"' in messages[0]["content"]
    assert messages[1]["content"] == "hi\n[image_url part omitted]"
    assert messages[2]["content"] == (
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    )
    assert messages[3]["content"] == "<tool_response>\na.txt\n</tool_response>"
    assert all(isinstance(m["content"], str) for m in messages)
    prompt = chat_format.render_chatml(messages)
    assert prompt.endswith("<|im_start|>assistant\n")


@pytest.mark.fast
def test_templates_that_know_tools_get_them_structured() -> None:
    caps = chat_format.TemplateCaps(
        "{% if tools %}{% for m in messages %}{{ m.tool_calls }}"
        "{% if m.role == 'tool' %}{% endif %}{% endfor %}{% endif %}"
    )
    messages = chat_format.prepare_messages(
        [
            {"role": "user", "content": "x"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "c1", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "out"},
        ],
        [BASH_TOOL],
        caps,
    )
    assert messages[0] == {"role": "user", "content": "x"}  # no injected tool prompt
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"command": "ls"}
    assert messages[2] == {"role": "tool", "content": "out", "tool_call_id": "c1"}


@pytest.mark.fast
def test_params_are_validated_and_capped() -> None:
    params = tls.parse_params({"max_tokens": 1000, "stop": "\n"}, cap=64)
    assert params["max_new_tokens"] == 64
    assert params["temperature"] == 0.0
    assert params["stops"] == ["\n"]
    for bad in ({"max_tokens": "5"}, {"temperature": 9}, {"n": 2}, {"stop": [1]}):
        with pytest.raises(chat_format.BadRequest):
            tls.parse_params(bad, cap=64)
    assert tls.apply_stop("abc\ndef", ["\n"]) == ("abc", True)


@pytest.mark.fast
def test_stream_chunks_carry_tool_calls_and_usage() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    body = {
        "id": "chatcmpl-1",
        "created": 1,
        "model": "m",
        "system_fingerprint": "x",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": None, "tool_calls": [call]},
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    chunks = tls.stream_chunks(body, include_usage=True)
    assert chunks[1]["choices"][0]["delta"]["tool_calls"][0] == {"index": 0, **call}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["usage"]["total_tokens"] == 5


@pytest.mark.fast
def test_venv_key_names_the_pins() -> None:
    assert venv_key(LLM_REQUIREMENTS) == venv_key(list(LLM_REQUIREMENTS))
    assert venv_key(LLM_REQUIREMENTS) != venv_key([*LLM_REQUIREMENTS, "extra==1"])
    assert any(r.startswith("torch==") and r.endswith("+cpu") for r in LLM_REQUIREMENTS)
