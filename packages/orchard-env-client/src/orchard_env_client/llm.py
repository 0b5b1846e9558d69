"""The model side of a harness, shared by every recipe: which OpenAI-compatible endpoint
to call, and how.

:class:`ModelConfig` names a model on an OpenAI-compatible server (vLLM, SGLang, a hosted
API, or :class:`orchard_env_client.testing.ScriptedModelServer` in tests). :class:`ChatClient` is
a small async client of its ``/chat/completions`` route with bounded retries on 429, 5xx
and connection errors; anything else raises :class:`ModelError` with the server's answer.
"""

from __future__ import annotations

import asyncio
import os
import random
import types
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs
import httpx

__all__ = [
    "INSTANCE_ID_HEADER",
    "ChatClient",
    "ChatResult",
    "ModelConfig",
    "ModelError",
    "ModelResponseError",
]

INSTANCE_ID_HEADER = "X-Orchard-Instance-Id"
"""Request header the harnesses send with the task's instance id (scripted servers use it
to pick the conversation's script; real servers ignore it)."""

RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
"""HTTP statuses retried (besides every other 5xx)."""


@attrs.define(frozen=True, kw_only=True)
class ModelConfig:
    """A model on an OpenAI-compatible server, with its sampling settings and prices."""

    model: str
    """The model name sent in requests (e.g. ``Qwen/Qwen3-8B`` on a vLLM server)."""
    base_url: str
    """The API root, e.g. ``http://127.0.0.1:8000/v1`` (``/chat/completions`` is appended)."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the API key; it may be unset for local servers."""
    temperature: float = 0.0
    max_tokens: int | None = None
    price_per_1k_prompt: float = 0.0
    """Dollars per 1000 prompt tokens (cost accounting only)."""
    price_per_1k_completion: float = 0.0
    """Dollars per 1000 completion tokens."""
    timeout_s: float = 600.0
    """Per-request HTTP timeout."""
    max_retries: int = 4
    """Retries of one request after a 429 / 5xx / connection error (0 disables)."""
    retry_backoff_s: float = 1.0
    """First retry delay; doubled per retry (with jitter), capped at 60 s."""
    extra_body: Mapping[str, Any] = attrs.field(factory=dict)
    """Additional request-body fields (e.g. ``{"top_p": 0.95}``)."""

    def api_key(self) -> str | None:
        """The API key from ``api_key_env``, or None when unset or empty."""
        return os.environ.get(self.api_key_env) or None

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """The dollar cost of a call with these token counts."""
        return (
            prompt_tokens * self.price_per_1k_prompt
            + completion_tokens * self.price_per_1k_completion
        ) / 1000.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the key itself is never included, only its variable name)."""
        out = attrs.asdict(self)
        out["extra_body"] = dict(self.extra_body)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelConfig:
        """Build from :meth:`to_dict` output (unknown keys raise ``TypeError``)."""
        return cls(**dict(data))


class ModelError(Exception):
    """A chat request failed for good (non-retryable status, or retries exhausted)."""

    def __init__(self, message: str, *, status_code: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = body


class ModelResponseError(ModelError):
    """The server answered 2xx but not with a chat completion we can read."""


@attrs.define(kw_only=True)
class ChatResult:
    """One completion: the assistant message as returned, usage and cost."""

    message: dict[str, Any]
    """The assistant message (``role``, ``content``, and ``tool_calls`` when present)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    finish_reason: str | None = None
    model: str | None = None
    """The model name the server reported."""


def _snippet(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more chars]"


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


_API_MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


