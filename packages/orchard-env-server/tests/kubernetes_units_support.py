"""Helpers shared by the Kubernetes backend's unit tests (test_kubernetes_*.py): not a test file.

A sandbox record to build manifests from, and hand-written pod statuses (``pod_state``,
``DEADLINE_POD``) for the status and the backend's deletion tests.
"""

from __future__ import annotations

from typing import Any

from orchard_env_server.backends.kubernetes.spec import INIT_CONTAINER, MAIN_CONTAINER
from orchard_env_server.records import SandboxRecord

ORCH = "orch-1"


def make_record(**overrides: Any) -> SandboxRecord:
    values: dict[str, Any] = {
        "sandbox_id": "sb-1234abcd",
        "tenant": "acme",
        "image": "python:3.12-slim",
    }
    values.update(overrides)
    return SandboxRecord(**values)


def pod_with(status: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "orchard-sb", "uid": "u-1", **meta}, "status": status}


RUNNING = {"running": {"startedAt": "2024-01-01T00:00:00Z"}}
TERMINATED = {"terminated": {"exitCode": 137, "reason": "Error"}}
DELETING = {"deletionTimestamp": "2024-01-01T00:00:01Z", "deletionGracePeriodSeconds": 1}


def pod_state(
    phase: str, main: dict[str, Any] | None = None, reason: str | None = None, **meta: Any
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if reason:
        status["reason"] = reason
    if main is not None:
        status["initContainerStatuses"] = [
            {"name": INIT_CONTAINER, "state": {"terminated": {"exitCode": 0}}}
        ]
        status["containerStatuses"] = [{"name": MAIN_CONTAINER, "state": main}]
    pod = pod_with(status, **meta)
    pod["spec"] = {"terminationGracePeriodSeconds": 1}
    return pod


# kubernetes/kubernetes#88613: failed at its deadline, yet the container "still runs".
DEADLINE_POD = pod_state("Failed", RUNNING, "DeadlineExceeded")
