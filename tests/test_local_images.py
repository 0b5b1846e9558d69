"""Any image on the local backend (no daemon): the image store end to end.

An image pulled from a real registry (Debian's docker-registry on 127.0.0.1) when a create
names it, one pull for many concurrent creates; its Env, WorkingDir and User applied to
commands; a clear 404 for an image nobody has; a create naming a registry nobody allowed,
or one on a loopback or private address, refused without a connection; and ``image
prune`` leaving alone the trees that live sandboxes stand on.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from images.registry import LocalRegistry, RegistryProxy

from orchard_env_client import SandboxClient
from orchard_testing import BUSYBOX_IMAGE, RunningServer, docker, only_backend, wait_for_removals

pytestmark = [pytest.mark.integration, only_backend("local")]
CONFIGURED = "orchard-test/configured-busybox"


@pytest.fixture(scope="module")
def configured_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A busybox image with an Env, a WorkingDir and a non-root User of its own."""
    context = tmp_path_factory.mktemp("configured")
    (context / "Dockerfile").write_text(
        f"FROM {BUSYBOX_IMAGE}\n"
        "RUN echo 'app:x:1234:2345:app:/home/app:/bin/sh' >> /etc/passwd \\\n"
        " && echo 'appgroup:x:2345:' >> /etc/group && mkdir -p /srv/app /home/app \\\n"
        " && chown 1234:2345 /srv/app /home/app\n"
        "ENV GREETING=from-the-image PATH=/opt/tools:/usr/bin:/bin\n"
        "WORKDIR /srv/app\nUSER app\n"
    )
    docker("build", "-q", "-t", CONFIGURED, str(context))
    yield CONFIGURED
    docker("rmi", "-f", CONFIGURED, check=False)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryProxy]:
    """A real registry, behind a proxy that counts what is asked of it."""
    real = LocalRegistry(tmp_path_factory.mktemp("registry"))
    proxy = RegistryProxy(real.url, auth=True)
    yield proxy
    proxy.stop()
    real.stop()


def _pulling(tmp_path: Path) -> RunningServer:
    """A local server with a store of its own that pulls what a create names."""
    return RunningServer(
        backend="local",
        state_dir=tmp_path / "state",
        env={
            "ORCHARD_ENV_IMAGE_STORE": str(tmp_path / "store"),
            "ORCHARD_ENV_IMAGE_PULL": "missing",
        },
    )


@pytest.fixture
def pulling_server(
    tmp_path: Path, registry: RegistryProxy, configured_image: str
) -> Iterator[RunningServer]:
    """A server with a store of its own that pulls docker.io names from the registry."""
    srv = _pulling(tmp_path)
    srv.start("--registry-mirror", f"docker.io={registry.url}")
    yield srv
    srv.stop()


