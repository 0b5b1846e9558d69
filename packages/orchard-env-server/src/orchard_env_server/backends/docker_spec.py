"""The container a Docker sandbox is: a pure function of the record and the settings."""

from __future__ import annotations

from typing import Any

from ..quantities import parse_cpu, parse_memory
from ..records import SandboxRecord
from ..settings import Settings
from .base import BackendError
from .docker_injection import RUN_MOUNT, AgentMount, agent_entry
from .hardening import docker_confinement

LABEL_SANDBOX = "org.orchard.sandbox-id"
LABEL_TENANT = "org.orchard.tenant"
LABEL_ORCHESTRATOR = "org.orchard.orchestrator"
AGENT_SOCKET = f"{RUN_MOUNT}/agent.sock"
AGENT_TOKEN_FILE = f"{RUN_MOUNT}/token"
MIN_MEMORY_BYTES = 32 << 20  # below this the agent itself cannot run


def memory_limit(value: str) -> int:
    """A sandbox's memory limit in bytes; ValueError when unreadable or too small."""
    memory = parse_memory(value)
    if memory < MIN_MEMORY_BYTES:
        raise ValueError(
            f"memory {value!r} is below the {MIN_MEMORY_BYTES >> 20} MiB "
            "a sandbox needs for its agent"
        )
    return memory


def container_name(sandbox_id: str) -> str:
    return f"orchard-{sandbox_id}"


def container_spec(
    record: SandboxRecord,
    settings: Settings,
    orchestrator_id: str,
    agent: AgentMount,
    run_dir: str,
) -> dict[str, Any]:
    """The Engine API body creating the sandbox's container.

    The image's own entrypoint is replaced by the injected agent; its ``WORKDIR``, ``ENV``
    and ``USER`` stay in force (Docker merges the image's env with the one given here).
    ``block_network`` means network mode ``none``: only loopback inside, while the
    orchestrator reaches the agent through the unix socket on the shared run directory.
    """
    host: dict[str, Any] = {
        **docker_confinement(),
        "Mounts": [agent.spec(), {"Type": "bind", "Source": run_dir, "Target": RUN_MOUNT}],
        "NetworkMode": "none" if record.block_network else settings.docker_network,
        "PidsLimit": settings.pids_limit,
        "RestartPolicy": {"Name": "no"},
        "LogConfig": {"Type": "json-file", "Config": {"max-size": "1m", "max-file": "1"}},
    }
    try:
        if record.cpu:
            host["NanoCpus"] = int(parse_cpu(record.cpu) * 1e9)
        asked = record.memory or settings.memory_default
        if asked:
            memory = memory_limit(asked)
            host["Memory"] = host["MemorySwap"] = memory  # no swap: the limit is the limit
    except ValueError as exc:
        raise BackendError(str(exc)) from exc
    env = {"ORCHARD_SANDBOX_ID": record.sandbox_id, **record.env}
    command = [
        "--uds",
        AGENT_SOCKET,
        "--token-file",
        AGENT_TOKEN_FILE,
        "--max-output-bytes",
        str(settings.max_output_bytes),
        "--max-upload-bytes",
        str(settings.max_upload_bytes),
    ]
    spec: dict[str, Any] = {
        "Image": record.image,
        "Entrypoint": agent_entry(),
        "Cmd": command,
        "Env": [f"{k}={v}" for k, v in env.items()],
        "Hostname": record.sandbox_id[:63],
        "Labels": {
            LABEL_SANDBOX: record.sandbox_id,
            LABEL_TENANT: record.tenant,
            LABEL_ORCHESTRATOR: orchestrator_id,
        },
        "HostConfig": host,
    }
    if record.workdir:
        spec["WorkingDir"] = record.workdir
    return spec
