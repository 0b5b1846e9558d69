"""What a pod's status means for its sandbox: ready, still coming, or never going to be;
and when deleting it must skip the grace period (a force delete)."""

from __future__ import annotations

from typing import Any

import attrs

from .spec import INIT_CONTAINER, MAIN_CONTAINER

DEADLINE_EXCEEDED = "DeadlineExceeded"  # status.reason of a pod past activeDeadlineSeconds
# How long past its grace period a deleted pod may still be there before it is
# force-deleted: the kubelet normally confirms within a few seconds, even under load.
FORCE_DELETE_MARGIN_S = 15.0
_DEFAULT_GRACE_S = 30  # the API's default terminationGracePeriodSeconds

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
    expired: bool = False  # the kubelet ended it at activeDeadlineSeconds, i.e. its ttl


def view_pod(pod: dict[str, Any]) -> PodView:
    """Read a pod (a raw API object) into the facts the backend acts on."""
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
        expired=status.get("reason") == DEADLINE_EXCEEDED,
    )


def _containers(
    status: dict[str, Any], keys: tuple[str, ...] = ("initContainerStatuses", "containerStatuses")
) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for key in keys:
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


def force_delete_reason(
    pod: dict[str, Any],
    *,
    deleting_for_s: float | None = None,
    margin_s: float = FORCE_DELETE_MARGIN_S,
) -> str | None:
    """Why deleting ``pod`` should skip its grace period (``gracePeriodSeconds: 0``), or
    None when a graceful delete will do.

    ``deleting_for_s`` is None when about to delete the pod; for a pod already being
    deleted it is how long it has been seen so. A graceful delete waits for the kubelet to
    confirm that the containers stopped; for a pod the kubelet has already ended, 1.20's
    kubelet may never confirm (kubernetes/kubernetes#88613: a pod failed by
    activeDeadlineSeconds keeps saying its container runs, and sits ``Terminating``
    forever). Force-deleted are thus:

    - before deleting: a pod that has ended (phase Failed or Succeeded, reason
      DeadlineExceeded, or every app container terminated): nothing is left to stop;
    - while deleting: a pod in that contradictory state (DeadlineExceeded, or ended while
      a container still says running), at once; any pod still there ``margin_s`` past its
      grace period. An ordinary graceful deletion, which passes through "ended" on its
      way out, is left to the kubelet.
    """
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    phase, reason = status.get("phase"), status.get("reason")
    states = [state for name, state in _containers(status, ("containerStatuses",))]
    running = any("running" in state for state in states)
    if reason == DEADLINE_EXCEEDED:
        return f"the kubelet ended it at its deadline ({DEADLINE_EXCEEDED})"
    if phase in ("Failed", "Succeeded") and (deleting_for_s is None or running):
        return f"it has ended (phase {phase})"
    if deleting_for_s is None:
        if states and all("terminated" in state for state in states):
            return "its containers have exited"
        return None
    if not meta.get("deletionTimestamp"):
        return None
    grace = meta.get("deletionGracePeriodSeconds")
    if grace is None:
        grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", _DEFAULT_GRACE_S)
    if deleting_for_s > float(grace) + margin_s:
        return f"still there {deleting_for_s:.0f} s after a delete with {grace} s of grace"
    return None
