"""The exec route's fast path answers exactly as the route does: the same requests sent to
a server with it (the default) and to one without it (ORCHARD_ENV_EXEC_FAST_PATH=0) get
the same statuses and bodies, ids and times aside."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from orchard_testing import RunningServer

pytestmark = pytest.mark.integration

KEYS = "alice:key-a,bob:key-b"
ALICE = {"X-API-Key": "key-a"}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A local server with the fast path and one without; alice's and bob's sandbox on each."""
    found: dict[str, Any] = {}
    started = []
    try:
        for name, env in (("fast", {}), ("route", {"ORCHARD_ENV_EXEC_FAST_PATH": "0"})):
            srv = RunningServer(
                backend="local",
                state_dir=tmp_path_factory.mktemp(name) / "s",
                api_keys=KEYS,
                env=env,
            )
            srv.start()
            started.append(srv)
            http = httpx.Client(base_url=srv.url, timeout=60)
            own = {}
            for who, key in (("alice", "key-a"), ("bob", "key-b")):
                made = http.post("/sandboxes", json={"image": "host"}, headers={"X-API-Key": key})
                own[who] = made.json()["sandbox_id"]
                http.get(f"/sandboxes/{own[who]}/wait", headers={"X-API-Key": key})
            found[name] = (http, own)
        yield found
    finally:
        for http, _ in found.values():
            http.close()
        for srv in started:
            srv.stop()


def _normal(value: Any, ids: dict[str, str]) -> Any:
    """``value`` with sandbox ids named by their owner, and job ids and times masked."""
    if isinstance(value, dict):
        return {
            k: "<time>" if k.endswith("_at") and v is not None else _normal(v, ids)
            for k, v in value.items()
            if k != "usage"
        }
    if isinstance(value, list):
        return [_normal(v, ids) for v in value]
    if isinstance(value, str):
        for who, sandbox_id in ids.items():
            value = value.replace(sandbox_id, f"<{who}>")
        return re.sub(r"(<\w+>)\.[0-9a-f]{16}", r"\1.<job>", value)
    return value


def _both(servers: dict[str, Any], **request: Any) -> list[tuple[int, Any, str | None]]:
    answers = []
    for http, own in servers.values():
        kwargs = dict(request)
        if "chunks" in kwargs:  # a generator is consumed once: one per server
            kwargs["content"] = iter(kwargs.pop("chunks"))
        target = kwargs.pop("sandbox", "alice")
        sandbox_id = own.get(target, target)
        response = http.request("POST", f"/sandboxes/{sandbox_id}/exec", **kwargs)
        assert response.headers.get("x-request-id")
        answers.append(
            (response.status_code, _normal(response.json(), own), response.headers.get("allow"))
        )
    return answers


CASES: dict[str, dict[str, Any]] = {
    "a waited command": {"json": {"command": "echo hi; echo err >&2; exit 3", "wait": True}},
    "an argv command with stdin, env and cwd": {
        "json": {
            "command": ["sh", "-c", 'cat; echo "$X" "$PWD"'],
            "stdin": "in\n",
            "env": {"X": "y"},
            "cwd": "/tmp",
            "wait": True,
        }
    },
    "a timed-out command": {"json": {"command": "sleep 5", "timeout_seconds": 0.2, "wait": True}},
    "a background command": {"json": {"command": "true"}},
    "no key": {"json": {"command": "true"}, "headers": {}},
    "a wrong key": {"json": {"command": "true"}, "headers": {"X-API-Key": "nope"}},
    "another tenant's sandbox": {"json": {"command": "true"}, "sandbox": "bob"},
    "an unknown sandbox": {"json": {"command": "true"}, "sandbox": "sbx-000000000000"},
    "a body that is not JSON": {
        "content": b"{command: true}",
        "headers": {**ALICE, "Content-Type": "application/json"},
    },
    "JSON that is not an object": {"json": ["true"]},
    "an empty body": {"content": b"", "headers": {**ALICE, "Content-Type": "application/json"}},
    "an unknown field": {"json": {"command": "true", "shell": "zsh"}},
    "a bad timeout": {"json": {"command": "true", "timeout_seconds": -1}},
    "a NUL in the command": {"json": {"command": "echo \u0000"}},
    "an empty command": {"json": {"command": ""}},
    "a body not declared JSON": {
        "content": b'{"command": "true", "wait": true}',
        "headers": {**ALICE, "Content-Type": "text/plain"},
    },
    "a chunked body": {
        "chunks": [b'{"command": "echo chunked",', b' "wait": true}'],
        "headers": {**ALICE, "Content-Type": "application/json"},
    },
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_fast_path_answers_as_the_route_does(servers: dict[str, Any], case: str) -> None:
    fast, route = _both(servers, **{"headers": ALICE, **CASES[case]})
    assert fast == route
