"""The escape suite: a local sandbox's own writable root over a shared image tree.

Every sandbox of an image shares one unpacked tree (the image store's, or a root
filesystem directory) under a writable root of its own (``backends/local/image_roots.py``).
What one sandbox writes there must reach neither the shared tree nor a neighbour; an
image's links must not steer what the orchestrator writes into a new root; deleting a
sandbox must leave no mount behind; the store itself is out of every sandbox's sight.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import httpx
import pytest
from security.probing import unique

from orchard_env_client import SandboxClient, SandboxFailed
from orchard_testing import TEST_IMAGE_STORE, RunningServer, only_backend, wait_for_removals

pytestmark = [pytest.mark.integration, pytest.mark.security, only_backend("local")]
rootfs_image = pytest.mark.parametrize("image", ["rootfs"], indirect=True)


def _tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        digest.update(f"{path.relative_to(root)}:{st.st_mode}:{st.st_size}:{st.st_uid}".encode())
    return digest.hexdigest()


def _busybox_root(where: Path) -> Path:
    """A minimal root filesystem: the host's static busybox as /bin/sh and sleep."""
    (where / "bin").mkdir(parents=True)
    shutil.copy2("/bin/busybox", where / "bin" / "busybox")
    for name in ("sh", "sleep", "cat", "ls", "echo"):
        (where / "bin" / name).symlink_to("busybox")
    return where


@rootfs_image
def test_what_a_sandbox_writes_to_its_root_stays_its_own(client: SandboxClient, image: str):
    before = _tree_digest(Path(image) / "etc")
    mark = unique()
    with client.create_sandbox(image) as one, client.create_sandbox(image) as two:
        done = one.exec(
            f"echo {mark} > /usr/local/bin/{mark} && echo {mark} >> /etc/os-release "
            "&& rm /etc/issue && mkdir /new-top-level"
        )
        assert done.exit_code == 0, done.stderr
        one.upload_content(f"/etc/{mark}", b"through the file API")
        assert one.exec(f"cat /usr/local/bin/{mark}").stdout.strip() == mark
        missing = two.exec(f"ls /usr/local/bin/{mark} /etc/{mark} /new-top-level")
        assert missing.exit_code != 0 and missing.stderr.count("No such file") == 3
        assert two.exec(f"grep -c {mark} /etc/os-release").stdout.strip() == "0"
        assert two.exec("test -e /etc/issue").exit_code == 0
    assert _tree_digest(Path(image) / "etc") == before
    assert not (Path(image) / "usr" / "local" / "bin" / mark).exists()


def test_an_images_links_cannot_steer_the_roots_setup(client: SandboxClient, tmp_path: Path):
    """The orchestrator writes /etc/hosts, hostname and resolv.conf into each new root:
    an image whose /etc is a link to a host directory must not get them written there."""
    host_dir = tmp_path / "host-etc"
    host_dir.mkdir()
    root = _busybox_root(tmp_path / "root")
    (root / "etc").symlink_to(str(host_dir))
    with pytest.raises(SandboxFailed, match="cannot prepare the sandbox's /etc"):
        client.create_sandbox(str(root))  # refused (no /etc inside its root), not redirected
    assert list(host_dir.iterdir()) == []


def test_a_deleted_sandbox_leaves_no_mount_behind(client: SandboxClient, server: RunningServer):
    root = _busybox_root(Path(server.state_dir).parent / unique("root"))
    sandboxes = [client.create_sandbox(str(root)) for _ in range(3)]
    state = str(Path(server.state_dir).resolve())
    assert sum(state in line for line in Path("/proc/self/mountinfo").read_text().splitlines())
    for sandbox in sandboxes:
        sandbox.delete()
    wait_for_removals(server.url)
    left = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if state in line]
    assert left == []
    assert (root / "bin" / "busybox").is_file()  # the shared tree survives its sandboxes


