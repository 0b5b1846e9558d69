"""Unit tests of orchard_env_server.backends.kubernetes.backend: the KubernetesBackend's deletions."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes_units_support import (
    DEADLINE_POD,
    DELETING,
    ORCH,
    RUNNING,
    TERMINATED,
    make_record,
    pod_state,
)

from orchard_env_server.backends.kubernetes.backend import KubernetesBackend
from orchard_env_server.backends.kubernetes.spec import pod_manifest
from orchard_env_server.backends.kubernetes.status import FORCE_DELETE_MARGIN_S
from orchard_env_server.records import SandboxRecord
from orchard_env_server.settings import Settings

pytestmark = pytest.mark.fast


# --- the backend's deletions ------------------------------------------------------------------


class DeleteApi:
    """Records the backend's delete calls; ``missing`` names answer 404."""

    def __init__(self) -> None:
        self.deletes: list[tuple[str, str, int | None, str | None]] = []
        self.missing: set[str] = set()

    async def delete(
        self, kind: str, name: str, *, grace_period_s: int | None = None, uid: str | None = None
    ) -> bool:
        self.deletes.append((kind, name, grace_period_s, uid))
        return name not in self.missing

    async def patch(self, kind: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return body


class Pods:
    def __init__(self, *pods: dict[str, Any]) -> None:
        self.objects = {p["metadata"]["name"]: p for p in pods}


class Registry:
    def __init__(self) -> None:
        self.lost_ids: list[tuple[str, str]] = []
        self.expired_ids: list[str] = []
        self.found: list[SandboxRecord] = []

    def discovered(self, record: SandboxRecord) -> None:
        self.found.append(record)

    def lost(self, sandbox_id: str, reason: str) -> None:
        self.lost_ids.append((sandbox_id, reason))

    def expired(self, sandbox_id: str) -> None:
        self.expired_ids.append(sandbox_id)


def make_backend(tmp_path: Path, *pods: dict[str, Any]) -> tuple[KubernetesBackend, DeleteApi]:
    backend = KubernetesBackend(Settings(backend="kubernetes", state_dir=tmp_path))
    api = DeleteApi()
    backend._api = api  # type: ignore[assignment]
    backend._pods = Pods(*pods)  # type: ignore[assignment]
    backend._secrets = Pods()  # type: ignore[assignment]
    return backend, api


def pod_deletes(api: DeleteApi) -> list[tuple[str, int | None, str | None]]:
    return [(name, grace, uid) for kind, name, grace, uid in api.deletes if kind == "pods"]


@pytest.mark.parametrize(
    ("pod", "forced"),
    [
        (DEADLINE_POD, True),
        (pod_state("Failed", TERMINATED), True),
        (pod_state("Running", RUNNING), False),
    ],
)
def test_deleting_an_ended_pod_forces_it_with_its_uid(tmp_path, pod, forced):
    backend, api = make_backend(tmp_path, pod)
    assert asyncio.run(backend._delete_objects("orchard-sb")) is True
    expected = [("orchard-sb", 0, "u-1")] if forced else [("orchard-sb", None, None)]
    assert pod_deletes(api) == expected
    kinds = [kind for kind, *_ in api.deletes]
    assert kinds == ["pods", "secrets", "networkpolicies"]


def test_a_pod_forced_on_delete_is_not_forced_again_when_seen_deleting(tmp_path):
    async def main() -> list[tuple[str, int | None, str | None]]:
        backend, api = make_backend(tmp_path, DEADLINE_POD)
        await backend._delete_objects("orchard-sb")
        deleting = json.loads(json.dumps(DEADLINE_POD))
        deleting["metadata"].update(DELETING)
        backend._on_pod(deleting)
        await asyncio.sleep(0)
        backend._pods.objects.clear()  # then gone: what was kept about it goes
        await backend._maintain_once()
        assert backend._states == {}  # nothing kept once the pod is gone
        return pod_deletes(api)

    assert asyncio.run(main()) == [("orchard-sb", 0, "u-1")]


def test_a_forced_delete_that_misses_the_watched_pod_deletes_gently(tmp_path):
    backend, api = make_backend(tmp_path, DEADLINE_POD)
    api.missing.add("orchard-sb")  # gone already, or another uid
    asyncio.run(backend._delete_objects("orchard-sb"))
    assert pod_deletes(api) == [("orchard-sb", 0, "u-1"), ("orchard-sb", None, None)]


def test_an_unwatched_pod_is_deleted_gently(tmp_path):
    backend, api = make_backend(tmp_path)
    asyncio.run(backend._delete_objects("orchard-sb"))
    assert pod_deletes(api) == [("orchard-sb", None, None)]


def test_a_pod_stuck_terminating_is_force_deleted_once_overdue(tmp_path):
    pod = pod_state("Running", RUNNING, **DELETING)

    async def main() -> list[tuple[str, int | None, str | None]]:
        backend, api = make_backend(tmp_path, pod)
        backend._on_pod(pod)  # first seen being deleted: the kubelet's turn
        await asyncio.sleep(0)
        assert pod_deletes(api) == []
        await backend._maintain_once()
        assert pod_deletes(api) == []
        state = backend._states["orchard-sb"]
        assert state.deleting_since is not None
        state.deleting_since -= FORCE_DELETE_MARGIN_S + 2  # time passes
        await backend._maintain_once()
        await asyncio.sleep(0)
        await backend._maintain_once()  # no second force for the same pod
        await asyncio.sleep(0)
        backend._on_pod_gone(pod)
        assert "orchard-sb" not in backend._states
        return pod_deletes(api)

    assert asyncio.run(main()) == [("orchard-sb", 0, "u-1")]


def test_a_deadline_pod_being_deleted_is_forced_at_once(tmp_path):
    pod = json.loads(json.dumps(DEADLINE_POD))
    pod["metadata"].update(DELETING)

    async def main() -> list[tuple[str, int | None, str | None]]:
        backend, api = make_backend(tmp_path, pod)
        backend._on_pod(pod)
        backend._on_pod(pod)  # a second event: still one force delete
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return pod_deletes(api)

    assert asyncio.run(main()) == [("orchard-sb", 0, "u-1")]


@pytest.mark.parametrize(
    ("age_s", "ttl_reached"),
    [(10.0, True), (4.0, True), (-100.0, False)],  # the last: a node clock far ahead
)
def test_a_pod_ended_at_its_deadline_is_force_deleted_and_terminated_by_its_ttl(
    tmp_path, age_s, ttl_reached
):
    """Not a failure: the pod goes at once, and once it is gone the sandbox is reaped for
    its ttl (``expired``: terminated, then forgotten), or, if the orchestrator's clock
    says the ttl is far off, reported ``lost`` to the pod's deadline."""
    record = make_record(ttl_seconds=5)
    record.created_at = time.time() - age_s
    pod = pod_manifest(record, Settings(backend="kubernetes"), ORCH)
    pod["metadata"]["uid"] = "u-9"
    pod["status"] = DEADLINE_POD["status"]
    name = pod["metadata"]["name"]

    async def main() -> tuple[Registry, DeleteApi, KubernetesBackend]:
        backend, api = make_backend(tmp_path, pod)
        registry = Registry()
        backend.attach(registry)
        backend._on_pod(pod)  # found (as after a restart), already ended by the kubelet
        backend._on_pod(pod)  # acted upon once
        for _ in range(5):
            await asyncio.sleep(0)
        assert registry.lost_ids == []  # no failure, no "deleted out of band"
        assert all(state.dead is None for state in backend._states.values())
        backend._on_pod_gone(pod)
        return registry, api, backend

    registry, api, backend = asyncio.run(main())
    assert [r.sandbox_id for r in registry.found] == [record.sandbox_id]
    assert pod_deletes(api) == [(name, 0, "u-9")]  # deleted by force, once
    if ttl_reached:
        assert (registry.expired_ids, registry.lost_ids) == ([record.sandbox_id], [])
    else:
        [(sandbox_id, why)] = registry.lost_ids
        assert sandbox_id == record.sandbox_id and "deadline" in why, why
        assert registry.expired_ids == []
    assert backend._states == {}
