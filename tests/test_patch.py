"""apply_patch: git apply, then a 3-way apply, then patch --fuzz; failures say so."""

from __future__ import annotations

import pytest

from orchard_env_client import SandboxClient

pytestmark = pytest.mark.integration

ORIGINAL = "".join(f"line {i}\n" for i in range(1, 21))


@pytest.fixture
def repo(server, image):
    with SandboxClient(base_url=server.url) as client:
        sbx = client.create_sandbox(image)
        sbx.upload_content("/workspace/f.txt", ORIGINAL)
        setup = sbx.exec(
            "git init -q && git -c user.email=t@t -c user.name=t add f.txt && "
            "git -c user.email=t@t -c user.name=t commit -qm init"
        )
        assert setup.succeeded, setup.stderr
        yield sbx
        sbx.delete()


def _diff(old: str, new: str, context_old: str | None = None) -> str:
    return (
        "--- a/f.txt\n+++ b/f.txt\n@@ -9,5 +9,5 @@\n"
        f" line 9\n {context_old or 'line 10'}\n-{old}\n+{new}\n line 12\n line 13\n"
    )


def test_a_clean_patch_applies_with_git(repo):
    result = repo.apply_patch(_diff("line 11", "ELEVEN"))
    assert result.success, result.stderr
    assert "ELEVEN" in repo.download_content("/workspace/f.txt").decode()


def test_a_patch_with_drifted_context_applies_with_fuzz(repo):
    repo.upload_content("/workspace/f.txt", ORIGINAL.replace("line 10\n", "line ten\n"))
    result = repo.apply_patch(_diff("line 11", "ELEVEN"))
    assert result.success, result.stderr
    assert "ELEVEN" in repo.download_content("/workspace/f.txt").decode()


def test_a_patch_that_cannot_apply_fails_and_changes_nothing(repo):
    result = repo.apply_patch(_diff("no such line", "X", context_old="nothing like it"))
    assert not result.success and (result.stderr or result.stdout)  # patch(1) reports on stdout
    assert repo.download_content("/workspace/f.txt").decode() == ORIGINAL


def test_a_patch_against_an_older_commit_applies_with_a_three_way_merge(repo):
    blob = repo.exec("git rev-parse HEAD:f.txt").stdout.strip()
    # The file moves on: the hunk's context (line 10) changes, so a plain apply fails.
    repo.exec(
        "sed -i 's/^line 10$/line ten/' f.txt && "
        "git -c user.email=t@t -c user.name=t commit -qam moved"
    )
    patch = f"diff --git a/f.txt b/f.txt\nindex {blob}..{'1' * 40} 100644\n" + _diff(
        "line 11", "ELEVEN"
    )
    result = repo.apply_patch(patch)
    assert result.success, result.stderr
    content = repo.download_content("/workspace/f.txt").decode()
    assert "line ten\nELEVEN\n" in content