def test_a_sandbox_sees_neither_the_image_store_nor_the_state_dir(
    client: SandboxClient, server: RunningServer
):
    root = _busybox_root(Path(server.state_dir).parent / unique("root"))
    store = TEST_IMAGE_STORE.resolve()  # the store the test servers share (orchard_testing)
    with client.create_sandbox(str(root)) as sandbox:
        state = Path(server.state_dir).resolve()
        found = sandbox.exec(f"ls {state} {store} {root}")
        assert found.exit_code != 0 and found.stderr.count("No such file") == 3
    assert store.is_dir() and state.is_dir()


def test_only_trees_the_operator_allowed_can_be_named_by_path(
    server: RunningServer, tmp_path: Path
):
    """A root filesystem named by path is id-mapped onto the sandbox's root, so its
    root-only files become the sandbox's: a tenant must not name ``/root``, ``/etc``, the
    state dir or the store. Only trees strictly under ``--local-rootfs-dir`` (the test
    servers allow pytest's temporary dirs) qualify; there links and ``..`` resolve as if
    that directory were ``/``, and what was opened is checked again by its fd."""
    state = Path(server.state_dir).resolve()
    (tmp_path / "to-root").symlink_to("/")
    (tmp_path / "up-to-root").symlink_to("../" * 12)
    (tmp_path / "to-state").symlink_to(os.path.relpath(state, tmp_path))
    (tmp_path / "to-etc").symlink_to("/etc")
    outside = ["/", "/root", "/etc", "/etc/../root", "/proc/1/root", "/proc/self/root"]
    ours = [state, state / "sandboxes", state.parent, TEST_IMAGE_STORE, TEST_IMAGE_STORE / "x"]
    links = [tmp_path / "to-root", tmp_path / "up-to-root", tmp_path / "to-state"]
    refused = [*outside, tempfile.gettempdir(), "/x\0y", *map(str, [*ours, *links])]
    for path in refused:
        answer = httpx.post(f"{server.url}/sandboxes", json={"image": path})
        assert answer.status_code == 400, (path, answer.text)
        assert answer.json()["code"] == "invalid_image"
        assert "--local-rootfs-dir" in answer.json()["detail"]
    # A link out resolves inside the allowed directory, where there is no /etc.
    answer = httpx.post(f"{server.url}/sandboxes", json={"image": str(tmp_path / "to-etc")})
    assert answer.status_code == 404 and answer.json()["code"] == "image_not_found"
    assert httpx.get(f"{server.url}/sandboxes").json()["sandboxes"] == []


@pytest.mark.parametrize("allowed", ["/", tempfile.gettempdir(), "/no/such/dir"])
def test_a_server_refuses_allowed_dirs_others_could_change(
    fresh_server: RunningServer, allowed: str
):
    """A directory others can write (``/tmp``) would let them swap what a tenant's path
    leads to; ``/`` would allow everything: the server does not start."""
    fresh_server.env["ORCHARD_ENV_LOCAL_ROOTFS_DIRS"] = allowed
    with pytest.raises(RuntimeError, match="--local-rootfs-dir"):
        fresh_server.start()


def test_an_archives_links_cannot_reach_host_files(client: SandboxClient, tmp_path: Path):
    """A rootfs archive is unpacked by the store's layer applier: a hard link naming a
    host file is resolved inside the new root, so the host file keeps its owner and mode
    (``tarfile``'s own extraction would link it and then chown and chmod it)."""
    victim = tmp_path / "victim"
    victim.write_text("host secret")
    victim.chmod(0o600)
    before = victim.stat()
    archive = tmp_path / "allowed" / "evil.tar"
    archive.parent.mkdir()
    with tarfile.open(archive, "w") as tar:
        for name, kind in (("bin", tarfile.DIRTYPE), ("bin/sh", tarfile.REGTYPE)):
            member = tarfile.TarInfo(name)
            member.type, member.mode = kind, 0o755
            data = Path("/bin/busybox").read_bytes() if kind == tarfile.REGTYPE else b""
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
        link = tarfile.TarInfo("stolen")
        link.type, link.linkname = tarfile.LNKTYPE, str(victim)
        link.uid = link.gid = 65534
        link.mode = 0o777
        tar.addfile(link)
    try:
        with client.create_sandbox(str(archive)) as sandbox:
            assert "host secret" not in sandbox.exec("cat /stolen").stdout
    except SandboxFailed:
        pass  # refused as a bad archive: as good
    after = victim.stat()
    assert (after.st_uid, after.st_gid, after.st_mode) == (
        before.st_uid,
        before.st_gid,
        before.st_mode,
    )
    assert victim.read_text() == "host secret"


