"""``orchard-env``: the command line of the service."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .backends import BACKENDS
from .images import cli as image_cli
from .log_redaction import redact_handlers
from .pools import parse_pools
from .settings import Settings, parse_api_keys, parse_mirrors

# Subcommands of the orchard-env-bench package (it measures a running service through the
# client, which this package does not depend on): main() passes their arguments on unparsed.
_DELEGATED = {
    "bench": "measure the service (needs orchard-env-bench; orchard-env bench -h)",
    "cost": "self-hosted vs managed sandbox cost (needs orchard-env-bench)",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchard-env", description="Orchard Env sandbox service")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the orchestrator")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--backend", default=None, choices=BACKENDS, help="default: local")
    serve.add_argument(
        "--api-keys",
        default=None,
        help="comma-separated KEY or TENANT:KEY (default: $ORCHARD_ENV_API_KEYS; none = auth off)",
    )
    serve.add_argument("--state-dir", type=Path, default=None, help="where sandboxes live")
    serve.add_argument(
        "--isolation",
        default=None,
        choices=["auto", "bubblewrap", "none"],
        help="local backend: bubblewrap (the default; auto is the same) refuses to start "
        "without it; none runs commands UNISOLATED on this host (trusted code only)",
    )
    images = serve.add_argument_group("local backend images (see docs/images.md)")
    images.add_argument(
        "--image-pull",
        default=None,
        choices=["missing", "never"],
        help="pull an image a create names that the image store lacks (missing, the "
        "default) or refuse the create (never)",
    )
    images.add_argument(
        "--image-store",
        type=Path,
        default=None,
        help="the image store's directory (default: STATE_DIR/image-store; servers may share one)",
    )
    images.add_argument(
        "--registry-mirror",
        action="append",
        default=None,
        metavar="REGISTRY=URL",
        help="pull REGISTRY's images from URL instead (repeatable), e.g. "
        "docker.io=http://127.0.0.1:5000",
    )
    images.add_argument(
        "--insecure-registry",
        action="append",
        default=None,
        metavar="HOST",
        help="a registry reached over plain http (repeatable)",
    )
    images.add_argument(
        "--pull-registry",
        action="append",
        default=None,
        dest="pull_registries",
        metavar="HOST",
        help="a registry a create request may pull from (repeatable; replaces the default "
        "docker.io, ghcr.io, quay.io, registry.k8s.io, public.ecr.aws, mcr.microsoft.com; "
        "--insecure-registry and --registry-mirror registries count too)",
    )
    images.add_argument(
        "--pull-timeout",
        type=float,
        default=None,
        dest="pull_timeout_s",
        metavar="S",
        help="a create's pull fails after this many seconds (default 1800)",
    )
    docker = serve.add_argument_group("docker backend")
    docker.add_argument(
        "--docker-host", default=None, help="engine address (default: $DOCKER_HOST)"
    )
    docker.add_argument(
        "--agent-image",
        default=None,
        help="injector image holding the agent bundle (default: orchard/agent-injector:latest)",
    )
    docker.add_argument(
        "--agent-bundle", type=Path, default=None, help="bind this bundle dir instead of the image"
    )
    docker.add_argument(
        "--pids-limit",
        type=int,
        default=None,
        help="processes per sandbox, docker and local (default 1024)",
    )
    serve.add_argument(
        "--memory-default",
        "--local-memory-default",
        dest="memory_default",
        default=None,
        metavar="QUANTITY",
        help="local and docker backends: memory cap of sandboxes that ask "
        "for none (default 4Gi; 'none' for no cap)",
    )
    serve.add_argument(
        "--local-host-path",
        dest="local_host_paths",
        type=Path,
        action="append",
        default=None,
        metavar="DIR",
        help="local backend: also show this host directory, read-only, in every "
        "sandbox of image host (repeatable)",
    )
    serve.add_argument(
        "--local-rootfs-dir",
        dest="local_rootfs_dirs",
        type=Path,
        action="append",
        default=None,
        metavar="DIR",
        help="local backend: let creates name root filesystem directories or archives by "
        "absolute path under this host directory (repeatable; default: none, store images "
        "and host only; $ORCHARD_ENV_LOCAL_ROOTFS_DIRS, comma-separated)",
    )
    kube = serve.add_argument_group("kubernetes backend")
    kube.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="default: the in-cluster config in a pod, else $KUBECONFIG or ~/.kube/config",
    )
    kube.add_argument(
        "--namespace", default=None, help="for sandbox pods (default orchard-sandboxes)"
    )
    kube.add_argument(
        "--image-pull-policy",
        default=None,
        choices=["IfNotPresent", "Never", "Always"],
        help="of sandbox and injector images (default IfNotPresent)",
    )
    kube.add_argument(
        "--orchestrator-id", default=None, help="labels the sandboxes it creates (default hostname)"
    )
    kube.add_argument(
        "--runtime-class",
        default=None,
        metavar="NAME",
        help="sandbox pods' runtimeClassName, e.g. gVisor or Kata (docs/security.md)",
    )
    bridges = serve.add_argument_group("service bridges")
    bridges.add_argument(
        "--bridge-allow-upstream",
        dest="bridge_allowed_upstreams",
        action="append",
        default=None,
        metavar="URL_PREFIX",
        help="bridges may point only under this URL prefix (repeatable; default: any http or "
        "https URL; or $ORCHARD_ENV_BRIDGE_ALLOWED_UPSTREAMS, comma-separated)",
    )
    bridges.add_argument(
        "--bridge-max-request-bytes",
        type=int,
        default=None,
        help="cap on a bridged request's body (default 32 MiB; larger ones are answered 413)",
    )
    serve.add_argument("--max-inflight", type=int, default=None, help="503 beyond this many")
    serve.add_argument("--max-output-bytes", type=int, default=None, help="per stream, per job")
    serve.add_argument("--max-upload-bytes", type=int, default=None)
    serve.add_argument("--default-ttl", type=float, default=None, help="ttl_seconds if unset")
    serve.add_argument(
        "--warm-pool",
        action="append",
        default=None,
        metavar="IMAGE=SIZE",
        help="keep SIZE sandboxes of IMAGE created ahead, so a create takes one at once "
        "(repeatable; local backend; see docs/performance.md)",
    )
    serve.add_argument(
        "--warm-pool-idle-ttl",
        type=float,
        default=None,
        dest="warm_pool_idle_s",
        metavar="S",
        help="empty a warm pool nobody drew from for S seconds (default 600)",
    )
    serve.add_argument(
        "--keep-sandboxes",
        action="store_true",
        default=None,
        help="leave sandboxes running on shutdown, for the next start to adopt "
        "(the default on kubernetes, where sandboxes belong to the cluster)",
    )
    serve.add_argument(
        "--delete-sandboxes-on-exit",
        dest="keep_sandboxes",
        action="store_false",
        help="delete this process's sandboxes on shutdown (the default on local and docker)",
    )
    serve.add_argument("--log-level", default="info")
    for name, text in _DELEGATED.items():  # listed in --help; main() hands them over
        sub.add_parser(name, help=text, add_help=False)
    image_cli.add_parser(sub)
    serve.add_argument(
        "--access-log", action="store_true", help="one JSON line per request (request id, ms)"
    )
    return parser


def _memory_default(raw: str | None) -> str | None:
    """None keeps the setting's default; "none" (or "0") means no cap."""
    if raw is None:
        return None
    return "" if raw.strip().lower() in ("none", "0") else raw


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from orchard_env_agent.oslimits import raise_open_file_limit

    from .app import create_app

    overrides: dict[str, object] = {
        "host": args.host,
        "port": args.port,
        "backend": args.backend,
        "state_dir": args.state_dir,
        "local.isolation": args.isolation,
        "max_inflight": args.max_inflight,
        "max_output_bytes": args.max_output_bytes,
        "max_upload_bytes": args.max_upload_bytes,
        "default_ttl_seconds": args.default_ttl,
        "warm_pool_idle_s": args.warm_pool_idle_s,
        "keep_sandboxes_on_exit": args.keep_sandboxes,
        "docker.host": args.docker_host,
        "agent_image": args.agent_image,
        "docker.agent_bundle": args.agent_bundle,
        "pids_limit": args.pids_limit,
        "memory_default": _memory_default(args.memory_default),
        "local.host_paths": args.local_host_paths,
        "local.rootfs_dirs": args.local_rootfs_dirs,
        "kubernetes.kubeconfig": args.kubeconfig,
        "kubernetes.namespace": args.namespace,
        "kubernetes.image_pull_policy": args.image_pull_policy,
        "kubernetes.orchestrator_id": args.orchestrator_id,
        "kubernetes.runtime_class": args.runtime_class,
        "bridge_allowed_upstreams": args.bridge_allowed_upstreams,
        "bridge_max_request_bytes": args.bridge_max_request_bytes,
        "local.image_pull": args.image_pull,
        "local.image_store": args.image_store,
        "local.insecure_registries": args.insecure_registry,
        "local.pull_registries": args.pull_registries,
        "local.pull_timeout_s": args.pull_timeout_s,
    }
    if args.registry_mirror is not None:
        try:
            overrides["local.registry_mirrors"] = parse_mirrors(args.registry_mirror)
        except ValueError as exc:
            raise SystemExit(f"orchard-env serve: --registry-mirror: {exc}") from None
    if args.api_keys is not None:
        overrides["api_keys"] = parse_api_keys(args.api_keys)
    if args.warm_pool is not None:
        try:
            overrides["warm_pools"] = parse_pools(args.warm_pool)
        except ValueError as exc:
            raise SystemExit(f"orchard-env serve: --warm-pool: {exc}") from None
    try:
        settings = Settings.from_env(overrides)
    except ValueError as exc:  # a bad value from a flag or ORCHARD_ENV_* variable
        raise SystemExit(f"orchard-env serve: {exc}") from None
    if settings.warm_pools and settings.backend != "local":
        raise SystemExit("orchard-env serve: warm pools (--warm-pool) need the local backend")
    raise_open_file_limit()  # a connection per client and per busy sandbox agent
    log_format = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=args.log_level.upper(), format=log_format)
    redact_handlers(log_format)  # uvicorn's lines too: they propagate here (log_config=None)
    # One line per agent call would cost more than the call, and at debug level these log
    # the agent's token in their request headers.
    for noisy in ("httpx", "httpcore", "websockets"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    access = logging.getLogger("orchard_env_server.access")
    access.setLevel(logging.INFO if args.access_log else logging.WARNING)
    if not settings.api_keys and settings.host not in ("127.0.0.1", "localhost", "::1"):
        logging.warning(
            "listening on %s with NO API keys: anyone who can reach it can run code", settings.host
        )
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        log_config=None,  # our root handler and its redaction, not uvicorn's own handlers
        access_log=False,
        # Longer than any client's keep-alive expiry (httpx: 5 s): the client always closes
        # an idle connection first, so a request never races the server's close of it (a
        # non-idempotent exec sent on a closing connection would fail and cannot be retried).
        timeout_keep_alive=75,
        timeout_graceful_shutdown=10,
        # Nothing reads the client's address or scheme: X-Forwarded-* rewriting is a layer
        # every request would pass through for nothing.
        proxy_headers=False,
    )
    return 0


def _delegate(command: str, argv: list[str]) -> int:
    """Run ``orchard-env bench|cost ARGV`` by the orchard-env-bench package, which parses the
    arguments itself; 2 with a message when it is not installed."""
    try:
        from orchard_env_bench.cli import main as bench_main
    except ModuleNotFoundError as exc:
        if exc.name not in ("orchard_env_bench", "orchard_env_bench.cli"):
            raise  # installed, but something it imports is missing: show that
        print(
            f"orchard-env {command}: the benches and the cost model are a separate package: "
            "install orchard-env-bench (pip install orchard-env-bench; in this workspace, "
            "uv sync --all-packages)",
            file=sys.stderr,
        )
        return 2
    if command == "cost":
        return bench_main(["cost", *argv], prog="orchard-env")
    return bench_main(argv, prog="orchard-env bench", with_cost=False)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in _DELEGATED:
        return _delegate(argv[0], argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return serve(args)
    if args.command == "image":
        return image_cli.run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