def test_a_create_pulls_a_missing_image_once_and_runs_it_as_the_image_says(
    backend: str, pulling_server: RunningServer, registry: RegistryProxy, configured_image: str
):
    real = registry.upstream.removeprefix("http://")
    docker("tag", configured_image, f"{real}/team/configured:1")
    docker("push", "-q", f"{real}/team/configured:1")
    with SandboxClient(base_url=pulling_server.url) as client:
        with ThreadPoolExecutor(4) as pool:
            sandboxes = list(
                pool.map(lambda _: client.create_sandbox("team/configured:1"), range(4))
            )
        manifests = [p for p, _ in registry.requests if "/manifests/" in p]
        assert len(manifests) == 1, manifests  # one pull served the four creates
        sandbox = sandboxes[0]
        done = sandbox.exec("id -u; id -g; pwd; echo $GREETING; echo $PATH; echo $HOME")
        assert done.stdout.split() == [
            "1234",
            "2345",
            "/srv/app",
            "from-the-image",
            "/opt/tools:/usr/bin:/bin",
            "/home/app",
        ]
        assert sandbox.exec("touch /etc/nope").exit_code != 0  # not root: the image's user
        assert sandbox.exec("echo mine > /srv/app/f && cat f").stdout == "mine\n"
        assert sandbox.exec("id -u", env={"GREETING": "x"}).stdout == "1234\n"
        listed = subprocess.run(
            [
                sys.executable,
                "-m",
                "orchard_env_server.cli",
                "image",
                "ls",
                "--json",
                "--image-store",
                str(Path(pulling_server.state_dir).parent / "store"),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "docker.io/team/configured:1" in listed


def test_an_image_nobody_has_is_a_404_naming_the_commands(server: RunningServer):
    answer = httpx.post(f"{server.url}/sandboxes", json={"image": "nobody/has-this:1"})
    assert answer.status_code == 404
    body = answer.json()
    assert body["code"] == "image_not_found"
    assert "orchard-env image pull" in body["detail"] and "image import" in body["detail"]


def test_prune_leaves_the_trees_of_live_sandboxes(backend: str, tmp_path: Path):
    store = tmp_path / "store"
    srv = RunningServer(
        backend="local", state_dir=tmp_path / "state", env={"ORCHARD_ENV_IMAGE_STORE": str(store)}
    )
    archive = tmp_path / "busybox.tar"
    docker("save", "-o", str(archive), BUSYBOX_IMAGE)
    cli = [sys.executable, "-m", "orchard_env_server.cli", "image"]
    subprocess.run([*cli, "import", str(archive), "--image-store", str(store)], check=True)
    srv.start()
    try:
        with SandboxClient(base_url=srv.url) as client:
            sandbox = client.create_sandbox(BUSYBOX_IMAGE)
            subprocess.run([*cli, "rm", BUSYBOX_IMAGE, "--image-store", str(store)], check=True)
            subprocess.run([*cli, "prune", "--image-store", str(store)], check=True)
            assert sandbox.exec("ls /bin/sh && echo alive").stdout.endswith("alive\n")
            sandbox.delete()
        wait_for_removals(srv.url)  # its hold on the image tree goes with its removal
        subprocess.run([*cli, "prune", "--image-store", str(store)], check=True)
        assert not any((store / "rootfs").iterdir())  # with its last sandbox gone, it goes
    finally:
        srv.stop()


class _Listener:
    """A TCP port on 127.0.0.1 that counts the connections made to it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0

    def count(self) -> int:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return self.accepted
            conn.close()
            self.accepted += 1


def test_a_create_pulls_only_from_allowed_registries_and_public_hosts(backend: str, tmp_path: Path):
    listener = _Listener()
    srv = _pulling(tmp_path)
    srv.start()
    try:
        # Registries nobody allowed: refused before any connection (10.0.0.1 would take
        # the connect timeout, and the listener counts what reaches it).
        for image in ("10.0.0.1:5000/x:y", "127.0.0.1:1/x:y", f"127.0.0.1:{listener.port}/x:y"):
            started = time.monotonic()
            answer = httpx.post(f"{srv.url}/sandboxes", json={"image": image}, timeout=30)
            assert time.monotonic() - started < 5
            assert answer.status_code == 400, answer.text
            body = answer.json()
            assert body["code"] == "invalid_image"
            assert "--pull-registry" in body["detail"]
            assert "orchard-env image pull" in body["detail"]
        assert listener.count() == 0
    finally:
        srv.stop()
    # Allowed by name, but a loopback address the operator did not name (as insecure or
    # as a mirror): still never connected to.
    srv.start("--pull-registry", f"127.0.0.1:{listener.port}", "--pull-timeout", "30")
    try:
        answer = httpx.post(
            f"{srv.url}/sandboxes", json={"image": f"127.0.0.1:{listener.port}/x:y"}, timeout=60
        )
        assert answer.status_code == 502, answer.text
        body = answer.json()
        assert body["code"] == "image_pull_failed"
        assert "non-public address" in body["detail"]
        assert listener.count() == 0
    finally:
        srv.stop()
        listener.sock.close()
