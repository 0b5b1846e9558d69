"""Which creates a warm pool may serve, and how pools are configured (pure logic)."""

from __future__ import annotations

import pytest

from orchard_env_server.pools import eligible, parse_pools
from orchard_env_server.schemas import CreateSandboxRequest

pytestmark = pytest.mark.fast


def test_pools_parse_as_image_and_size():
    assert parse_pools(["host=8", " registry:5000/img:1=2 "]) == {
        "host": 8,
        "registry:5000/img:1": 2,
    }
    for bad in ("host", "host=0", "=3", "host=x", "host=-1"):
        with pytest.raises(ValueError, match="IMAGE=SIZE"):
            parse_pools([bad])


def test_only_a_request_a_pooled_sandbox_fits_is_served_from_a_pool():
    assert eligible(CreateSandboxRequest(image="host"))
    assert eligible(
        CreateSandboxRequest(image="host", labels={"a": "b"}, ttl_seconds=60, timeout=10)
    )
    for unfit in (
        {"sandbox_id": "mine"},
        {"block_network": False},
        {"cpu": "1"},
        {"memory": "1Gi"},
        {"env": {"A": "1"}},
        {"workdir": "/srv"},
        {"bridges": {"8080": "http://127.0.0.1:1"}},
    ):
        assert not eligible(CreateSandboxRequest(image="host", **unfit)), unfit
