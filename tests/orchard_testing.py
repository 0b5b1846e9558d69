"""A real orchestrator process for tests: start, stop, kill, restart on one state dir."""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Self

import attrs
import httpx
import pytest

# The image each backend's tests use: the host's own root locally; on Docker, the Debian
# test image built by infra/images/build (bash, git, python3 like the host).
IMAGES = {"local": "host", "docker": "orchard-test/debian", "kubernetes": "orchard-test/debian"}
BUSYBOX_IMAGE = "orchard-test/busybox"
# The local backend's image store every test server shares (see RunningServer.start).
TEST_IMAGE_STORE = Path(
    os.environ.get("ORCHARD_TEST_IMAGE_STORE", "/var/tmp/orchard-test-image-store")
)
# What infra/images/build leaves besides Docker images: saved archives, rootfs trees.
ROOTFS_ARCHIVES = Path("/var/tmp/orchard-images")
# Where pytest's tmp_path directories live (this user's, mode 0700).
PYTEST_TEMP = Path(tempfile.gettempdir()) / f"pytest-of-{getpass.getuser()}"
SETUP_HINT = (
    "run `bash scripts/test.sh` once (it starts dockerd, builds the test images and brings "
    "up the test cluster)"
)
CLUSTER_DIR = Path(os.environ.get("ORCHARD_TEST_CLUSTER_DIR", "/var/tmp/orchard-test-cluster"))


