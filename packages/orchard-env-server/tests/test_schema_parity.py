"""The client's attrs models and the server's OpenAPI schema name the same fields."""

from __future__ import annotations

import attrs
import pytest

import orchard_env_client.models as client_models
from orchard_env_server.app import create_app
from orchard_env_server.settings import Settings

pytestmark = pytest.mark.fast

# server schema name -> client model name
PAIRS = {
    "CreateSandboxRequest": "CreateSandboxRequest",
    "ExecRequest": "ExecRequest",
    "ApplyPatchRequest": "ApplyPatchRequest",
    "WriteFileRequest": "WriteFileRequest",
    "SandboxInfo": "Sandbox",
    "JobInfo": "Job",
    "Usage": "Usage",
    "PatchResult": "PatchResult",
    "FileEntry": "FileInfo",
    "FileList": "FileList",
    "WriteFileResult": "WriteFileResult",
    "DeleteResult": "DeleteResult",
    "Health": "Health",
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