def test_by_default_no_tree_can_be_named_by_path(fresh_server: RunningServer, tmp_path: Path):
    fresh_server.env["ORCHARD_ENV_LOCAL_ROOTFS_DIRS"] = ""  # as `orchard-env serve` starts
    fresh_server.start()
    root = _busybox_root(tmp_path / "root")
    for image in (str(root), "/no/such/dir"):  # refused alike: existence is not told
        answer = httpx.post(f"{fresh_server.url}/sandboxes", json={"image": image})
        assert answer.status_code == 400 and answer.json()["code"] == "invalid_image"
    with SandboxClient(fresh_server.url) as client, client.create_sandbox("host") as sandbox:
        assert sandbox.exec("echo ok").stdout == "ok\n"


def test_a_sandbox_deep_tree_does_not_keep_its_directory_alive(
    client: SandboxClient, server: RunningServer
):
    """Removal walks with a stack, not recursion: a tree past Python's recursion limit
    in a sandbox's root and workspace is removed with it."""
    make = "for i in $(seq 1500); do mkdir d && cd d || exit 1; done"
    with client.create_sandbox(str(_busybox_root(Path(server.state_dir).parent / unique()))) as s:
        home = Path(server.state_dir) / "sandboxes" / s.sandbox_id
        for where in ("/workspace", "/"):
            done = s.exec(f"cd {where} && {make}", timeout=120)
            assert done.exit_code == 0, done.stderr
    wait_for_removals(server.url)
    assert not home.exists()


def test_fifos_devices_and_mount_points_under_an_allowed_dir_are_refused(
    server: RunningServer, tmp_path: Path
):
    """What a tenant names is opened O_PATH (a FIFO would block a worker thread, a
    device be opened as root) and never across a mount point (a bind of a host dir)."""
    os.mkfifo(tmp_path / "fifo")
    host_dir = tmp_path / "host-dir"
    host_dir.mkdir()
    mounted = tmp_path / "tree" / "mnt"
    mounted.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(host_dir), str(mounted)], check=True)
    try:
        for image in (tmp_path / "fifo", mounted, mounted / "x", Path("/proc/self/fd/0")):
            answer = httpx.post(f"{server.url}/sandboxes", json={"image": str(image)}, timeout=10)
            assert answer.status_code in (400, 404), (image, answer.text)
    finally:
        subprocess.run(["umount", str(mounted)], check=True)
    assert httpx.get(f"{server.url}/sandboxes").json()["sandboxes"] == []


def test_a_sticky_ancestor_of_another_owner_does_not_qualify(
    fresh_server: RunningServer, tmp_path: Path
):
    """The owner of a sticky directory may still move what it holds: an allowed
    directory below one owned by anyone but root is refused at start."""
    drop = tmp_path / "drop"
    (drop / "images").mkdir(parents=True)
    drop.chmod(0o1777)
    os.chown(drop, 65534, 65534)
    fresh_server.env["ORCHARD_ENV_LOCAL_ROOTFS_DIRS"] = str(drop / "images")
    with pytest.raises(RuntimeError, match="owned by uid 65534"):
        fresh_server.start()
