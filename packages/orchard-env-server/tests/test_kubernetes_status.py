"""Unit tests of orchard_env_server.backends.kubernetes.status: pod views and force deletes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes_units_support import (
    DEADLINE_POD,
    DELETING,
    RUNNING,
    TERMINATED,
    pod_state,
    pod_with,
)

from orchard_env_server.backends.kubernetes.spec import INIT_CONTAINER, MAIN_CONTAINER
from orchard_env_server.backends.kubernetes.status import (
    FORCE_DELETE_MARGIN_S,
    force_delete_reason,
    view_pod,
)

pytestmark = pytest.mark.fast


# --- view_pod -----------------------------------------------------------------------------


def waiting_on(name: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"name": name, "state": {"waiting": {"reason": reason, "message": message}}}


def test_ready_pod():
    view = view_pod(
        pod_with(
            {
                "phase": "Running",
                "podIP": "10.1.2.3",
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Ready", "status": "True"},
                ],
                "containerStatuses": [{"name": MAIN_CONTAINER, "state": {"running": {}}}],
            }
        )
    )
    assert view.ready is True
    assert view.ip == "10.1.2.3"
    assert (view.name, view.uid) == ("orchard-sb", "u-1")
    assert view.failure is None and view.waiting is None
    assert view.deleting is False


def test_running_but_not_ready_pod_is_waiting():
    view = view_pod(
        pod_with(
            {
                "phase": "Running",
                "podIP": "10.1.2.3",
                "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": [{"name": MAIN_CONTAINER, "state": {"running": {}}}],
            }
        )
    )
    assert view.ready is False
    assert view.failure is None
    assert view.waiting == "Running"


def test_empty_pod_status():
    view = view_pod({})
    assert view.ready is False and view.ip is None and view.failure is None
    assert view.deleting is False


@pytest.mark.parametrize("reason", ["ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff"])
@pytest.mark.parametrize(
    ("container", "key", "who"),
    [
        (MAIN_CONTAINER, "containerStatuses", "sandbox container"),
        (INIT_CONTAINER, "initContainerStatuses", "agent injector"),
    ],
)
def test_image_trouble_is_a_failure(reason, container, key, who):
    message = f'image "nope:1" for {container}'
    status = {
        "phase": "Pending",
        "conditions": [{"type": "Ready", "status": "False"}],
        key: [waiting_on(container, reason, message)],
    }
    view = view_pod(pod_with(status))
    assert view.ready is False
    assert view.failure is not None
    assert reason in view.failure
    assert who in view.failure
    assert message in view.failure
    assert reason in (view.waiting or "")


def test_failure_without_a_message_has_no_dangling_colon():
    status = {"phase": "Pending", "containerStatuses": [waiting_on(MAIN_CONTAINER, "ErrImagePull")]}
    failure = view_pod(pod_with(status)).failure
    assert failure is not None and failure.endswith(")")


def test_ordinary_waiting_is_not_a_failure():
    status = {
        "phase": "Pending",
        "initContainerStatuses": [waiting_on(INIT_CONTAINER, "PodInitializing")],
        "containerStatuses": [waiting_on(MAIN_CONTAINER, "ContainerCreating")],
    }
    view = view_pod(pod_with(status))
    assert view.failure is None
    assert view.waiting is not None and "PodInitializing" in view.waiting


def test_deadline_exceeded():
    status = {
        "phase": "Failed",
        "reason": "DeadlineExceeded",
        "message": "Pod was active on the node longer than the specified deadline",
    }
    view = view_pod(pod_with(status))
    assert view.failure is not None
    assert "Failed" in view.failure
    assert "DeadlineExceeded" in view.failure
    assert "deadline" in view.failure


def test_oom_killed_sandbox_container():
    status = {
        "phase": "Failed",
        "initContainerStatuses": [
            {
                "name": INIT_CONTAINER,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
            }
        ],
        "containerStatuses": [
            {
                "name": MAIN_CONTAINER,
                "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
            }
        ],
    }
    failure = view_pod(pod_with(status)).failure
    assert failure is not None
    assert "OOM" in failure
    assert "137" in failure
    assert INIT_CONTAINER not in failure  # its clean exit is not news


def test_failed_init_container_is_reported():
    status = {
        "phase": "Failed",
        "initContainerStatuses": [
            {
                "name": INIT_CONTAINER,
                "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "no space"}},
            }
        ],
    }
    failure = view_pod(pod_with(status)).failure
    assert failure is not None
    assert INIT_CONTAINER in failure and "no space" in failure


def test_unschedulable_pod_is_waiting_not_failed():
    message = "0/3 nodes are available: 3 Insufficient memory."
    status = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
            }
        ],
    }
    view = view_pod(pod_with(status))
    assert view.failure is None
    assert view.ready is False
    assert view.waiting is not None
    assert "not scheduled" in view.waiting
    assert message in view.waiting


def test_deleting_pod():
    view = view_pod(pod_with({"phase": "Running"}, deletionTimestamp="2024-01-01T00:00:00Z"))
    assert view.deleting is True


# --- force_delete_reason --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        (pod_state("Running", RUNNING), None),
        (pod_state("Pending"), None),
        (pod_state("Pending", {"waiting": {"reason": "ContainerCreating"}}), None),
        (DEADLINE_POD, "DeadlineExceeded"),
        (pod_state("Running", RUNNING, "DeadlineExceeded"), "DeadlineExceeded"),
        (pod_state("Failed", TERMINATED), "phase Failed"),
        (pod_state("Succeeded", {"terminated": {"exitCode": 0}}), "phase Succeeded"),
        (pod_state("Failed", None, "Evicted"), "phase Failed"),
        (pod_state("Running", TERMINATED), "exited"),  # the phase lags behind
    ],
)
def test_what_to_force_delete_before_deleting(pod, why):
    reason = force_delete_reason(pod)
    assert (reason is None) if why is None else (why in (reason or ""))


def test_a_pod_stuck_by_its_deadline_is_forced_at_once_while_deleting():
    pod = json.loads(json.dumps(DEADLINE_POD))
    pod["metadata"].update(DELETING)
    assert "DeadlineExceeded" in (force_delete_reason(pod, deleting_for_s=0.0) or "")
    ended = pod_state("Failed", RUNNING, **DELETING)  # ended, yet a container "runs"
    assert force_delete_reason(ended, deleting_for_s=0.0) is not None


@pytest.mark.parametrize(
    "pod",
    [
        pod_state("Running", RUNNING, **DELETING),
        pod_state("Running", TERMINATED, **DELETING),
        pod_state("Failed", TERMINATED, **DELETING),  # the way out of a graceful delete
        pod_state("Succeeded", {"terminated": {"exitCode": 0}}, **DELETING),
    ],
)
def test_an_ordinary_graceful_deletion_is_left_to_the_kubelet_until_overdue(pod):
    grace = pod["metadata"]["deletionGracePeriodSeconds"]
    assert force_delete_reason(pod, deleting_for_s=0.0) is None
    assert force_delete_reason(pod, deleting_for_s=grace + FORCE_DELETE_MARGIN_S - 0.1) is None
    why = force_delete_reason(pod, deleting_for_s=grace + FORCE_DELETE_MARGIN_S + 0.1)
    assert why is not None and "still there" in why


def test_overdue_counts_the_deletion_grace_then_the_spec_then_the_default():
    pod = pod_state("Running", RUNNING, deletionTimestamp="t", deletionGracePeriodSeconds=60)
    assert force_delete_reason(pod, deleting_for_s=40, margin_s=10) is None
    assert force_delete_reason(pod, deleting_for_s=71, margin_s=10) is not None
    pod = pod_state("Running", RUNNING, deletionTimestamp="t")
    assert force_delete_reason(pod, deleting_for_s=12, margin_s=10) is not None  # spec: 1 s
    del pod["spec"]
    assert force_delete_reason(pod, deleting_for_s=39, margin_s=10) is None  # default 30 s
    assert force_delete_reason(pod, deleting_for_s=41, margin_s=10) is not None


def test_a_pod_not_being_deleted_is_never_overdue():
    pod = pod_state("Running", RUNNING)
    assert force_delete_reason(pod, deleting_for_s=10_000.0) is None


@given(
    phase=st.sampled_from(["Pending", "Running", "Failed", "Succeeded", "Unknown"]),
    main=st.sampled_from([None, RUNNING, TERMINATED, {"waiting": {"reason": "x"}}]),
    reason=st.sampled_from([None, "DeadlineExceeded", "Evicted"]),
    grace=st.integers(0, 120),
    t1=st.floats(0, 1000),
    t2=st.floats(0, 1000),
)
def test_once_due_a_force_delete_stays_due(phase, main, reason, grace, t1, t2):
    pod = pod_state(phase, main, reason, deletionTimestamp="t", deletionGracePeriodSeconds=grace)
    early, late = sorted((t1, t2))
    if force_delete_reason(pod, deleting_for_s=early) is not None:
        assert force_delete_reason(pod, deleting_for_s=late) is not None
    if force_delete_reason(pod, deleting_for_s=early) is not None:
        # Whatever is due while deleting was due before deleting, or is overdue by now.
        assert force_delete_reason(pod) is not None or early > grace + FORCE_DELETE_MARGIN_S
