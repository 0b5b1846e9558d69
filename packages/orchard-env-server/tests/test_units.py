"""Pure logic of the orchestrator: keys, tenants, records, bubblewrap arguments."""

from __future__ import annotations

import pytest

from orchard_env_server.auth import tenant_for
from orchard_env_server.errors import ApiError
from orchard_env_server.records import AgentEndpoint, SandboxRecord
from orchard_env_server.settings import parse_api_keys

pytestmark = pytest.mark.fast


def test_api_keys_parse_with_and_without_tenant_names():
    keys = parse_api_keys("alice:k1, k2 ,")
    assert keys["k1"] == "alice"
    assert keys["k2"].startswith("t-") and "k2" not in keys["k2"]


def test_an_empty_key_entry_is_an_error():
    with pytest.raises(ValueError):
        parse_api_keys("alice:")


def test_tenants_come_from_keys_and_auth_is_off_without_keys():
    assert tenant_for({}, None) == "default"
    assert tenant_for({"k": "alice"}, "k") == "alice"
    for key in (None, "nope"):
        with pytest.raises(ApiError) as err:
            tenant_for({"k": "alice"}, key)
        assert err.value.status == 401


def test_a_record_survives_persistence():
    record = SandboxRecord(
        sandbox_id="s1",
        tenant="t",
        image="host",
        labels={"a": "b"},
        ttl_seconds=5,
        backend_state={"pid": 3},
    )
    record.agent = AgentEndpoint("http://x", "tok", "s1")
    again = SandboxRecord.from_persisted(record.to_persisted())
    assert again.to_persisted() == record.to_persisted()
    assert again.expires_at == pytest.approx(record.created_at + 5)
