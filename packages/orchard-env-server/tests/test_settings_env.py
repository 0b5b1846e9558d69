"""``Settings.from_env``: every ``ORCHARD_ENV_*`` variable reaches its field, parsed."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard_env_server.settings import Settings

pytestmark = pytest.mark.fast

ENVIRONMENT = {
    "ORCHARD_ENV_STATE_DIR": "/srv/state",
    "ORCHARD_ENV_BACKEND": "docker",
    "ORCHARD_ENV_AGENT_IMAGE": "orchard/agent-injector:test",
    "ORCHARD_ENV_AGENT_BUNDLE": "/opt/agent",
    "ORCHARD_ENV_BRIDGE_ALLOWED_UPSTREAMS": " 10.0.0.0/8, ,example.test:443",
    "ORCHARD_ENV_BRIDGE_MAX_REQUEST_BYTES": "4096",
    "ORCHARD_ENV_LOCAL_ROOTFS_DIRS": "/srv/a,/srv/b",
    "ORCHARD_ENV_IMAGE_STORE": "/srv/store",
    "ORCHARD_ENV_REGISTRY_MIRRORS": "docker.io=http://127.0.0.1:5000/",
    "ORCHARD_ENV_INSECURE_REGISTRIES": "127.0.0.1:5000",
    "ORCHARD_ENV_PULL_REGISTRIES": "docker.io,ghcr.io",
    "ORCHARD_ENV_PULL_TIMEOUT": "12.5",
    "ORCHARD_ENV_IMAGE_PULL": "never",
    "ORCHARD_ENV_KUBECONFIG": "/srv/kubeconfig",
    "ORCHARD_ENV_NAMESPACE": "sandboxes",
    "ORCHARD_ENV_IMAGE_PULL_POLICY": "Never",
    "ORCHARD_ENV_ORCHESTRATOR_ID": "orch-1",
    "ORCHARD_ENV_RUNTIME_CLASS": "gvisor",
    "ORCHARD_ENV_WARM_POOLS": "host=4, orchard-test/debian:latest=2",
    "ORCHARD_ENV_WARM_POOL_IDLE": "30",
}


def test_every_variable_reaches_its_field(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    settings = Settings.from_env()
    assert settings.state_dir == Path("/srv/state") and settings.backend == "docker"
    assert settings.agent_image == "orchard/agent-injector:test"
    assert settings.docker.agent_bundle == Path("/opt/agent")
    assert settings.bridge_allowed_upstreams == ["10.0.0.0/8", "example.test:443"]
    assert settings.bridge_max_request_bytes == 4096
    assert settings.local.rootfs_dirs == [Path("/srv/a"), Path("/srv/b")]
    assert settings.local.image_store == Path("/srv/store")
    assert settings.local.registry_mirrors == {"docker.io": "http://127.0.0.1:5000"}
    assert settings.local.insecure_registries == ["127.0.0.1:5000"]
    assert settings.local.pull_registries == ["docker.io", "ghcr.io"]
    assert settings.local.pull_timeout_s == 12.5 and settings.local.image_pull == "never"
    assert (
        settings.kubernetes.kubeconfig == Path("/srv/kubeconfig")
        and settings.kubernetes.namespace == "sandboxes"
    )
    assert (
        settings.kubernetes.image_pull_policy == "Never"
        and settings.kubernetes.orchestrator_id == "orch-1"
    )
    assert settings.kubernetes.runtime_class == "gvisor"
    assert settings.warm_pools == {"host": 4, "orchard-test/debian:latest": 2}
    assert settings.warm_pool_idle_s == 30.0


def test_empty_variables_keep_defaults_and_overrides_win(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENVIRONMENT:
        monkeypatch.setenv(name, "")
    monkeypatch.setenv("ORCHARD_ENV_API_KEYS", "")
    defaults = Settings()
    settings = Settings.from_env({"kubernetes.namespace": "mine", "backend": None})
    assert settings.kubernetes.namespace == "mine" and settings.backend == defaults.backend
    assert settings.state_dir == defaults.state_dir and settings.api_keys == {}


def test_each_backend_has_its_own_section() -> None:
    settings = Settings.from_env({"local.isolation": "none", "docker.network": "orchard-net"})
    assert settings.local.isolation == "none" and settings.docker.network == "orchard-net"
    assert settings.kubernetes.namespace == Settings().kubernetes.namespace
    with pytest.raises(ValueError, match="unknown settings section 'podman'"):
        Settings.from_env({"podman.socket": "/run/podman.sock"})
    with pytest.raises(TypeError, match="unexpected keyword argument 'namespace'"):
        Settings.from_env({"docker.namespace": "x"})