def cluster_env() -> dict[str, str]:
    """What infra/test-cluster/up wrote: KUBECONFIG, K8S_BIN, NODE_IP, ETCD_ENDPOINT, ..."""
    lines = (CLUSTER_DIR / "env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def kubectl(*args: str, check: bool = True, timeout: float = 120) -> str:
    """The test cluster's kubectl (tests use it to set up and to act behind the backend)."""
    env = cluster_env()
    argv = [f"{env['K8S_BIN']}/kubectl", "--kubeconfig", env["KUBECONFIG"], *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def ensure_namespace(name: str) -> None:
    if not kubectl("get", "namespace", name, "--ignore-not-found", "-o", "name"):
        kubectl("create", "namespace", name)


def docker(*args: str, check: bool = True) -> str:
    """Run the docker CLI (tests use it only to act behind the orchestrator's back)."""
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def import_into_test_store(*images: str) -> None:
    """Put Docker engine ``images`` into the test servers' shared image store (once: an
    image the store holds already is left alone)."""
    from orchard_env_server.images import ImageStore

    store = ImageStore(TEST_IMAGE_STORE)
    missing = [image for image in images if store.resolve(image) is None]
    if not missing:
        return
    TEST_IMAGE_STORE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=TEST_IMAGE_STORE.parent) as scratch:
        archive = Path(scratch) / "images.tar"
        docker("save", "-o", str(archive), *missing)
        store.import_archive(archive)


def require_backend(name: str) -> None:
    """Fail loudly, never skip, when a backend's engine or images are missing."""
    if name == "kubernetes":
        try:
            kubectl("get", "--raw", "/readyz")
        except (OSError, KeyError, RuntimeError, subprocess.TimeoutExpired) as exc:
            raise RuntimeError(
                f"the kubernetes backend's tests need the test cluster: {exc}; {SETUP_HINT}"
            ) from exc
        name = "docker"  # its images are the Docker engine's
    if name != "docker":
        return
    try:
        docker("version", "--format", "{{.Server.Version}}")
        for image in (IMAGES["docker"], BUSYBOX_IMAGE, "orchard/agent-injector:latest"):
            docker("image", "inspect", "--format", "{{.Id}}", image)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(
            f"the docker backend's tests need an engine and images: {exc}; {SETUP_HINT}"
        ) from exc


def selected_backends() -> list[str]:
    """ORCHARD_TEST_BACKENDS narrows the backends for quick iteration; CI runs all."""
    raw = os.environ.get("ORCHARD_TEST_BACKENDS", "local,docker,kubernetes")
    return [b.strip() for b in raw.split(",") if b.strip()]


def only_backend(name: str) -> pytest.MarkDecorator:
    """Run a test or module on one backend only (it tests that backend's own mechanism)."""
    if name in selected_backends():
        return pytest.mark.parametrize("backend", [name], indirect=True)
    excluded = pytest.param(name, marks=pytest.mark.skip(reason="not in ORCHARD_TEST_BACKENDS"))
    return pytest.mark.parametrize("backend", [excluded], indirect=True)


def wait_for_removals(url: str, seconds: float = 30) -> None:
    """Wait until the server has finished removing deleted sandboxes: a delete answers
    once the sandbox is stopped for good, and the rest of its removal follows."""
    deadline = time.monotonic() + seconds
    while httpx.get(f"{url}/resources", timeout=10).json()["sandboxes_reaping"]:
        assert time.monotonic() < deadline, "deleted sandboxes are still being removed"
        time.sleep(0.05)


def leftovers(server: RunningServer) -> list[str]:
    """What a server left running for its state dir: processes (local), containers or pods."""
    if server.backend == "kubernetes":
        kinds = "pods,secrets,networkpolicies"
        selector = "orchard.dev/role"
        deadline = time.monotonic() + 60  # deleted pods take a few seconds to go
        while True:
            names = kubectl("-n", server.namespace, "get", kinds, "-l", selector, "-o", "name")
            if not names or time.monotonic() > deadline:
                return names.split()
            time.sleep(0.5)
    if server.backend == "docker":
        id_file = server.state_dir / "docker" / "orchestrator-id"
        if not id_file.exists():
            return []
        label = f"orchard.dev/orchestrator={id_file.read_text().strip()}"
        names = docker("ps", "-a", "--filter", f"label={label}", "--format", "{{.Names}}")
        return names.split()
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(server.state_dir) in cmd:
                found.append(cmd)
    sandboxes = server.state_dir / "sandboxes"
    if sandboxes.is_dir():
        found += [f"directory {p}" for p in sandboxes.iterdir()]
    return found


def agent_pid(server: RunningServer, sandbox_id: str) -> int:
    """The host pid of the agent serving a sandbox (the local backend's is shared)."""
    if server.backend == "local":
        return int(json.loads((server.state_dir / "agent.json").read_text())["pid"])
    if server.backend == "docker":
        return int(docker("inspect", "-f", "{{.State.Pid}}", f"orchard-{sandbox_id}"))
    from orchard_env_server.backends.kubernetes.spec import object_name

    pod = object_name(sandbox_id)
    ids = docker(
        "ps",
        "-q",
        "--filter",
        f"label=io.kubernetes.pod.name={pod}",
        "--filter",
        "label=io.kubernetes.container.name=sandbox",
    )
    return int(docker("inspect", "-f", "{{.State.Pid}}", ids.split()[0]))


def wait_until_it_runs_again(sandbox: object, seconds: float = 20) -> None:
    """Retry ``echo`` in a sandbox until it works (after a fork bomb, an agent restart)."""
    from orchard_env_client import OrchardError, Sandbox

    assert isinstance(sandbox, Sandbox)
    deadline = time.monotonic() + seconds
    while True:
        try:
            if sandbox.exec("echo recovered", timeout=5).stdout == "recovered\n":
                return
        except OrchardError:
            pass
        assert time.monotonic() < deadline, f"the sandbox did not recover in {seconds:g} s"
        time.sleep(0.5)


def backend_is_slow(server: RunningServer) -> bool:
    """Backends whose sandboxes are rarely ready within the create call's half second."""
    return server.backend == "kubernetes"


def check_tool_protocol(messages: list[dict[str, Any]], *, open_end: bool = False) -> None:
    """Every tool call in a trajectory is answered by a tool message with its id, before
    the next turn. With ``open_end`` the last turn's calls may stay unanswered (mini
    submits from inside a command, so its submitting call never gets an observation)."""
    pending: set[str] = set()
    for message in messages:
        if message["role"] == "tool":
            assert message["tool_call_id"] in pending
            pending.discard(message["tool_call_id"])
            continue
        assert not pending, f"unanswered tool calls {pending}"
        pending.update(call["id"] for call in message.get("tool_calls") or [])
    assert open_end or not pending


def create_ready(url: str, body: dict[str, object]) -> dict[str, object]:
    """POST /sandboxes, then wait for it when the backend answered ``pending`` (pods take
    a few seconds; local and Docker sandboxes are usually ready in the answer)."""
    created: dict[str, object] = httpx.post(f"{url}/sandboxes", json=body, timeout=60).json()
    if created.get("status") == "pending":
        waited = httpx.get(f"{url}/sandboxes/{created['sandbox_id']}/wait", timeout=90)
        created = waited.json()
    return created


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@attrs.define
class RunningServer:
    """One orchestrator process; ``restart`` keeps its state dir, like a real restart."""

    backend: str
    state_dir: Path
    api_keys: str | None = None
    port: int = attrs.Factory(free_port)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    namespace: str = "orchard-test"  # kubernetes: where its sandbox pods go
    kubeconfig: Path | None = None  # kubernetes: default, the test cluster's
    env: dict[str, str] = attrs.Factory(dict)  # more environment for the process

    def __attrs_post_init__(self) -> None:
        if self.backend == "kubernetes" and self.namespace == "orchard-test":
            # One namespace per server, so leftovers are its own; restarts keep it.
            digest = hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:10]
            self.namespace = f"orchard-test-{digest}"

    @property
    def image(self) -> str:
        return IMAGES[self.backend]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *extra: str) -> None:
        self.log_path = self.state_dir.parent / f"server-{self.port}-{time.monotonic_ns()}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_ENV_")}
        if self.api_keys:
            env["ORCHARD_ENV_API_KEYS"] = self.api_keys
        # Local servers share one image store (imported once a session) and pull nothing:
        # no test may reach a public registry.
        env["ORCHARD_ENV_IMAGE_STORE"] = str(TEST_IMAGE_STORE)
        env["ORCHARD_ENV_IMAGE_PULL"] = "never"
        # Root filesystems tests make (under pytest's temporary dirs, root's own) and those
        # the image build leaves (the harnesses' tree) may be named by path; nothing else.
        allowed = [d for d in (PYTEST_TEMP, ROOTFS_ARCHIVES) if d.is_dir()]
        env["ORCHARD_ENV_LOCAL_ROOTFS_DIRS"] = ",".join(map(str, allowed))
        env.update(self.env)
        argv = [
            sys.executable,
            "-m",
            "orchard_env_server.cli",
            "serve",
            "--backend",
            self.backend,
            "--port",
            str(self.port),
            "--state-dir",
            str(self.state_dir),
            *extra,
        ]
        if self.backend == "kubernetes":
            ensure_namespace(self.namespace)
            argv += [
                "--kubeconfig",
                str(self.kubeconfig or cluster_env()["KUBECONFIG"]),
                "--namespace",
                self.namespace,
                "--image-pull-policy",
                "Never",  # nothing may be pulled here
                "--delete-sandboxes-on-exit",  # like the other backends, for leftovers()
            ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server did not become healthy:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)


class ThreadedApp:
    """An ASGI app served by uvicorn on a thread of the test process (a scripted model,
    a judge): ``with ThreadedApp(app, port):``."""

    def __init__(self, app: object, port: int) -> None:
        import uvicorn

        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_level="warning",  # type: ignore[arg-type]
            timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ThreadedApp:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the threaded app did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@attrs.define
class StubEndpoint:
    """A scripted HTTP endpoint of a test (a policy, a judge, a ``/generate`` server):
    subclasses name their handlers in ``routes()``; ``with stub:`` serves them on a thread
    at ``url``."""

    port: int = attrs.field(factory=free_port, kw_only=True)
    served: ThreadedApp | None = attrs.field(default=None, kw_only=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """Where an OpenAI-compatible client points (its routes under ``/v1``)."""
        return f"{self.url}/v1"

    def routes(self) -> list[Any]:
        raise NotImplementedError

    def __enter__(self) -> Self:
        from starlette.applications import Starlette

        self.served = ThreadedApp(Starlette(routes=self.routes()), self.port).__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.served is not None
        self.served.__exit__()
