"""The escape suite: what belongs to others. Another sandbox's processes and files, and
secrets the test plants on the host (under /root, /srv, /var/tmp, /home, the temp dir and
the orchestrator's state dir). See test_privileges.py for the suite and how to run it."""

from __future__ import annotations

from pathlib import Path

import pytest
from security.probing import (
    PROCESS_PROBE,
    assert_unreached,
    find_on_host,
    run_probe,
    sleep_marker,
    unique,
    wait_for_host_pid,
)

pytestmark = [pytest.mark.integration, pytest.mark.security]

# Looks everywhere it can for files by name (a walk of / but /proc, /sys and /dev, with a
# time budget that must not run out) and for contents (in the usual places for data), and
# tries to read given paths directly and through /proc/1/root.
SEARCH_PROBE = """
import time
names, contents = set(ARGS["names"]), [c.encode() for c in ARGS["contents"]]
deadline = time.monotonic() + ARGS["seconds"]
found, complete = [], True
for root, dirs, files in os.walk("/"):
    if time.monotonic() > deadline:
        complete = False
        break
    if root == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    found += [os.path.join(root, n) for n in names.intersection(files + dirs)]
out["found"], out["complete"] = found, complete
leaked = []
for top in ("/tmp", "/workspace", "/var/tmp", "/run", "/root", "/home", "/srv", "/mnt", "/media", "/opt"):
    for root, dirs, files in os.walk(top):
        if time.monotonic() > deadline:
            out["complete"] = False
            break
        for name in files:
            try:
                with open(os.path.join(root, name), "rb") as fh:
                    data = fh.read(1 << 20)
            except OSError:
                continue
            if any(c in data for c in contents):
                leaked.append(os.path.join(root, name))
out["leaked"] = leaked
out["reads"] = {}
for path in ARGS["paths"]:
    for variant in (path, "/proc/1/root" + path):
        def read():
            with open(variant, "rb") as fh:
                data = fh.read(1 << 20)
            if not any(c in data for c in contents):
                raise OSError(0, "read, but not the secret")
        out["reads"][variant] = attempt(read)
"""


FIND_SLEEP = """
out["pids"] = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
        except OSError:
            continue
        if os.path.basename(argv[0]) == b"sleep" and argv[1:2] == [ARGS["marker"].encode()]:
            out["pids"].append(int(pid))
"""


def search(sandbox, names: list[str], contents: list[str], paths: list[str]) -> dict:
    """Run SEARCH_PROBE and assert it searched everything it meant to."""
    result = run_probe(
        sandbox, SEARCH_PROBE, timeout=240, seconds=150, names=names, contents=contents, paths=paths
    )
    assert result["complete"], "the search ran out of time: it proves nothing"
    assert len(result["reads"]) == 2 * len(paths), result
    return result


def assert_found_nothing(result: dict) -> None:
    assert result["found"] == [], f"found by name: {result['found']}"
    assert result["leaked"] == [], f"found by content: {result['leaked']}"
    read = {p: r for p, r in result["reads"].items() if r == "ok"}
    assert read == {}, f"read: {read}"


def test_a_sandbox_cannot_see_or_trace_another_sandboxs_process(client, image, blocked_sandbox):
    marker = sleep_marker()
    with client.create_sandbox(image) as other:
        job = other.start(f"exec sleep {marker}", timeout=600)
        host_pid = wait_for_host_pid(marker)
        inner_pid = run_probe(other, FIND_SLEEP, marker=marker)["pids"]
        assert len(inner_pid) == 1, "the other sandbox does not see its own process"
        pids = [host_pid, *inner_pid]
        result = run_probe(blocked_sandbox, PROCESS_PROBE, marker=marker, pids=pids)
        assert_unreached(result, host_pid)
        assert job.refresh().status == "running", "the other sandbox's process was ended"
        job.cancel()


def test_a_sandbox_cannot_read_another_sandboxs_files(server, client, image, blocked_sandbox):
    name, content = unique("orchard-neighbour"), unique("orchard-neighbour-data")
    marker = sleep_marker()
    with client.create_sandbox(image) as other:
        for folder in ("/workspace", "/tmp"):
            other.upload_content(f"{folder}/{name}", content)
        job = other.start(f"exec sleep {marker}", timeout=600)
        host_pid = wait_for_host_pid(marker)
        # Where the files are on the host: through the other sandbox's root, and wherever
        # its backend keeps them (the local state dir, Docker's storage).
        stored = find_on_host(name, [server.state_dir, Path("/var/lib/docker")])
        assert stored, "the other sandbox's files are nowhere on the host: nothing to try"
        paths = [f"/proc/{host_pid}/root{folder}/{name}" for folder in ("/workspace", "/tmp")]
        paths += stored
        result = search(blocked_sandbox, [name], [content], paths)
        job.cancel()
    assert_found_nothing(result)


def test_a_sandbox_cannot_read_a_host_secret(blocked_sandbox, host_secrets):
    result = search(
        blocked_sandbox,
        names=[s.path.name for s in host_secrets] + [s.path.parent.name for s in host_secrets],
        contents=[s.content for s in host_secrets],
        paths=[str(s.path) for s in host_secrets],
    )
    assert_found_nothing(result)
