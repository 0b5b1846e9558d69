"""``orchard-env image ...`` end to end: pull from the local registry, import a ``docker
save`` archive, list, tag, remove and prune."""

from __future__ import annotations

import json

from orchard_env_server.cli import main
from orchard_testing import BUSYBOX_IMAGE


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_image_commands(capsys, tmp_path, saved_image, local_registry, pushed, monkeypatch):
    monkeypatch.setenv("ORCHARD_ENV_STATE_DIR", str(tmp_path / "state"))  # what serve uses
    pushed(BUSYBOX_IMAGE, "cli/busybox:1")
    ref = f"{local_registry.host}/cli/busybox:1"

    code, out, err = _run(capsys, "image", "pull", ref)
    assert code == 1 and "--insecure" in err
    code, out, _ = _run(capsys, "image", "pull", ref, "--insecure")
    assert code == 0 and out.startswith(f"pulled {ref} (") and "unpacked in" in out
    code, out, _ = _run(
        capsys, "image", "pull", "cli/busybox:1", "--mirror", f"docker.io={local_registry.url}"
    )
    assert code == 0 and "pulled docker.io/cli/busybox:1" in out
    code, out, _ = _run(capsys, "image", "import", str(saved_image(BUSYBOX_IMAGE)))
    assert code == 0 and out.startswith("imported ") and BUSYBOX_IMAGE in out

    code, out, _ = _run(capsys, "image", "ls", "--json")
    (listed,) = json.loads(out)  # one image (the same config) under three names
    assert set(listed["names"]) == {
        ref,
        "docker.io/cli/busybox:1",
        "docker.io/orchard-test/busybox:latest",
    }
    assert listed["config"]["cmd"] == ["/bin/sh"]
    code, out, _ = _run(capsys, "image", "tag", "orchard-test/busybox", "mine:2")
    assert code == 0 and out.startswith("mine:2 -> ")
    code, out, _ = _run(capsys, "image", "ls")
    assert "docker.io/library/mine:2" in out and listed["id"][7:19] in out

    code, out, _ = _run(capsys, "image", "rm", listed["id"][7:19])
    assert code == 0 and "removed" in out
    code, out, _ = _run(capsys, "image", "ls", "--json")
    assert json.loads(out) == []
    code, out, _ = _run(capsys, "image", "prune")
    assert code == 0 and out.startswith("removed ") and "freed" in out
    assert list((tmp_path / "state" / "image-store" / "blobs" / "sha256").iterdir()) == []

    code, _, err = _run(capsys, "image", "rm", "nothing")
    assert code == 1 and "no image 'nothing'" in err
    code, _, err = _run(capsys, "image", "pull", "Not A Reference")
    assert code == 1 and "Not A Reference" in err
    code, _, err = _run(capsys, "image", "import", str(tmp_path / "missing.tar"))
    assert code == 1 and "missing.tar" in err
