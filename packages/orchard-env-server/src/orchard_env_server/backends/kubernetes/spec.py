"""The Kubernetes objects a sandbox is, and how a record is read back from them.

Everything here is a pure function of the record and the settings, so it is unit-tested
without a cluster. A sandbox is three objects sharing one name:

- a Secret holding the agent's token (never a label, annotation or env value);
- the Pod: an init container from the injector image copies the agent bundle into an
  emptyDir, the user's image runs the agent from there as its command;
- with ``block_network``, a NetworkPolicy that denies the pod all egress.

Every sandbox pod runs under the runtime's default seccomp profile, with all capabilities
dropped but ``SANDBOX_CAPABILITIES`` and no privilege escalation, in the runtime class
of the settings (gVisor, Kata) if one is named. The namespace's shared policies (other
sandboxes and the API server out of reach) are in ``kubernetes.network``.

The pod carries what any orchestrator replica needs to serve the sandbox: labels to select
it, and the record (less env and token) as a JSON annotation.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

from ...quantities import parse_cpu
from ...records import SandboxRecord
from ...settings import Settings
from ..base import BackendError
from ..hardening import SANDBOX_CAPABILITIES
from ..injection import AGENT_MOUNT, LABEL_PREFIX, agent_entry, memory_limit

GROUP = LABEL_PREFIX.rstrip("/")
LABEL_ROLE = f"{GROUP}/role"
LABEL_SANDBOX = f"{GROUP}/sandbox-id"
LABEL_NAME = f"{GROUP}/name"
LABEL_TENANT = f"{GROUP}/tenant"
LABEL_ORCHESTRATOR = f"{GROUP}/orchestrator"
LABEL_NETWORK = f"{GROUP}/network"  # sandbox pods: NETWORK_OPEN or NETWORK_BLOCKED
NETWORK_OPEN = "open"
NETWORK_BLOCKED = "blocked"
ANNOTATION_RECORD = f"{GROUP}/record"
ANNOTATION_LAST_ACTIVE = f"{GROUP}/last-active"
ROLE_SANDBOX = "sandbox"
ROLE_TOKEN = "sandbox-token"
ROLE_POLICY = "sandbox-egress"
SANDBOX_SELECTOR = f"{LABEL_ROLE}={ROLE_SANDBOX}"
TOKEN_SELECTOR = f"{LABEL_ROLE}={ROLE_TOKEN}"

AGENT_PORT = 7000
SECRET_MOUNT = "/.orchard/secret"
TOKEN_KEY = "token"
MAIN_CONTAINER = "sandbox"
INIT_CONTAINER = "orchard-agent"
_INJECTOR_TARGET = "/target"  # where the injector image copies the bundle to
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
# Fields of the record worth recovering; env stays in the pod spec, the token in the Secret.
_RECORD_FIELDS = (
    "sandbox_id",
    "tenant",
    "image",
    "block_network",
    "cpu",
    "memory",
    "timeout",
    "workdir",
    "labels",
    "ttl_seconds",
    "idle_timeout_seconds",
    "created_at",
    "bridges",
)


def object_name(sandbox_id: str) -> str:
    """The Pod, Secret and NetworkPolicy name of a sandbox: a valid DNS label, one per id.

    Sandbox ids are ``[a-z0-9-]{1,40}``; those that do not make a DNS label as they are (a
    dash at the end) get another prefix and a hash suffix, so two ids never share a name.
    """
    if sandbox_id.endswith("-"):
        return f"orchardh-{sandbox_id.strip('-')}-{_short_hash(sandbox_id)}"
    return f"orchard-{sandbox_id}"


def label_value(value: str) -> str:
    """``value`` when Kubernetes accepts it as a label value, else a stable hash of it."""
    return value if _LABEL_VALUE.fullmatch(value) else "h-" + _short_hash(value, 20)


def _short_hash(value: str, length: int = 8) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:length]


def _labels(record: SandboxRecord, role: str, orchestrator: str) -> dict[str, str]:
    return {
        LABEL_ROLE: role,
        LABEL_NAME: object_name(record.sandbox_id),
        LABEL_SANDBOX: label_value(record.sandbox_id),
        LABEL_TENANT: label_value(record.tenant),
        LABEL_ORCHESTRATOR: label_value(orchestrator),
    }


def secret_manifest(record: SandboxRecord, orchestrator: str, token: str) -> dict[str, Any]:
    """The Secret holding the agent token, mounted into the pod as a file."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": object_name(record.sandbox_id),
            "labels": _labels(record, ROLE_TOKEN, orchestrator),
        },
        "type": "Opaque",
        "stringData": {TOKEN_KEY: token},
    }


