"""Unit tests of orchard_env_server.backends.kubernetes.watch: the ResourceWatcher."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from orchard_env_server.backends.kubernetes.api import KubeError
from orchard_env_server.backends.kubernetes.watch import ResourceWatcher

pytestmark = pytest.mark.fast


# --- ResourceWatcher ----------------------------------------------------------------------


def obj(name: str, rv: str, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}, **extra}


def event(kind: str, name: str, rv: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "object": obj(name, rv, **extra)}


class FakeApi:
    """Scripted answers to list_objects and watch; when the script ends, watches hang."""

    def __init__(
        self,
        lists: list[tuple[list[dict[str, Any]], str]],
        watches: list[list[dict[str, Any] | BaseException]],
    ) -> None:
        self._lists = list(lists)
        self._watches = list(watches)
        self.list_calls: list[tuple[str, str]] = []
        self.watch_calls: list[tuple[str, str, str, int]] = []
        self.exhausted = asyncio.Event()

    async def list_objects(self, kind: str, selector: str) -> tuple[list[dict[str, Any]], str]:
        self.list_calls.append((kind, selector))
        if not self._lists:
            raise AssertionError("unexpected LIST")
        items, rv = self._lists.pop(0)
        return [json.loads(json.dumps(i)) for i in items], rv

    async def watch(self, kind: str, selector: str, resource_version: str, timeout_s: int):
        self.watch_calls.append((kind, selector, resource_version, timeout_s))
        if not self._watches:
            self.exhausted.set()
            await asyncio.Event().wait()  # hang until cancelled
        for item in self._watches.pop(0):
            await asyncio.sleep(0)
            if isinstance(item, BaseException):
                raise item
            yield item

    @property
    def watched_versions(self) -> list[str]:
        return [call[2] for call in self.watch_calls]


class Recorder:
    def __init__(self) -> None:
        self.log: list[tuple[str, str, str]] = []

    def upsert(self, o: dict[str, Any]) -> None:
        self.log.append(("upsert", o["metadata"]["name"], o["metadata"]["resourceVersion"]))

    def delete(self, o: dict[str, Any]) -> None:
        self.log.append(("delete", o["metadata"]["name"], o["metadata"]["resourceVersion"]))


def run_watcher(api: FakeApi, timeout_s: float = 5.0) -> tuple[ResourceWatcher, Recorder]:
    """Run a watcher until the fake's script is used up, then cancel it."""
    recorder = Recorder()

    async def main() -> ResourceWatcher:
        watcher = ResourceWatcher(
            api,  # type: ignore[arg-type]
            "pods",
            "orchard.dev/role=sandbox",
            recorder.upsert,
            recorder.delete,
            watch_timeout_s=100,
        )
        task = asyncio.create_task(watcher.run_forever())
        try:
            done, _ = await asyncio.wait(
                [task, asyncio.create_task(api.exhausted.wait())],
                timeout=timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if task in done:
                task.result()  # re-raise what ended the watcher
                raise AssertionError("the watcher returned")
            assert api.exhausted.is_set(), "the watcher did not use up its script in time"
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        return watcher

    return asyncio.run(main()), recorder


def test_initial_list_reports_every_object_and_syncs():
    api = FakeApi(lists=[([obj("a", "5"), obj("b", "6")], "10")], watches=[])
    watcher, rec = run_watcher(api)
    assert watcher.synced.is_set()
    assert set(watcher.objects) == {"a", "b"}
    assert sorted(rec.log) == [("upsert", "a", "5"), ("upsert", "b", "6")]
    assert api.list_calls == [("pods", "orchard.dev/role=sandbox")]
    assert api.watched_versions == ["10"]
    kind, selector, _, timeout = api.watch_calls[0]
    assert (kind, selector) == ("pods", "orchard.dev/role=sandbox")
    assert 80 <= timeout <= 120  # the jittered server-side timeout
    assert watcher.stats()["lists"] == 1 and watcher.stats()["objects"] == 2


def test_events_update_objects_and_call_handlers():
    api = FakeApi(
        lists=[([obj("a", "5")], "10")],
        watches=[
            [
                event("ADDED", "b", "11"),
                event("MODIFIED", "a", "12", status={"phase": "Running"}),
                event("DELETED", "b", "13"),
                event("ADDED", "c", "14"),
            ]
        ],
    )
    watcher, rec = run_watcher(api)
    assert rec.log == [
        ("upsert", "a", "5"),
        ("upsert", "b", "11"),
        ("upsert", "a", "12"),
        ("delete", "b", "13"),
        ("upsert", "c", "14"),
    ]
    assert set(watcher.objects) == {"a", "c"}
    assert watcher.objects["a"]["status"] == {"phase": "Running"}
    # The server ended the watch; it was re-opened from the last version seen.
    assert api.watched_versions == ["10", "14"]
    assert watcher.reconnects == 1
    assert watcher.lists == 1 and watcher.gone == 0


def test_deleting_an_unknown_object_is_harmless():
    api = FakeApi(lists=[([], "1")], watches=[[event("DELETED", "ghost", "2")]])
    watcher, rec = run_watcher(api)
    assert watcher.objects == {}
    assert rec.log == [("delete", "ghost", "2")]
    assert api.watched_versions == ["1", "2"]


def test_bookmark_only_advances_the_version():
    api = FakeApi(
        lists=[([obj("a", "5")], "10")],
        watches=[[{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "50"}}}]],
    )
    watcher, rec = run_watcher(api)
    assert rec.log == [("upsert", "a", "5")]
    assert set(watcher.objects) == {"a"}
    assert api.watched_versions == ["10", "50"]


