"""The client's attrs models, the server's OpenAPI schema and the in-sandbox agent's body
validator describe the same JSON: the same fields, of the same types, required alike; and
the client maps only error codes the service sends."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest

import orchard_env_agent
import orchard_env_client.errors as client_errors
import orchard_env_client.models as client_models
import orchard_env_server
from orchard_env_agent.validate import EXEC_BODY, FILE_BODY, PATCH_BODY, BodySchema
from orchard_env_server.app import create_app
from orchard_env_server.settings import Settings

pytestmark = pytest.mark.fast

# server schema name -> client model name: the same names on both sides
PAIRS = {
    name: name
    for name in (
        "CreateSandboxRequest",
        "ExecRequest",
        "ApplyPatchRequest",
        "WriteFileRequest",
        "Sandbox",
        "Job",
        "Usage",
        "PatchResult",
        "FileInfo",
        "FileList",
        "WriteFileResult",
        "DeleteResult",
        "Health",
    )
}


@pytest.fixture(scope="module")
def schemas(tmp_path_factory):
    app = create_app(Settings(state_dir=tmp_path_factory.mktemp("state")))
    return app.openapi()["components"]["schemas"]


@pytest.mark.parametrize(("server_name", "client_name"), [(s, c) for s, c in PAIRS.items() if c])
def test_fields_match(schemas, server_name, client_name):
    server_fields = set(schemas[server_name]["properties"])
    client_fields = {f.name for f in attrs.fields(getattr(client_models, client_name))}
    assert server_fields == client_fields


def test_request_bodies_reject_unknown_fields(schemas):
    for name in ("CreateSandboxRequest", "ExecRequest", "ApplyPatchRequest", "WriteFileRequest"):
        assert schemas[name].get("additionalProperties") is False, name


def test_every_contract_route_is_served(tmp_path):
    paths = create_app(Settings(state_dir=tmp_path)).openapi()["paths"]
    expected = [
        "/",
        "/health",
        "/resources",
        "/metrics",
        "/sandboxes",
        "/sandboxes/{sandbox_id}",
        "/sandboxes/{sandbox_id}/wait",
        "/sandboxes/{sandbox_id}/heartbeat",
        "/sandboxes/{sandbox_id}/exec",
        "/sandboxes/{sandbox_id}/exec/stream",
        "/jobs/{job_id}",
        "/jobs/{job_id}/wait",
        "/jobs/{job_id}/cancel",
        "/sandboxes/{sandbox_id}/apply_patch",
        "/sandboxes/{sandbox_id}/files",
        "/sandboxes/{sandbox_id}/files/list",
        "/sandboxes/{sandbox_id}/fs",
        "/sandboxes/{sandbox_id}/ports/{port}/{path}",
    ]
    assert [p for p in expected if p not in paths] == []


# ---------------------------------------------------------------- types and required fields

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


def _client_types(annotation: Any) -> set[str]:
    """The JSON types a client field's annotation admits."""
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        return set().union(*(_client_types(arm) for arm in typing.get_args(annotation)))
    if origin is typing.Literal:
        return {_JSON_TYPES[type(value)] for value in typing.get_args(annotation)}
    if origin in (dict, Mapping) or annotation is dict:
        return {"object"}
    if origin is list or annotation is list:
        return {"array"}
    if isinstance(annotation, type) and attrs.has(annotation):
        return {"object"}
    return {_JSON_TYPES[annotation]}


def _server_types(prop: dict[str, Any]) -> set[str]:
    """The JSON types a server property's schema admits ($ref: an object)."""
    if "anyOf" in prop:
        return set().union(*(_server_types(arm) for arm in prop["anyOf"]))
    if "$ref" in prop:
        return {"object"}
    kind = prop.get("type")
    if kind is None:  # no constraint: any JSON value
        return {"string", "integer", "number", "boolean", "object", "array", "null"}
    return {kind} if isinstance(kind, str) else set(kind)


def _widened(kinds: set[str]) -> set[str]:
    """JSON's integers are numbers: a number field takes them too."""
    return kinds | {"integer"} if "number" in kinds else kinds


