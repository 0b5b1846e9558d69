"""The escape suite: links through the file API. A sandbox makes symlinks and hardlinks to
host files (/etc/shadow, secrets the test plants) and the test downloads and uploads
through them with the SDK; neither may reach the host's files, also not by swapping a file
or a directory for a link while the API works on it. See test_privileges.py for the suite
and how to run it."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from security.probing import (
    HostSecret,
    probe_command,
    probe_result,
    removed_if_present,
    run_probe,
    unique,
)

from orchard_env_client import OrchardError

pytestmark = [pytest.mark.integration, pytest.mark.security]

HOST_SHADOW = Path("/etc/shadow")


def _download(sandbox, path: str) -> bytes | str:
    """The bytes the file API gives for ``path``, or its refusal's error code."""
    try:
        return bytes(sandbox.download_content(path))
    except OrchardError as exc:
        return f"refused: {exc.code}"


def _host_bytes(sandbox_content: bytes | str, host_files: dict[str, bytes]) -> list[str]:
    """Which of ``host_files`` a download gave away (none when it was refused)."""
    if isinstance(sandbox_content, str):
        return []
    return [name for name, data in host_files.items() if data and data in sandbox_content]


def _symlink(sandbox, links: dict[str, str]) -> None:
    """Make each symlink inside the sandbox (``ln -s``); fail unless every one was made."""
    made = {
        link: sandbox.exec(["ln", "-sfT", target, link]).exit_code for link, target in links.items()
    }
    assert set(made.values()) == {0}, f"the sandbox could not make its links: {made}"


@pytest.fixture(scope="module")
def host_files(host_secrets: list[HostSecret]) -> dict[str, bytes]:
    files = {str(s.path): s.content.encode() for s in host_secrets}
    files[str(HOST_SHADOW)] = HOST_SHADOW.read_bytes()
    return files


def test_the_file_api_does_not_follow_a_sandboxs_symlinks_to_host_files(
    blocked_sandbox, host_secrets, host_files
):
    secret = host_secrets[0].path
    folder = f"/workspace/{unique('links')}"
    blocked_sandbox.exec(["mkdir", "-p", folder])
    targets = {
        "shadow": "/etc/shadow",
        "proc-1-shadow": "/proc/1/root/etc/shadow",
        "proc-self-shadow": "/proc/self/root/etc/shadow",
        "dotdot-shadow": "../" * 12 + "etc/shadow",
        "secret": str(secret),
        "proc-1-secret": f"/proc/1/root{secret}",
        "proc-self-secret": f"/proc/self/root{secret}",
        "dotdot-secret": "../" * 12 + str(secret).lstrip("/"),
        "secret-dir": str(secret.parent),
    }
    _symlink(blocked_sandbox, {f"{folder}/{n}": t for n, t in targets.items()})
    paths = [f"{folder}/{n}" for n in targets if n != "secret-dir"]
    paths.append(f"{folder}/secret-dir/{secret.name}")
    # ...and host paths asked for directly, and through /proc and ``..``.
    paths += [
        "/etc/shadow",
        str(secret),
        f"/proc/1/root{secret}",
        f"/proc/self/root{secret}",
        "/workspace/" + "../" * 12 + str(secret).lstrip("/"),
    ]
    given = {path: _host_bytes(_download(blocked_sandbox, path), host_files) for path in paths}
    assert {path: files for path, files in given.items() if files} == {}


def test_the_file_api_does_not_upload_through_a_symlink_onto_the_host(
    blocked_sandbox, host_secrets, tmp_path
):
    secret = host_secrets[0]
    folder = f"/workspace/{unique('links')}"
    blocked_sandbox.exec(["mkdir", "-p", folder])
    _symlink(
        blocked_sandbox,
        {
            f"{folder}/etc": "/etc",
            f"{folder}/dir": str(secret.path.parent),
            f"{folder}/file": str(secret.path),
        },
    )
    name = unique()
    landed = [Path("/etc") / name, secret.path.parent / name]
    try:
        for path in (f"{folder}/etc/{name}", f"{folder}/dir/{name}", f"{folder}/file"):
            with contextlib.suppress(OrchardError):
                blocked_sandbox.upload_content(path, "written through a link")
        # A tar upload into the linked directories as well.
        (tmp_path / name).write_text("written through a link by tar")
        for path in (f"{folder}/etc", f"{folder}/dir"):
            with contextlib.suppress(OrchardError):
                blocked_sandbox.upload_dir(tmp_path, path)
    finally:
        on_host = removed_if_present(landed)
    assert on_host == [], f"uploads landed on the host: {on_host}"
    assert secret.path.read_text() == secret.content, "a host file was overwritten"
    assert not secret.path.is_symlink()


