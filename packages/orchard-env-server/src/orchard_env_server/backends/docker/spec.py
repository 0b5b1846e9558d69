"""The container a Docker sandbox is: a pure function of the record and the settings."""

from __future__ import annotations

from typing import Any

from ...quantities import parse_cpu
from ...records import SandboxRecord
from ...settings import Settings
from ..base import BackendError
from ..hardening import docker_confinement
from ..injection import RUN_MOUNT, agent_entry, label, memory_limit
from .injection import AgentMount

LABEL_SANDBOX = label("sandbox-id")
LABEL_TENANT = label("tenant")
LABEL_ORCHESTRATOR = label("orchestrator")
AGENT_SOCKET = f"{RUN_MOUNT}/agent.sock"
AGENT_TOKEN_FILE = f"{RUN_MOUNT}/token"


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
        "NetworkMode": "none" if record.block_network else settings.docker.network,
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