@pytest.mark.parametrize(
    "gone",
    [
        {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}},
        KubeError(410, "410 Gone: too old resource version"),
    ],
    ids=["error-event", "kube-error"],
)
def test_gone_relists_and_reports_what_vanished(gone):
    api = FakeApi(
        lists=[
            ([obj("a", "5"), obj("b", "6")], "10"),
            ([obj("b", "30"), obj("c", "31")], "40"),  # a vanished meanwhile, c appeared
        ],
        watches=[[event("MODIFIED", "a", "11"), gone]],
    )
    watcher, rec = run_watcher(api)
    assert watcher.gone == 1
    assert watcher.lists == 2
    assert len(api.list_calls) == 2
    assert set(watcher.objects) == {"b", "c"}
    assert watcher.objects["b"]["metadata"]["resourceVersion"] == "30"
    after_relist = rec.log[3:]
    assert ("delete", "a", "11") in after_relist  # the last known copy of a
    assert ("upsert", "b", "30") in after_relist
    assert ("upsert", "c", "31") in after_relist
    assert [e for e in after_relist if e[0] == "delete"] == [("delete", "a", "11")]
    # The new watch starts from the new list's version, not the stale one.
    assert api.watched_versions == ["10", "40"]
    assert watcher.error is None


def test_other_errors_are_retried_from_the_same_version():
    api = FakeApi(
        lists=[([obj("a", "5")], "10")],
        watches=[[KubeError(0, "the API server is unreachable: refused")], []],
    )
    watcher, _ = run_watcher(api)
    assert watcher.gone == 0 and watcher.lists == 1
    assert api.watched_versions == ["10", "10", "10"]
    assert watcher.reconnects >= 2


def test_error_event_with_another_code_is_retried():
    api = FakeApi(
        lists=[([], "10")],
        watches=[[{"type": "ERROR", "object": {"code": 500, "message": "internal"}}]],
    )
    watcher, _ = run_watcher(api)
    assert watcher.gone == 0 and watcher.lists == 1
    assert api.watched_versions == ["10", "10"]
    assert watcher.error is not None and "internal" in watcher.error


def test_watch_resumes_after_a_dropped_connection_from_the_last_version_seen():
    api = FakeApi(
        lists=[([], "10")],
        watches=[[event("ADDED", "a", "11"), KubeError(0, "connection reset")]],
    )
    run_watcher(api)
    assert api.watched_versions == ["10", "11"]