HARDLINK_PROBE = """
out["links"] = {}
for target in ARGS["targets"]:
    link = f"/workspace/{ARGS['name']}-{len(out['links'])}"
    out["links"][target] = attempt(os.link, target, link)
    if out["links"][target] == "ok":
        out["links"][target] = "ok " + link
"""


def test_a_sandbox_cannot_hardlink_a_host_file_into_its_workspace(
    blocked_sandbox, host_secrets, host_files
):
    """``ln /etc/shadow /workspace/h``: refused, or the sandbox's own /etc/shadow."""
    targets = ["/etc/shadow", *(str(s.path) for s in host_secrets)]
    result = run_probe(blocked_sandbox, HARDLINK_PROBE, targets=targets, name=unique("hard"))
    made = {
        t: outcome.split()[1] for t, outcome in result["links"].items() if outcome.startswith("ok ")
    }
    given = {
        link: _host_bytes(_download(blocked_sandbox, link), host_files) for link in made.values()
    }
    assert {link: files for link, files in given.items() if files} == {}
    blocked_sandbox.exec(["rm", "-f", *made.values()])


# Swaps, as fast as it can and for a bounded time, a file with a symlink to a host secret,
# and a directory with a symlink to the secret's directory (renameat2 RENAME_EXCHANGE, or
# two renames where that is not supported): the window between the file API resolving a
# path and opening it.
SWAPPER = """
import time
RENAME_EXCHANGE, AT_FDCWD = 2, -100
os.chdir(ARGS["folder"])
def exchange(a, b):
    if libc.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), RENAME_EXCHANGE) == 0:
        return
    os.rename(a, a + ".aside")
    os.rename(b, a)
    os.rename(a + ".aside", b)
deadline = time.monotonic() + ARGS["seconds"]
swaps = 0
while time.monotonic() < deadline:
    exchange("x", "x.link")
    exchange("d", "d.link")
    swaps += 1
out["swaps"] = swaps
"""


@pytest.fixture
def public_host_file() -> Iterator[HostSecret]:
    """A world-readable file in a world-writable host directory (as /var/tmp or /tmp are):
    what an unprivileged host user could read and write, which a sandbox still must not."""
    folder = Path(tempfile.mkdtemp(prefix="orchard-public-", dir="/var/tmp"))
    folder.chmod(0o1777)
    path = folder / unique("public")
    content = f"public host bytes {unique('c')}"
    path.write_text(content)
    path.chmod(0o644)
    try:
        yield HostSecret(path=path, content=content)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("target", ["private", "public"])
def test_the_file_api_cannot_be_raced_into_host_files(
    blocked_sandbox, host_secrets, host_files, public_host_file, target
):
    secret = host_secrets[0] if target == "private" else public_host_file
    host_files = {**host_files, str(public_host_file.path): public_host_file.content.encode()}
    folder = f"/workspace/{unique('race')}"
    own = b"the sandbox's own bytes"
    blocked_sandbox.upload_content(f"{folder}/x", own)
    blocked_sandbox.upload_content(f"{folder}/d/{secret.path.name}", own)
    _symlink(
        blocked_sandbox,
        {f"{folder}/x.link": str(secret.path), f"{folder}/d.link": str(secret.path.parent)},
    )
    before = set(secret.path.parent.iterdir())
    swapping = blocked_sandbox.start(probe_command(SWAPPER, folder=folder, seconds=12), timeout=60)
    downloads: dict[str, list] = {"x": [], "d": []}
    uploads = 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        downloads["x"].append(_download(blocked_sandbox, f"{folder}/x"))
        downloads["d"].append(_download(blocked_sandbox, f"{folder}/d/{secret.path.name}"))
        try:
            blocked_sandbox.upload_content(f"{folder}/d/{unique('raced')}", b"raced")
            uploads += 1
        except OrchardError:
            pass
    swapper = probe_result(swapping.wait(timeout=60))
    after = set(secret.path.parent.iterdir())
    for stray in after - before:
        stray.unlink()
    assert swapper["swaps"] > 100, f"the swapper hardly ran: {swapper}"
    for which, answers in downloads.items():
        assert own in answers, f"no download of {which} ever worked: the race was not run"
        leaked = [a for a in answers if _host_bytes(a, host_files)]
        assert leaked == [], f"{len(leaked)} of {len(answers)} downloads of {which} gave host bytes"
    assert after - before == set(), f"{uploads} uploads put {after - before} on the host"
    assert secret.path.read_text() == secret.content
