"""What a pod's status means for its sandbox: ready, still coming, or never going to be."""

from __future__ import annotations

from typing import Any

import attrs

from .kubernetes_spec import INIT_CONTAINER, MAIN_CONTAINER

# Waiting reasons after which the kubelet will not start the container by itself. An image
# pull that failed is final too: waiting out the sandbox timeout for a retry helps nobody.
_HOPELESS_WAITING = {
    "ErrImageNeverPull": "the image is not on the node and the pull policy forbids pulling it",
    "ErrImagePull": "the kubelet could not pull the image",
    "ImagePullBackOff": "the kubelet could not pull the image",
    "InvalidImageName": "the image name is invalid",
    "CreateContainerConfigError": "the container's configuration is invalid",
    "CreateContainerError": "the container could not be created",
    "RunContainerError": "the container could not be started",
    "CrashLoopBackOff": "the container keeps crashing",
}


@attrs.frozen
class PodView:
    """The parts of a pod's status the backend acts on."""

    name: str
    uid: str
    ip: str | None
    ready: bool
    deleting: bool
    failure: str | None  # why the sandbox will never serve; None while it may
    waiting: str | None  # why it is not ready yet, for messages


def view_pod(pod: dict[str, Any]) -> PodView:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready = (conditions.get("Ready") or {}).get("status") == "True"
    return PodView(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        ip=status.get("podIP") or None,
        ready=ready,
        deleting=bool(meta.get("deletionTimestamp")),
        failure=None if ready else _failure(status),
        waiting=None if ready else _waiting(status, conditions),
    )


def _containers(status: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for key in ("initContainerStatuses", "containerStatuses"):
        for c in status.get(key) or []:
            found.append((str(c.get("name")), c.get("state") or {}))
    return found


def _failure(status: dict[str, Any]) -> str | None:
    for name, state in _containers(status):
        waiting = state.get("waiting") or {}
        reason = waiting.get("reason")
        if reason in _HOPELESS_WAITING:
            what = "the agent injector" if name == INIT_CONTAINER else "the sandbox container"
            message = waiting.get("message") or ""
            return f"{_HOPELESS_WAITING[reason]} ({reason}, {what}): {message}".rstrip(": ")
    phase = status.get("phase")
    if phase not in ("Failed", "Succeeded"):
        return None
    why = f"the sandbox's pod ended ({phase}"
    if status.get("reason"):
        why += f", {status['reason']}"
    why += ")"
    if status.get("message"):
        why += f": {status['message']}"
    for name, state in _containers(status):
        ended = state.get("terminated")
        if ended and (name == MAIN_CONTAINER or ended.get("exitCode")):
            why += f"; container {name} exited with code {ended.get('exitCode')}"
            if ended.get("reason") == "OOMKilled":
                why += " (killed by the kernel OOM killer: memory limit reached)"
            elif ended.get("reason"):
                why += f" ({ended['reason']})"
            if ended.get("message"):
                why += f": {str(ended['message'])[-400:]}"
    return why


def _waiting(status: dict[str, Any], conditions: dict[Any, dict[str, Any]]) -> str | None:
    scheduled = conditions.get("PodScheduled") or {}
    if scheduled.get("status") == "False":
        return f"not scheduled: {scheduled.get('message') or scheduled.get('reason')}"
    for name, state in _containers(status):
        waiting = state.get("waiting")
        if waiting and waiting.get("reason"):
            return f"{name}: {waiting['reason']} {waiting.get('message') or ''}".strip()
    return status.get("phase")