REQUESTS = [name for name in PAIRS if name.endswith("Request")]


@pytest.mark.parametrize(("server_name", "client_name"), list(PAIRS.items()))
def test_field_types_agree(schemas, server_name, client_name):
    """A request field's client type admits nothing the server refuses; a response
    field's client type admits everything the server may send (a client float takes the
    server's integers, as JSON does)."""
    model = getattr(client_models, client_name)
    hints = typing.get_type_hints(model)
    request = server_name in REQUESTS
    mismatched = {}
    for name, prop in schemas[server_name]["properties"].items():
        server, client = _widened(_server_types(prop)), _widened(_client_types(hints[name]))
        narrower, wider = (client, server) if request else (server, client)
        if not narrower <= wider:
            mismatched[name] = {"server": sorted(server), "client": sorted(client)}
    assert mismatched == {}


@pytest.mark.parametrize("name", REQUESTS)
def test_request_models_require_what_the_server_requires(schemas, name):
    client = getattr(client_models, PAIRS[name])
    must = {f.name for f in attrs.fields(client) if f.default is attrs.NOTHING}
    assert must == set(schemas[name].get("required", []))


@pytest.mark.parametrize("name", [n for n in PAIRS if n not in REQUESTS])
def test_response_models_require_only_what_the_server_always_sends(schemas, name):
    """A client field with no default must be in every answer: else parsing would fail on
    an answer the server may give."""
    client = getattr(client_models, PAIRS[name])
    must = {f.name for f in attrs.fields(client) if f.default is attrs.NOTHING}
    assert must <= set(schemas[name].get("required", []))


# ---------------------------------------------------------------- the agent's validator

# The request bodies the orchestrator forwards to the agent, and the fields only the
# orchestrator sets (it picks a job's id so it can answer for the job if the agent dies).
AGENT_BODIES: dict[str, tuple[BodySchema, set[str]]] = {
    "ExecRequest": (EXEC_BODY, {"job_id"}),
    "ApplyPatchRequest": (PATCH_BODY, set()),
    "WriteFileRequest": (FILE_BODY, set()),
}

# A value of each JSON type that the server's constraints on these fields admit.
_SAMPLES: dict[str, Any] = {
    "string": "x",
    "integer": 3,
    "number": 1.5,
    "boolean": True,
    "object": {"NAME": "value"},
    "array": ["x"],
}


@pytest.mark.parametrize("name", list(AGENT_BODIES))
def test_agent_takes_the_fields_the_server_forwards(schemas, name):
    body, orchestrator_only = AGENT_BODIES[name]
    assert set(body.fields) == set(schemas[name]["properties"]) | orchestrator_only
    assert body.required == set(schemas[name].get("required", []))


@pytest.mark.parametrize("name", list(AGENT_BODIES))
def test_agent_field_checks_agree_with_server_types(schemas, name):
    """Each JSON type the server admits for a field the agent admits too (it would refuse
    what the orchestrator forwards otherwise); each it refuses the agent refuses too (a
    caller may reach the agent directly)."""
    body, _ = AGENT_BODIES[name]
    disagree = {}
    for field, prop in schemas[name]["properties"].items():
        server = _widened(_server_types(prop)) - {"null"}
        check = body.fields[field][0]
        agent = {kind for kind, sample in _SAMPLES.items() if check(sample)}
        if agent != server:
            disagree[field] = {"server": sorted(server), "agent": sorted(agent)}
    assert disagree == {}


# ---------------------------------------------------------------- error codes

_SOURCES = [
    Path(orchard_env_server.__file__).parent,
    Path(orchard_env_agent.__file__).parent,
]


def _string_literals() -> set[str]:
    found: set[str] = set()
    for root in _SOURCES:
        for path in root.rglob("*.py"):
            found |= set(re.findall(r"\"([a-z_]+)\"", path.read_text()))
    return found


def test_every_error_code_the_client_maps_is_one_the_service_sends():
    """The client's code → exception map names no code that neither the orchestrator nor
    the agent ever puts in an error body."""
    sent = _string_literals()
    assert sorted(code for code in client_errors._BY_CODE if code not in sent) == []
