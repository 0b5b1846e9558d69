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
    IgnoreRules,
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
        CopyStep(context / "data", "/srv/site", context=context),
        RunStep('echo $WHAT > "$PLACE/out"', "/srv/site", env),
        RunStep(["python3", "-c", "print(1)"], "/srv/site", env),
    ], result.steps


def check_a_single_file_copy_keeps_its_target_name() -> None:
    path = _context("FROM x\nCOPY a.txt /etc/renamed.conf\n", {"a.txt": "a"})
    source = path.parent.resolve() / "a.txt"
    # into_existing_dir: a build copies *into* /etc/renamed.conf if the image has that dir
    assert plan(path).steps == [CopyStep(source, "/etc/renamed.conf", into_existing_dir=True)]


def check_the_whole_context_can_be_copied() -> None:
    for source in (".", "./", "/"):
        path = _context(f"FROM x\nWORKDIR /app\nCOPY {source} .\n")
        context = path.parent.resolve()
        assert plan(path).steps[-1] == CopyStep(context, "/app", context=context), source


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


def check_the_base_images_environment_and_workdir_seed_the_build() -> None:
    path = _context("FROM x\nENV PATH=/opt/bin:$PATH\nWORKDIR sub\nRUN make\n")
    result = plan(path, base_env={"PATH": "/usr/bin:/bin", "HOME": "/root"}, base_workdir="/w")
    assert result.env == {"PATH": "/opt/bin:/usr/bin:/bin"}, result.env  # HOME stays the image's
    assert result.steps == [
        WorkdirStep("/w/sub"),
        RunStep("make", "/w/sub", {"PATH": "/opt/bin:/usr/bin:/bin"}),
    ], result.steps


def check_a_run_sees_only_what_was_set_before_it() -> None:
    path = _context(
        "FROM x\nARG NOVALUE\nARG WITH=1\nRUN first\nENV LATER=yes\nARG GIVEN\nRUN second\n"
    )
    first, second = plan(path, build_args={"GIVEN": "g"}).steps
    assert first == RunStep("first", "/", {"WITH": "1"}), first  # NOVALUE is unset, not ""
    assert second == RunStep("second", "/", {"WITH": "1", "GIVEN": "g", "LATER": "yes"}), second


def check_shell_and_run_flags() -> None:
    path = _context(
        "FROM x\nRUN --mount=type=cache,target=/root/.cache --network=none pip install .\n"
        'SHELL ["/bin/bash", "-eo", "pipefail", "-c"]\nRUN a | b\nRUN ["true"]\n'
    )
    cached, piped, exec_form = plan(path).steps
    assert isinstance(cached, RunStep) and cached.argv() == ["/bin/sh", "-c", "pip install ."]
    assert isinstance(piped, RunStep)
    assert piped.argv() == ["/bin/bash", "-eo", "pipefail", "-c", "a | b"], piped
    assert isinstance(exec_form, RunStep) and exec_form.argv() == ["true"]


def check_copy_flags_and_json_substitution() -> None:
    path = _context(
        'FROM x\nARG SRC=a.txt\nCOPY --chmod=755 --chown=app:app ["$SRC", "/dst/"]\n'
        "COPY --link a.txt /plain\n",
        {"a.txt": "a"},
    )
    source = path.parent.resolve() / "a.txt"
    assert plan(path).steps == [
        CopyStep(source, "/dst/a.txt", mode=0o755, owner="app:app"),
        CopyStep(source, "/plain", into_existing_dir=True),
    ]


def check_dockerignore_leaves_files_out() -> None:
    files = {
        "keep.txt": "k",
        "secret.env": "s",
        "logs/a.log": "l",
        "logs/keep.log": "k",
        ".dockerignore": "*.env\nlogs\n!logs/keep.log\n# a comment\n",
    }
    path = _context("FROM x\nCOPY . /app/\n", files)
    (step,) = plan(path).steps
    assert isinstance(step, CopyStep) and step.context == path.parent.resolve()
    rules = step.ignore
    assert rules.excludes("secret.env") and rules.excludes("logs/a.log")
    assert not rules.excludes("logs/keep.log") and not rules.excludes("keep.txt")
    _refused("FROM x\nCOPY secret.env /x\n", "not in the build context", files)
    excluded = plan(_context("FROM x\nCOPY --exclude=*.txt . /app\n", files)).steps[0]
    assert isinstance(excluded, CopyStep) and excluded.ignore.excludes("keep.txt")


def check_dockerignore_patterns() -> None:
    rules = IgnoreRules.parse("**/*.pyc\n/build\ndocs/*.md\n!docs/README.md\nte?t\n[ab].c\n")
    assert rules.excludes("x.pyc") and rules.excludes("a/b/x.pyc")
    assert rules.excludes("build") and rules.excludes("build/out/x")
    assert rules.excludes("docs/guide.md") and not rules.excludes("docs/README.md")
    assert not rules.excludes("docs/sub/guide.md")  # * does not cross a slash
    assert rules.excludes("test") and rules.excludes("a.c") and not rules.excludes("c.c")
    assert not IgnoreRules.parse("")


def check_heredocs_and_unreplayable_flags_are_refused() -> None:
    _refused("FROM a\nRUN <<EOF\necho hi\nEOF\n", "heredocs")
    _refused("FROM a\nRUN --mount=type=secret,id=tok cat /run/secrets/tok\n", "secret mount")
    _refused("FROM a\nRUN --network=host curl x\n", "--network=host")
    _refused("FROM a\nRUN --security=insecure true\n", "not replayed")
    _refused("FROM a\nCOPY --parents a.txt /x/\n", "not replayed", {"a.txt": "a"})
    _refused("FROM a\nSHELL /bin/bash -c\n", "JSON form")
    assert plan(_context('FROM a\nRUN cat <<< "here-string"\n')).steps  # not a heredoc
