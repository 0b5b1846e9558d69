"""File work as a sandbox's owner: per-thread filesystem ids, uids past 2^31 included."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from orchard_env_agent.owner import acting_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


@pytest.mark.parametrize("uid", [1_000_000_000, 2**31 + 65536 * 3])
def test_files_made_acting_as_the_owner_are_the_owners_and_only_that_thread_changes(
    tmp_path: Path, uid: int
) -> None:
    tmp_path.chmod(0o1777)
    anchor = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)  # its parents are root's alone

    def work() -> None:
        with acting_as((uid, uid)):
            os.close(os.open("made", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=anchor))

    other = threading.Event()
    worker = threading.Thread(target=work)
    worker.start()
    (tmp_path / "main").write_text("y")  # this thread stays root meanwhile
    other.set()
    worker.join()
    os.close(anchor)
    assert os.stat(tmp_path / "made").st_uid == uid
    assert os.stat(tmp_path / "main").st_uid == 0


def test_acting_as_the_owner_cannot_read_what_root_alone_may(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root's")
    secret.chmod(0o600)
    anchor = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    with acting_as((1_000_000_000, 1_000_000_000)), pytest.raises(PermissionError):
        os.open("secret", os.O_RDONLY, dir_fd=anchor)
    os.close(anchor)
    assert secret.read_text() == "root's"
