"""Service configuration: one attrs object built from CLI flags and environment."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs

from .pools import parse_pools


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


# Registries a create request may make the local backend pull from (the operator's own
# `orchard-env image pull` may pull from any).
DEFAULT_PULL_REGISTRIES = (
    "docker.io",
    "ghcr.io",
    "quay.io",
    "registry.k8s.io",
    "public.ecr.aws",
    "mcr.microsoft.com",
)


def parse_mirrors(items: list[str]) -> dict[str, str]:
    """``REGISTRY=URL`` items (``docker.io=http://127.0.0.1:5000``) as a mapping."""
    mirrors: dict[str, str] = {}
    for item in items:
        registry, sep, url = item.strip().partition("=")
        if not sep or not registry or not url.startswith(("http://", "https://")):
            raise ValueError(f"invalid registry mirror {item!r}: expected REGISTRY=http(s)://HOST")
        mirrors[registry] = url.rstrip("/")
    return mirrors


@attrs.define
class LocalSettings:
    """The local backend: bubblewrap sandboxes on this machine, and its image store."""

    # bubblewrap (required; "auto" is the same) | none (unisolated, loudly)
    isolation: str = "bubblewrap"
    host_paths: list[Path] = attrs.Factory(list)  # extra host dirs shown read-only
    # Host dirs under which a create may name a root filesystem directory or archive by
    # absolute path (none by default: such a tree is id-mapped onto the sandbox's root, so
    # only an operator may decide which host trees tenants can run).
    rootfs_dirs: list[Path] = attrs.Factory(list)
    # Machine-wide claims of local sandboxes' host uid ranges (shared by every orchestrator).
    uid_registry: Path = Path("/run/orchard-env/uid-ranges")
    # The image store: pull an image a create names that the store lacks ("missing") or
    # refuse it ("never"); registries to pull from instead of another
    # (``{"docker.io": "http://127.0.0.1:5000"}``); registry hosts reached over plain http.
    image_pull: str = "missing"
    image_store: Path | None = None  # default: <state_dir>/image-store; servers may share one
    registry_mirrors: dict[str, str] = attrs.Factory(dict)
    insecure_registries: list[str] = attrs.Factory(list)
    # Registries a create request may pull from; those of ``insecure_registries`` and
    # ``registry_mirrors`` count too (the operator named them). Others are refused before
    # any connection: an operator pulls such images beforehand (`orchard-env image pull`).
    pull_registries: list[str] = attrs.Factory(lambda: list(DEFAULT_PULL_REGISTRIES))
    # A create's pull fails when it takes longer.
    pull_timeout_s: float = attrs.field(default=1800.0, validator=attrs.validators.gt(0))


@attrs.define
class DockerSettings:
    """The Docker backend: a sandbox is a container on one engine."""

    host: str | None = None  # the engine's address; default: $DOCKER_HOST, else the socket
    network: str = "bridge"  # for sandboxes with block_network=false
    agent_bundle: Path | None = None  # bind this agent bundle directory instead of the image


@attrs.define
class KubernetesSettings:
    """The Kubernetes backend: a sandbox is a Pod."""

    kubeconfig: Path | None = None  # default: in-cluster config in a pod, else $KUBECONFIG
    namespace: str = "orchard-sandboxes"  # where sandbox pods live
    image_pull_policy: str = "IfNotPresent"  # of sandbox and injector images
    orchestrator_id: str | None = None  # labels sandboxes with their creator; default hostname
    runtime_class: str | None = None  # sandbox pods' runtimeClassName (gVisor, Kata)


@attrs.define
class Settings:
    """Everything the service needs to know at start: the service's own settings, those
    every backend shares, and one section per backend (``local``, ``docker``, ``kubernetes``).
    """

    backend: str = "local"
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
    # Ordinary execs served without FastAPI's general request path (exec_fast_path.py);
    # off (ORCHARD_ENV_EXEC_FAST_PATH=0) sends every exec through the route itself.
    exec_fast_path: bool = True
    keep_sandboxes_on_exit: bool | None = None  # None: the backend's default
    default_ttl_seconds: float | None = None
    # Warm pools (``pools.py``): image → sandboxes kept ready; a pool not drawn from for
    # ``warm_pool_idle_s`` is emptied until the image's next create.
    warm_pools: dict[str, int] = attrs.Factory(dict)
    warm_pool_idle_s: float = attrs.field(default=600.0, validator=attrs.validators.gt(0))
    # Sandboxes on more than one backend
    agent_image: str = "orchard/agent-injector:latest"  # the injector (Docker, Kubernetes)
    pids_limit: int = 1024  # per sandbox (container, or local cgroup)
    # The memory cap of local and Docker sandboxes that ask for none (Kubernetes: the
    # namespace's LimitRange). None: no cap but the machine's.
    memory_default: str | None = "4Gi"
    # Service bridges: upstream URL prefixes a sandbox's bridges may point under (empty:
    # any http or https URL), and the cap on one bridged request's body.
    bridge_allowed_upstreams: list[str] = attrs.Factory(list)
    bridge_max_request_bytes: int = 32 << 20
    local: LocalSettings = attrs.Factory(LocalSettings)
    docker: DockerSettings = attrs.Factory(DockerSettings)
    kubernetes: KubernetesSettings = attrs.Factory(KubernetesSettings)

    @property
    def image_store_dir(self) -> Path:
        """Where the local backend's image store lives."""
        return self.local.image_store or self.state_dir / "image-store"

    @classmethod
    def from_env(cls, overrides: Mapping[str, object] | None = None) -> Settings:
        """Defaults, then ``ORCHARD_ENV_*`` variables, then explicit overrides.

        Keys name a field of the service (``"port"``) or of a backend's section
        (``"kubernetes.namespace"``); a None value keeps what came before it.
        """
        values: dict[str, object] = {}
        if "ORCHARD_ENV_API_KEYS" in os.environ:  # set but empty: no keys, not the default
            values["api_keys"] = parse_api_keys(os.environ["ORCHARD_ENV_API_KEYS"])
        for name, (variable, parse) in _FROM_ENVIRONMENT.items():
            if os.environ.get(variable):
                values[name] = parse(os.environ[variable])
        values.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return _build(cls, values)


_SECTIONS: dict[str, type] = {
    "local": LocalSettings,
    "docker": DockerSettings,
    "kubernetes": KubernetesSettings,
}


def _build(cls: type[Settings], values: Mapping[str, object]) -> Settings:
    top: dict[str, object] = {}
    sections: dict[str, dict[str, object]] = {name: {} for name in _SECTIONS}
    for key, value in values.items():
        section, dot, name = key.partition(".")
        if not dot:
            top[key] = value
        elif section in sections:
            sections[section][name] = value
        else:
            raise ValueError(f"unknown settings section {section!r} (in {key!r})")
    for section, fields in sections.items():
        top[section] = _SECTIONS[section](**fields)
    return cls(**top)  # type: ignore[arg-type]


def _items(raw: str) -> list[str]:
    return [item.strip() for item in raw.split(",") if item.strip()]


_OFF = ("0", "false", "no", "off")
_FROM_ENVIRONMENT: dict[str, tuple[str, Callable[[str], object]]] = {
    "state_dir": ("ORCHARD_ENV_STATE_DIR", Path),
    "backend": ("ORCHARD_ENV_BACKEND", str),
    "agent_image": ("ORCHARD_ENV_AGENT_IMAGE", str),
    "bridge_allowed_upstreams": ("ORCHARD_ENV_BRIDGE_ALLOWED_UPSTREAMS", _items),
    "bridge_max_request_bytes": ("ORCHARD_ENV_BRIDGE_MAX_REQUEST_BYTES", int),
    "warm_pools": ("ORCHARD_ENV_WARM_POOLS", lambda raw: parse_pools(_items(raw))),
    "warm_pool_idle_s": ("ORCHARD_ENV_WARM_POOL_IDLE", float),
    "exec_fast_path": ("ORCHARD_ENV_EXEC_FAST_PATH", lambda raw: raw.lower() not in _OFF),
    "local.rootfs_dirs": (
        "ORCHARD_ENV_LOCAL_ROOTFS_DIRS",
        lambda raw: [Path(p) for p in _items(raw)],
    ),
    "local.image_store": ("ORCHARD_ENV_IMAGE_STORE", Path),
    "local.registry_mirrors": (
        "ORCHARD_ENV_REGISTRY_MIRRORS",
        lambda raw: parse_mirrors(raw.split(",")),
    ),
    "local.insecure_registries": ("ORCHARD_ENV_INSECURE_REGISTRIES", _items),
    "local.pull_registries": ("ORCHARD_ENV_PULL_REGISTRIES", _items),
    "local.pull_timeout_s": ("ORCHARD_ENV_PULL_TIMEOUT", float),
    "local.image_pull": ("ORCHARD_ENV_IMAGE_PULL", str),
    "docker.agent_bundle": ("ORCHARD_ENV_AGENT_BUNDLE", Path),
    "kubernetes.kubeconfig": ("ORCHARD_ENV_KUBECONFIG", Path),
    "kubernetes.namespace": ("ORCHARD_ENV_NAMESPACE", str),
    "kubernetes.image_pull_policy": ("ORCHARD_ENV_IMAGE_PULL_POLICY", str),
    "kubernetes.orchestrator_id": ("ORCHARD_ENV_ORCHESTRATOR_ID", str),
    "kubernetes.runtime_class": ("ORCHARD_ENV_RUNTIME_CLASS", str),
}
"""Settings read from the environment by :meth:`Settings.from_env`: the field (dotted for a
backend's section), its variable and how its (non-empty) value is parsed."""