def network_policy_manifest(record: SandboxRecord, orchestrator: str) -> dict[str, Any]:
    """Deny the sandbox pod every egress (ingress, the orchestrator's way in, is untouched)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": object_name(record.sandbox_id),
            "labels": _labels(record, ROLE_POLICY, orchestrator),
        },
        "spec": {
            "podSelector": {"matchLabels": {LABEL_NAME: object_name(record.sandbox_id)}},
            "policyTypes": ["Egress"],
            "egress": [],
        },
    }


def _resources(record: SandboxRecord) -> dict[str, Any]:
    quantities: dict[str, str] = {}
    try:
        if record.cpu:
            quantities["cpu"] = f"{max(1, round(parse_cpu(record.cpu) * 1000))}m"
        if record.memory:
            quantities["memory"] = str(memory_limit(record.memory))
    except ValueError as exc:
        raise BackendError(str(exc)) from exc
    # Requests equal to limits: the scheduler reserves what the sandbox may use.
    return {"requests": dict(quantities), "limits": dict(quantities)} if quantities else {}


def container_security_context() -> dict[str, Any]:
    """Both containers of a sandbox pod: no privileged mode, nothing gained through setuid
    or file capabilities, every capability dropped but ``SANDBOX_CAPABILITIES``."""
    return {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": list(SANDBOX_CAPABILITIES)},
    }


def record_annotation(record: SandboxRecord) -> str:
    return json.dumps({k: getattr(record, k) for k in _RECORD_FIELDS}, sort_keys=True)


def pod_manifest(record: SandboxRecord, settings: Settings, orchestrator: str) -> dict[str, Any]:
    """The sandbox's Pod. The image's entrypoint is replaced by the agent; its WORKDIR,
    ENV and USER stay in force. ``ttl_seconds`` becomes ``activeDeadlineSeconds``, so the
    kubelet ends the pod even when no orchestrator is running."""
    name = object_name(record.sandbox_id)
    resources = _resources(record)
    env = [{"name": "ORCHARD_SANDBOX_ID", "value": record.sandbox_id}]
    env += [{"name": k, "value": v} for k, v in record.env.items()]
    args = [
        "--host",
        "0.0.0.0",
        "--port",
        str(AGENT_PORT),
        "--token-file",
        f"{SECRET_MOUNT}/{TOKEN_KEY}",
        "--max-output-bytes",
        str(settings.max_output_bytes),
        "--max-upload-bytes",
        str(settings.max_upload_bytes),
    ]
    main: dict[str, Any] = {
        "name": MAIN_CONTAINER,
        "image": record.image,
        "imagePullPolicy": settings.kubernetes.image_pull_policy,
        "command": agent_entry(),
        "args": args,
        "env": env,
        "ports": [{"name": "agent", "containerPort": AGENT_PORT, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": AGENT_PORT},
            "periodSeconds": 1,
            "timeoutSeconds": 2,
            "failureThreshold": 3,
        },
        "resources": resources,
        "securityContext": container_security_context(),
        # A container that fails puts its log's tail in its status: the sandbox's error.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            {"name": "orchard-agent", "mountPath": AGENT_MOUNT, "readOnly": True},
            {"name": "orchard-token", "mountPath": SECRET_MOUNT, "readOnly": True},
        ],
    }
    if record.workdir:
        main["workingDir"] = record.workdir
    init = {
        "name": INIT_CONTAINER,
        "image": settings.agent_image,
        "imagePullPolicy": settings.kubernetes.image_pull_policy,
        # The same resources as the sandbox, so the pod's QoS class is the sandbox's.
        "resources": resources,
        "securityContext": container_security_context(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": "orchard-agent", "mountPath": _INJECTOR_TARGET}],
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 1,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "hostname": name[:63],
        "initContainers": [init],
        "containers": [main],
        "volumes": [
            {"name": "orchard-agent", "emptyDir": {}},
            {
                "name": "orchard-token",
                "secret": {"secretName": name, "defaultMode": 0o444},
            },
        ],
    }
    if record.ttl_seconds is not None:
        spec["activeDeadlineSeconds"] = max(1, math.ceil(record.ttl_seconds))
    if settings.kubernetes.runtime_class:
        spec["runtimeClassName"] = settings.kubernetes.runtime_class
    labels = _labels(record, ROLE_SANDBOX, orchestrator)
    labels[LABEL_NETWORK] = NETWORK_BLOCKED if record.block_network else NETWORK_OPEN
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {ANNOTATION_RECORD: record_annotation(record)},
        },
        "spec": spec,
    }


def owner_reference(pod: dict[str, Any]) -> dict[str, Any]:
    """Makes the pod own its Secret and policy: the garbage collector removes them with it."""
    meta = pod["metadata"]
    return {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}


def record_from_pod(pod: dict[str, Any]) -> SandboxRecord | None:
    """The record a pod carries, or None when the pod is not a readable Orchard sandbox."""
    meta = pod.get("metadata") or {}
    try:
        data = json.loads((meta.get("annotations") or {})[ANNOTATION_RECORD])
        record = SandboxRecord.from_persisted({k: data[k] for k in _RECORD_FIELDS if k in data})
    except (KeyError, ValueError, TypeError):
        return None
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == MAIN_CONTAINER:
            record.env = {
                e["name"]: e.get("value", "")
                for e in container.get("env") or []
                if e.get("name") != "ORCHARD_SANDBOX_ID"
            }
    record.backend_state = {"pod": meta.get("name")}
    return record