def _clean_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as every OpenAI-compatible API accepts it: standard keys, no ``None``s.

    Other keys a server returned (``reasoning_content``, ``refusal``...) stay in the
    trajectory but are not sent back.
    """
    return {
        k: message[k]
        for k in _API_MESSAGE_KEYS
        if k in message and (message[k] is not None or k == "content")
    }


class ChatClient:
    """Async client of an OpenAI-compatible ``/chat/completions`` endpoint.

    ``headers`` are sent with every request (besides ``Authorization`` from the key).
    ``transport`` is handed to httpx (tests use ``httpx.MockTransport``); ``sleep`` is the
    backoff sleep (tests pass a fake). Use as ``async with`` or call :meth:`aclose`.
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.config = config
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        if key := config.api_key():
            all_headers["Authorization"] = f"Bearer {key}"
        self._http = httpx.AsyncClient(
            base_url=config.base_url.rstrip("/") + "/",
            headers=all_headers,
            timeout=httpx.Timeout(config.timeout_s, connect=min(30.0, config.timeout_s)),
            transport=transport,
        )
        self._sleep = sleep

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._http.aclose()

    def _body(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        tool_choice: str | Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": [_clean_message(m) for m in messages],
            "temperature": self.config.temperature,
        }
        if self.config.max_tokens is not None:
            body["max_tokens"] = self.config.max_tokens
        if tools:
            body["tools"] = [dict(t) for t in tools]
            if tool_choice is not None:
                body["tool_choice"] = tool_choice
        body.update(self.config.extra_body)
        return body

    def _delay(self, retry: int, response: httpx.Response | None) -> float:
        hinted = _retry_after(response) if response is not None else None
        if hinted is not None:
            return min(hinted, 60.0)
        base = self.config.retry_backoff_s * (2**retry)
        return float(min(60.0, base * (0.5 + random.random())))

    async def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        tool_choice: str | Mapping[str, Any] | None = None,
    ) -> ChatResult:
        """Send one chat request and return the first choice (retrying transient failures).

        Raises :class:`ModelError` for a non-retryable status (e.g. 400, 401, 404) or when
        retries run out, and :class:`ModelResponseError` for an unreadable 2xx answer.
        """
        body = self._body(messages, tools, tool_choice)
        retry = 0
        while True:
            response: httpx.Response | None = None
            failure: str
            try:
                response = await self._http.post("chat/completions", json=body)
            except httpx.TransportError as exc:
                failure = f"{type(exc).__name__}: {exc}"
            else:
                status = response.status_code
                if status < 300:
                    return self._parse(response)
                failure = f"HTTP {status}: {_snippet(response.text)}"
                if not (status in RETRY_STATUSES or status >= 500):
                    raise ModelError(
                        f"chat request to {self._http.base_url} failed with {failure}",
                        status_code=status,
                        body=response.text,
                    )
            if retry >= self.config.max_retries:
                raise ModelError(
                    f"chat request to {self._http.base_url} failed after "
                    f"{retry + 1} attempts; last error: {failure}",
                    status_code=response.status_code if response is not None else None,
                    body=response.text if response is not None else "",
                )
            await self._sleep(self._delay(retry, response))
            retry += 1

    def _parse(self, response: httpx.Response) -> ChatResult:
        try:
            data = response.json()
        except ValueError as exc:
            raise ModelResponseError(
                f"the model server answered {response.status_code} with non-JSON: "
                f"{_snippet(response.text)}",
                status_code=response.status_code,
                body=response.text,
            ) from exc
        choices = data.get("choices") if isinstance(data, dict) else None
        if not choices or not isinstance(choices[0], dict):
            raise ModelResponseError(
                f"the model server's answer has no choices: {_snippet(response.text)}",
                status_code=response.status_code,
                body=response.text,
            )
        choice = choices[0]
        raw = choice.get("message")
        message = dict(raw) if isinstance(raw, dict) else {}
        message["role"] = "assistant"
        message.setdefault("content", None)
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        completion_tokens = int(usage.get("completion_tokens") or 0)
        return ChatResult(
            message=message,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost=self.config.cost(prompt_tokens, completion_tokens),
            finish_reason=choice.get("finish_reason"),
            model=data.get("model"),
        )
