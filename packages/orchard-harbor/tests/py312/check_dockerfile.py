"""Pure-logic checks of the Dockerfile replay plan, run with the 3.12 venv's Python.

Not a pytest module (the suite runs on 3.11 and must not import the provider):
``test_harbor_orchard.py::test_dockerfile_replay_plan`` runs its ``check_*`` functions
with ``tests/py312_checks.py``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from orchard_harbor.dockerfile import (
    CopyStep,
    RunStep,
    UnsupportedDockerfile,
    WorkdirStep,
    plan,
)


def _context(dockerfile: str, files: dict[str, str] | None = None) -> Path:
    root = Path(tempfile.mkdtemp(prefix="orchard-dockerfile-")) / "context"
    root.mkdir()
    (root.parent / "secret").write_text("outside the context")
    (root / "escape").symlink_to(root.parent / "secret")
    (root / "Dockerfile").write_text(dockerfile)
    for name, text in (files or {}).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root / "Dockerfile"


def _refused(dockerfile: str, fragment: str, files: dict[str, str] | None = None) -> None:
    try:
        plan(_context(dockerfile, files))
    except UnsupportedDockerfile as exc:
        assert fragment in str(exc), str(exc)
    else:
        raise AssertionError(f"accepted: {dockerfile!r}")


def check_steps_in_order_with_their_context() -> None:
    path = _context(
        "ARG TAG=bookworm\nFROM debian:${TAG}\nARG WHAT=baked\nENV PLACE=/opt \\\n    MODE=x\n"
        "WORKDIR /srv\nWORKDIR site\nCOPY a.txt data/ ./\n"
        'RUN echo $WHAT > "$PLACE/out"\nRUN ["python3", "-c", "print(1)"]\nUSER nobody\n'
        'CMD ["bash"]\nEXPOSE 80\n',
        {"a.txt": "a", "data/b.txt": "b"},
    )
    result = plan(path)
    assert result.base_image == "debian:bookworm", result.base_image
    assert result.env == {"PLACE": "/opt", "MODE": "x"}, result.env
    assert result.workdir == "/srv/site" and result.user == "nobody"
    context = path.parent.resolve()
    env = {"WHAT": "baked", "PLACE": "/opt", "MODE": "x"}
    assert result.steps == [
        WorkdirStep("/srv"),
        WorkdirStep("/srv/site"),
        CopyStep(context / "a.txt", "/srv/site/a.txt"),
        CopyStep(context / "data", "/srv/site"),
        RunStep('echo $WHAT > "$PLACE/out"', "/srv/site", env),
        RunStep(["python3", "-c", "print(1)"], "/srv/site", env),
    ], result.steps


def check_a_single_file_copy_keeps_its_target_name() -> None:
    path = _context("FROM x\nCOPY a.txt /etc/renamed.conf\n", {"a.txt": "a"})
    assert plan(path).steps == [CopyStep(path.parent.resolve() / "a.txt", "/etc/renamed.conf")]


def check_the_whole_context_can_be_copied() -> None:
    for source in (".", "./", "/"):
        path = _context(f"FROM x\nWORKDIR /app\nCOPY {source} .\n")
        assert plan(path).steps[-1] == CopyStep(path.parent.resolve(), "/app"), source


def check_what_a_replay_cannot_do_is_refused() -> None:
    _refused("FROM a AS one\nFROM b\nCOPY --from=one /x /x\n", "multi-stage")
    _refused("FROM a\nCOPY --from=other /x /x\n", "--from")
    _refused("FROM a\nADD https://example.com/x /x\n", "URLs")
    _refused("FROM a\nADD pack.tar.gz /x/\n", "archives", {"pack.tar.gz": "not really"})
    _refused("FROM a\nCOPY ../secret /x\n", "outside the build context")
    _refused("FROM a\nCOPY escape /x\n", "outside the build context")
    _refused("FROM a\nCOPY missing.txt /x\n", "not in the build context")
    _refused("RUN true\n", "before FROM")
    _refused("ARG X=1\n", "no FROM")
