"""Each foreign harness, for real, in a network-less sandbox of the harness image: it runs
non-interactively from the adapter's invocation against a scripted model served inside the
same sandbox on 127.0.0.1 (``foreign_stub_model.py``), runs the shell tool call the model
asks for, and the adapter's parser reads its final answer.

Docker runs ``orchard-test/harnesses``; the local backend runs the same tree as a rootfs
directory. Both are made by ``infra/images/build`` (``--only harnesses``); a missing one
fails here, loudly.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard_claw.foreign import HARNESS_IMAGE, HARNESS_ROOTFS, HARNESSES, HarnessRun
from orchard_claw.foreign.base import DUMMY_API_KEY
from orchard_env_client import SandboxClient
from orchard_testing import RunningServer, require_backend, selected_backends

pytestmark = pytest.mark.integration

STUB = Path(__file__).parent / "foreign_stub_model.py"
STUB_PORT = 4000
RUN_PATH = "/r/run-1/v1"
COMMAND = "echo hello > /workspace/out.txt"
FINAL = "STUB-FINAL: wrote /workspace/out.txt"
TASK = 'Write the word "hello" into /workspace/out.txt,\nthen say that you are done.'

BUILD_HINT = "build it with `infra/images/build --only harnesses` (as root)"
BACKENDS = [b for b in selected_backends() if b in ("local", "docker")]
# What each harness must ask for (the facts a scripted model relies on).
ENDPOINT = {"openclaw": "chat/completions", "codex": "responses", "opencode": "chat/completions"}


def require_harness_image(backend: str) -> str:
    """The image for ``backend``; a RuntimeError naming the build script when it is missing."""
    if backend == "local":
        if not Path(HARNESS_ROOTFS, "opt/harnesses/bin/node").is_file():
            raise RuntimeError(f"the harness rootfs {HARNESS_ROOTFS} is missing; {BUILD_HINT}")
        return HARNESS_ROOTFS
    done = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", HARNESS_IMAGE],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{HARNESS_IMAGE} is missing ({done.stderr.strip()}); {BUILD_HINT}")
    return HARNESS_IMAGE


@pytest.fixture(scope="module", params=BACKENDS)
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[SandboxClient, str]]:
    backend = str(request.param)
    require_backend(backend)
    image = require_harness_image(backend)
    srv = RunningServer(backend=backend, state_dir=tmp_path_factory.mktemp("claw") / "s")
    srv.start()
    try:
        with SandboxClient(base_url=srv.url) as client:
            yield client, image
    finally:
        srv.stop()


def strings(obj: object) -> Iterator[str]:
    """Every string in a JSON value."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from strings(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from strings(value)


def start_stub(sandbox) -> None:
    sandbox.upload_content("/tmp/stub/stub_model.py", STUB.read_bytes())
    args = [
        "python3",
        "/tmp/stub/stub_model.py",
        str(STUB_PORT),
        "/tmp/stub/requests.jsonl",
        COMMAND,
    ]
    sandbox.start("exec " + shlex.join(args), timeout=3600)
    wait = (
        "import time, urllib.request\n"
        "for _ in range(300):\n"
        "    try:\n"
        f"        urllib.request.urlopen('http://127.0.0.1:{STUB_PORT}/v1/models', timeout=1)\n"
        "        break\n"
        "    except OSError:\n"
        "        time.sleep(0.1)\n"
        "else:\n"
        "    raise SystemExit('the stub model did not start')\n"
    )
    job = sandbox.exec(["python3", "-c", wait], timeout=60)
    assert job.exit_code == 0, job.stderr


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_harness_completes_a_tool_task_without_network(service, name):
    client, image = service
    harness = HARNESSES[name]
    sandbox = client.create_sandbox(image, block_network=True, memory="2Gi", timeout=300)
    try:
        start_stub(sandbox)
        run = HarnessRun(
            model="stub",
            base_url=f"http://127.0.0.1:{STUB_PORT}{RUN_PATH}",
            task=TASK,
            timeout_s=240,
        )
        inv = harness.invocation(run)
        for path, content in inv.files.items():
            sandbox.upload_content(path, content)
        job = sandbox.exec(
            inv.argv, env=dict(inv.env), cwd=inv.cwd, stdin=inv.stdin, timeout=inv.exec_timeout_s
        )
        result = harness.parse(job.stdout, job.exit_code)
        detail = f"exit {job.exit_code}\nstdout: {job.stdout[-3000:]}\nstderr: {job.stderr[-3000:]}"
        assert result.exit_status == "submitted", detail
        assert result.final_text == FINAL, detail
        assert result.tool_calls is not None and result.tool_calls >= 1, detail
        # The tool call ran in the sandbox, and nothing of the harness's own landed in the
        # workspace.
        assert sandbox.download_content("/workspace/out.txt") == b"hello\n"
        assert sorted(f.name for f in sandbox.list_files("/workspace")) == ["out.txt"]

        requests = [
            json.loads(line)
            for line in sandbox.download_content("/tmp/stub/requests.jsonl").decode().splitlines()
        ]
        posts = [r for r in requests if r["method"] == "POST"]
        assert posts, requests
        for r in posts:
            assert r["path"] == f"{RUN_PATH}/{ENDPOINT[name]}"
            assert r["headers"]["authorization"] == f"Bearer {DUMMY_API_KEY}"
            assert r["body"]["model"] == "stub"
            assert r["body"]["stream"] is True
        with_tools = [r["body"] for r in posts if r["body"].get("tools")]
        assert len(with_tools) >= 2  # the tool call, then the final answer
        names = {t.get("name") or t.get("function", {}).get("name") for t in with_tools[0]["tools"]}
        assert set(harness.shell_tools) & names, names
        # The task reaches the model verbatim (quotes and newline intact).
        assert any(TASK in text for text in strings(with_tools[0])), with_tools[0]
    finally:
        sandbox.delete()
