"""Service configuration: one attrs object built from CLI flags and environment."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import attrs


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "orchard-env"


def parse_api_keys(raw: str | None) -> dict[str, str]:
    """Parse ``ORCHARD_ENV_API_KEYS``: comma-separated ``key`` or ``tenant:key`` items.

    Returns a mapping key → tenant name. A bare key's tenant is a short hash of it, so
    tenant names never reveal keys.
    """
    keys: dict[str, str] = {}
    for item in (raw or "").split(","):
        item = item.strip()
        if not item:
            continue
        tenant, sep, key = item.partition(":")
        if not sep:
            key, tenant = tenant, "t-" + hashlib.sha256(tenant.encode()).hexdigest()[:12]
        if not key or not tenant:
            raise ValueError(f"invalid API key entry {item!r}: expected KEY or TENANT:KEY")
        keys[key] = tenant
    return keys


@attrs.define
class Settings:
    """Everything the service needs to know at start."""

    backend: str = "local"
    # local backend: bubblewrap (required; "auto" is the same) | none (unisolated, loudly)
    isolation: str = "bubblewrap"
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: dict[str, str] = attrs.Factory(dict)
    state_dir: Path = attrs.Factory(default_state_dir)
    max_inflight: int = 1024
    max_sandboxes_per_tenant: int = 2000
    max_output_bytes: int = 1 << 20
    max_upload_bytes: int = 1 << 30
    max_json_file_bytes: int = 64 << 20
    reaper_interval_s: float = 1.0
    # How often every ready sandbox is checked for life (a request that finds its agent
    # gone checks at once): at 1,000 sandboxes a check a second costs real CPU.
    health_check_interval_s: float = 5.0
    failed_retention_s: float = 300.0
    keep_sandboxes_on_exit: bool | None = None  # None: the backend's default
    default_ttl_seconds: float | None = None
    # Docker backend
    docker_host: str | None = None  # default: $DOCKER_HOST, else the local socket
    agent_image: str = "orchard/agent-injector:latest"  # the injector image (init container)
    agent_bundle: Path | None = None  # or: bind this agent bundle directory read-only
    pids_limit: int = 1024  # per sandbox (container, or local cgroup)
    # The memory cap of local and Docker sandboxes that ask for none (Kubernetes: the
    # namespace's LimitRange). None: no cap but the machine's.
    memory_default: str | None = "4Gi"
    local_host_paths: list[Path] = attrs.Factory(list)  # extra host dirs shown read-only
    # Machine-wide claims of local sandboxes' host uid ranges (shared by every orchestrator).
    local_uid_registry: Path = Path("/run/orchard-env/uid-ranges")
    docker_network: str = "bridge"  # for sandboxes with block_network=false
    # Service bridges: upstream URL prefixes a sandbox's bridges may point under (empty:
    # any http or https URL), and the cap on one bridged request's body.
    bridge_allowed_upstreams: list[str] = attrs.Factory(list)
    bridge_max_request_bytes: int = 32 << 20
    # Kubernetes backend
    kubeconfig: Path | None = None  # default: in-cluster config in a pod, else $KUBECONFIG
    namespace: str = "orchard-sandboxes"  # where sandbox pods live
    image_pull_policy: str = "IfNotPresent"  # of sandbox and injector images
    orchestrator_id: str | None = None  # labels sandboxes with their creator; default hostname
    runtime_class: str | None = None  # sandbox pods' runtimeClassName (gVisor, Kata)

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Defaults, then ``ORCHARD_ENV_*`` variables, then explicit overrides."""
        values: dict[str, object] = {}
        if "ORCHARD_ENV_API_KEYS" in os.environ:
            values["api_keys"] = parse_api_keys(os.environ["ORCHARD_ENV_API_KEYS"])
        if os.environ.get("ORCHARD_ENV_STATE_DIR"):
            values["state_dir"] = Path(os.environ["ORCHARD_ENV_STATE_DIR"])
        if os.environ.get("ORCHARD_ENV_BACKEND"):
            values["backend"] = os.environ["ORCHARD_ENV_BACKEND"]
        if os.environ.get("ORCHARD_ENV_AGENT_IMAGE"):
            values["agent_image"] = os.environ["ORCHARD_ENV_AGENT_IMAGE"]
        if os.environ.get("ORCHARD_ENV_AGENT_BUNDLE"):
            values["agent_bundle"] = Path(os.environ["ORCHARD_ENV_AGENT_BUNDLE"])
        if os.environ.get("ORCHARD_ENV_BRIDGE_ALLOWED_UPSTREAMS"):
            raw = os.environ["ORCHARD_ENV_BRIDGE_ALLOWED_UPSTREAMS"].split(",")
            values["bridge_allowed_upstreams"] = [p.strip() for p in raw if p.strip()]
        if os.environ.get("ORCHARD_ENV_BRIDGE_MAX_REQUEST_BYTES"):
            values["bridge_max_request_bytes"] = int(
                os.environ["ORCHARD_ENV_BRIDGE_MAX_REQUEST_BYTES"]
            )
        for name, env in (
            ("kubeconfig", "ORCHARD_ENV_KUBECONFIG"),
            ("namespace", "ORCHARD_ENV_NAMESPACE"),
            ("image_pull_policy", "ORCHARD_ENV_IMAGE_PULL_POLICY"),
            ("orchestrator_id", "ORCHARD_ENV_ORCHESTRATOR_ID"),
            ("runtime_class", "ORCHARD_ENV_RUNTIME_CLASS"),
        ):
            if os.environ.get(env):
                values[name] = Path(os.environ[env]) if name == "kubeconfig" else os.environ[env]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]
