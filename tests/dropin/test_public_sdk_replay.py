"""The public Orchard Env SDK's examples, as recorded, against our server on every backend.

The SDK is not on PyPI, so CI cannot install it: ``scripts/record-public-sdk`` recorded the
exact HTTP and WebSocket exchanges its ``examples/getting_started.py`` and its concurrency
benchmarks make (``public_sdk_exchanges.json``), and this test plays them back. The images
the examples name are the stand-ins of ``infra/images/build``: in the Docker engine for the
Docker and Kubernetes backends, imported from their ``docker save`` archives into the server's
image store for the local backend.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dropin.replay import Replay

from orchard_testing import TEST_IMAGE_STORE, RunningServer, docker

HERE = Path(__file__).resolve().parent
RECORDING = json.loads((HERE / "public_sdk_exchanges.json").read_text())
SCENARIOS = {s["name"]: s for s in RECORDING["scenarios"]}
API_KEY = "dropin-replay-key"
ARCHIVES = Path("/var/tmp/orchard-images")
STAND_INS = {"python:3.11-slim": "python-3.11-slim.tar", "ubuntu:22.04": "ubuntu-22.04.tar"}
HINT = "run `infra/images/build --only python --only ubuntu` (the stand-ins the examples name)"


def _exchanges(name: str) -> list[dict[str, Any]]:
    return SCENARIOS[name]["exchanges"]


def _http(name: str, endpoint: str) -> list[dict[str, Any]]:
    return [e for e in _exchanges(name) if e["kind"] == "http" and e["endpoint"] == endpoint]


@pytest.mark.fast
def test_the_recording_holds_every_example_and_what_it_showed():
    examples = "basic files env patch resources errors session pty async concurrent pty-async"
    expected = {f"getting_started {e}" for e in examples.split()}
    assert set(SCENARIOS) == expected | {"bench_concurrent", "bench_concurrent_pty"}
    assert all(s["exit_code"] == 0 for s in SCENARIOS.values())
    hello = _http("getting_started basic", "exec")[0]["response"]["expect"]
    assert hello == {"status": "succeeded", "exit_code": 0, "stdout": "Hello from sandbox!\n"}
    errors = [e["response"]["expect"] for e in _http("getting_started errors", "exec")]
    assert [(e["status"], e["exit_code"]) for e in errors] == [
        ("failed", 1),
        ("failed", 2),
        ("failed", None),
    ]  # the last: timed out
    terminals = [e for e in _exchanges("getting_started pty") if e["kind"] == "ws"]
    first = terminals[0]["expect"]
    assert first["exit_code"] == 7 and "HAS_TTY" in first["stdout"]
    assert [t["expect"].get("exit_code") for t in terminals] == [7, -15, -9, 0]
    assert "50 200" in terminals[3]["expect"]["stdout"]
    sync_auth = {t["request"]["auth"] for t in terminals}
    assert sync_auth == {"query"}  # the sync client sends its key as ?api_key= only
    assert _http("getting_started patch", "apply_patch")[0]["response"]["expect"]["success"]


def _require_stand_ins(backend: str) -> None:
    """The examples' images where the backend runs images from; the local backend's come
    from the stand-ins' archives, imported into the test servers' shared store once."""
    if backend == "local":
        from orchard_env_server.images import ImageStore

        store = ImageStore(TEST_IMAGE_STORE)
        for ref, archive in STAND_INS.items():
            if store.resolve(ref) is None:
                path = ARCHIVES / archive
                assert path.is_file(), f"{path} is missing: {HINT}"
                store.import_archive(path)
        return
    for ref in STAND_INS:
        try:
            docker("image", "inspect", "--format", "{{.Id}}", ref)
        except RuntimeError as exc:
            raise AssertionError(f"the Docker engine has no {ref}: {HINT}") from exc


@pytest.fixture(scope="module")
def sdk_server(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server with an API key (the SDK sends one) and the examples' images."""
    state_dir = tmp_path_factory.mktemp("dropin") / "state"
    _require_stand_ins(backend)
    server = RunningServer(backend=backend, state_dir=state_dir, api_keys=API_KEY)
    server.start()
    yield server
    server.stop()


@pytest.mark.integration
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_the_public_sdks_exchanges_replay(sdk_server: RunningServer, scenario: str):
    replay = Replay(sdk_server.url, API_KEY, SCENARIOS[scenario])
    found = replay.run()
    assert not found, "\n".join(found)
    if scenario == "getting_started pty":
        assert "HAS_TTY" in replay.terminal_output[0]
