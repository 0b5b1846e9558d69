"""A task's Dockerfile as a replay plan, for backends that cannot build images.

Orchard's image store imports and pulls images but has no builder, so on the local and
Kubernetes backends a Dockerfile task is *replayed*: the sandbox starts from the ``FROM``
image and the provider performs each step in it (``RUN`` as a command with the build's
``ENV``/``ARG`` values and the current ``SHELL``, ``COPY``/``ADD`` as uploads from the build
context less what ``.dockerignore`` leaves out, ``WORKDIR`` as ``mkdir -p``), leaving the
same filesystem a build would. The image's runtime settings (the ``ENV`` values, the last
``WORKDIR``) become the sandbox's once the replay is done. Parsing (continuations, quoting,
variable substitution, per-line build context) is ``dockerfile-parse``'s, seeded with the
``FROM`` image's own environment so ``ENV PATH=/x:$PATH`` extends the image's ``PATH``.

Refused with :class:`UnsupportedDockerfile`: multi-stage builds, ``COPY --from``, ``ADD``
of URLs or archives (Docker would fetch or unpack them), sources outside the context,
heredocs, and ``RUN --mount`` of anything but a build cache (secrets, SSH agents and bind
mounts have no replay). ``USER`` is recorded (the replay runs as the image's user);
``CMD``, ``ENTRYPOINT``, ``EXPOSE``, ``LABEL``, ``VOLUME``, ``HEALTHCHECK``, ``STOPSIGNAL``
and ``ONBUILD`` do not change the filesystem and are skipped.
"""

from __future__ import annotations

import io
import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dockerfile_parse import DockerfileParser
from dockerfile_parse.parser import image_from
from dockerfile_parse.util import WordSplitter

from .dockerignore import IgnoreRules

__all__ = [
    "CopyStep",
    "ReplayPlan",
    "RunStep",
    "UnsupportedDockerfile",
    "WorkdirStep",
    "plan",
]

_SKIPPED = {
    "CMD",
    "ENTRYPOINT",
    "EXPOSE",
    "LABEL",
    "MAINTAINER",
    "VOLUME",
    "HEALTHCHECK",
    "STOPSIGNAL",
    "ONBUILD",
    "COMMENT",
}
_ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
_DEFAULT_SHELL: tuple[str, ...] = ("/bin/sh", "-c")
_HEREDOC = re.compile(
    r"^\s*(RUN|COPY|ADD)\b[^\n]*(?<!<)<<(?!<)-?\s*[\"']?[A-Za-z_][A-Za-z0-9_]*", re.I | re.M
)
_COPY_FLAGS = ("--chmod", "--chown", "--link", "--exclude")


class UnsupportedDockerfile(ValueError):
    """The Dockerfile uses something a replay cannot reproduce (the message says what)."""


@dataclass(frozen=True)
class RunStep:
    """``RUN``: a shell command (a string, run by ``shell``) or an argv, in ``cwd``, with
    ``env``: what the build's ``ENV`` and ``ARG`` values add to the image's environment."""

    command: str | list[str]
    cwd: str
    env: dict[str, str]
    shell: tuple[str, ...] = _DEFAULT_SHELL

    def argv(self) -> list[str]:
        """The command as an argv (the shell form through the step's ``SHELL``)."""
        if isinstance(self.command, list):
            return list(self.command)
        return [*self.shell, self.command]


@dataclass(frozen=True)
class CopyStep:
    """``COPY``/``ADD`` of one context path (file or directory) to an absolute target.

    ``into_existing_dir``: a single file whose target has no trailing slash goes *into*
    the target when the image already has a directory there (Docker's rule), else it is
    the file's new name. ``mode`` (``--chmod``, else the source's permission bits for a
    file) and ``owner`` (``--chown``) apply to what was copied. ``ignore`` holds the
    ``.dockerignore`` and ``--exclude`` rules that leave parts of a directory source out.
    """

    source: Path
    target: str
    into_existing_dir: bool = False
    mode: int | None = None
    owner: str | None = None
    ignore: IgnoreRules = field(default_factory=IgnoreRules)
    context: Path | None = None


@dataclass(frozen=True)
class WorkdirStep:
    """``WORKDIR``: the directory is created."""

    path: str


Step = RunStep | CopyStep | WorkdirStep


@dataclass(frozen=True)
class ReplayPlan:
    """The base image, the steps in order, and the image's runtime settings: ``env`` is
    what the Dockerfile's ``ENV`` lines set (beside the base image's own environment)."""

    base_image: str
    steps: list[Step] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    user: str | None = None


def _substitute(value: str, args: Mapping[str, str], envs: Mapping[str, str]) -> str:
    return str(WordSplitter(value, args=dict(args), envs=dict(envs)).dequote())


def _words(value: str, args: Mapping[str, str], envs: Mapping[str, str]) -> list[str]:
    return list(WordSplitter(value, args=dict(args), envs=dict(envs)).split(dequote=True))


def _json_form(value: str) -> list[str] | None:
    text = value.strip()
    if not text.startswith("["):
        return None
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    if isinstance(parsed, list) and all(isinstance(item, str) for item in parsed):
        return parsed
    return None


def _leading_flags(value: str) -> tuple[list[str], str]:
    """``--name=value`` words before an instruction's arguments, and the rest."""
    flags: list[str] = []
    rest = value.lstrip()
    while rest.startswith("--"):
        word, _, rest = rest.partition(" ")
        flags.append(word)
        rest = rest.lstrip()
    return flags, rest


def _check_run_flags(flags: list[str]) -> None:
    for flag in flags:
        name, _, setting = flag.partition("=")
        if name == "--mount":
            kind = dict(part.partition("=")[::2] for part in setting.split(",") if "=" in part).get(
                "type", "bind"
            )
            if kind != "cache":  # a cache only speeds a build up; running without it is the same
                raise UnsupportedDockerfile(
                    f"RUN {flag}: a {kind} mount is not replayed (only type=cache is)"
                )
        elif name == "--network":
            if setting not in ("default", "none"):
                raise UnsupportedDockerfile(f"RUN {flag}: only default and none are replayed")
        else:
            raise UnsupportedDockerfile(f"RUN {flag}: not replayed")


def _copy_flags(instruction: str, flags: list[str]) -> tuple[int | None, str | None, list[str]]:
    mode: int | None = None
    owner: str | None = None
    excludes: list[str] = []
    for flag in flags:
        name, _, setting = flag.partition("=")
        if name.startswith("--from"):
            raise UnsupportedDockerfile(f"{instruction} --from needs a multi-stage build")
        if name not in _COPY_FLAGS:
            raise UnsupportedDockerfile(f"{instruction} {flag}: not replayed")
        if name == "--chmod":
            try:
                mode = int(setting, 8)
            except ValueError:
                raise UnsupportedDockerfile(
                    f"{instruction} {flag}: only an octal mode is replayed"
                ) from None
        elif name == "--chown":
            owner = setting
        elif name == "--exclude":
            excludes.append(setting)
    return mode, owner, excludes


def _copy_steps(
    instruction: str,
    value: str,
    context: Path,
    cwd: str,
    args: Mapping[str, str],
    envs: Mapping[str, str],
) -> list[CopyStep]:
    flags, rest = _leading_flags(value)
    json_form = _json_form(rest)
    if json_form is not None:
        words = [_substitute(word, args, envs) for word in json_form]
    else:
        words = _words(rest, args, envs)
    mode, owner, excludes = _copy_flags(instruction, flags)
    if len(words) < 2:
        raise UnsupportedDockerfile(f"{instruction} {value!r}: a source and a target are needed")
    *sources, target = words
    named_dir = target.endswith(("/", "/.")) or target == "." or len(sources) > 1
    target = posixpath.normpath(posixpath.join(cwd, target))
    root = context.resolve()
    ignore = IgnoreRules.of_context(root, tuple(excludes))
    steps = []
    for pattern in sources:
        if instruction == "ADD" and "://" in pattern:
            raise UnsupportedDockerfile(f"ADD {pattern}: fetching URLs is not replayed")
        relative = posixpath.normpath(pattern.lstrip("/"))
        try:
            matches = [root] if relative == "." else sorted(root.glob(relative))
        except (ValueError, IndexError, AttributeError) as exc:  # patterns pathlib rejects
            raise UnsupportedDockerfile(f"{instruction} {pattern}: {exc}") from exc
        matches = [m for m in matches if m == root or not ignore.excludes(_rel(m, root))]
        if not matches:
            raise UnsupportedDockerfile(f"{instruction} {pattern}: not in the build context")
        named_dir = named_dir or len(matches) > 1
        for match in matches:
            resolved = match.resolve()
            if resolved != root and root not in resolved.parents:
                raise UnsupportedDockerfile(f"{instruction} {pattern}: outside the build context")
            if instruction == "ADD" and resolved.name.endswith(_ARCHIVE_SUFFIXES):
                raise UnsupportedDockerfile(f"ADD {pattern}: unpacking archives is not replayed")
            if resolved.is_dir():
                steps.append(
                    CopyStep(resolved, target, mode=mode, owner=owner, ignore=ignore, context=root)
                )
            elif named_dir:
                name = posixpath.join(target, resolved.name)
                steps.append(CopyStep(resolved, name, mode=mode, owner=owner))
            else:
                steps.append(
                    CopyStep(resolved, target, into_existing_dir=True, mode=mode, owner=owner)
                )
    return steps


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix() if path != root else "."


def _shell(value: str) -> tuple[str, ...]:
    argv = _json_form(value)
    if not argv:
        raise UnsupportedDockerfile(f"SHELL {value!r}: the JSON form is required")
    return tuple(argv)


@dataclass
class _Replay:
    """The state of a walk over the Dockerfile's instructions, one method per kind."""

    dockerfile: Path
    supplied: dict[str, str]
    cwd: str
    image: str | None = None
    steps: list[Step] = field(default_factory=list)
    declared: dict[str, str] = field(default_factory=dict)  # set by ENV lines
    workdir: str | None = None
    user: str | None = None
    shell: tuple[str, ...] = _DEFAULT_SHELL
    before_args: dict[str, str] = field(default_factory=dict)  # ARGs before FROM
    unset_args: set[str] = field(default_factory=set)  # ARG NAME without any value

    def from_(self, value: str) -> None:
        named = image_from(value)[0]
        if named is None:
            raise UnsupportedDockerfile(f"{self.dockerfile}: FROM {value!r} names no image")
        self.image = WordSplitter(named, args=self.before_args).dequote()

    def arg(self, value: str, now_args: Mapping[str, str]) -> None:
        for word in value.split():
            name = word.partition("=")[0]
            if "=" not in word and name not in self.supplied:
                self.unset_args.add(name)
            else:
                self.unset_args.discard(name)
        if self.image is None:
            self.before_args.update(now_args)

    def env(self, envs: Mapping[str, str], now_envs: Mapping[str, str]) -> None:
        self.declared.update({k: v for k, v in now_envs.items() if envs.get(k) != v})

    def workdir_(self, value: str, args: Mapping[str, str], envs: Mapping[str, str]) -> None:
        self.cwd = posixpath.normpath(posixpath.join(self.cwd, _substitute(value, args, envs)))
        self.workdir = self.cwd
        self.steps.append(WorkdirStep(self.cwd))

    def run(self, value: str, args: Mapping[str, str]) -> None:
        flags, rest = _leading_flags(value)
        _check_run_flags(flags)
        command: str | list[str] = _json_form(rest) or rest
        set_args = {k: v for k, v in args.items() if k not in self.unset_args}
        self.steps.append(RunStep(command, self.cwd, {**set_args, **self.declared}, self.shell))

    def instruction(
        self,
        instruction: str,
        value: str,
        args: Mapping[str, str],
        envs: Mapping[str, str],
        now: Any,
    ) -> None:
        """Apply one instruction; ``args``/``envs`` are the values before it, ``now`` the
        parser's context after it."""
        if instruction == "FROM":
            self.from_(value)
        elif instruction == "ARG":
            self.arg(value, now.args)
        elif self.image is None:
            raise UnsupportedDockerfile(f"{self.dockerfile}: {instruction} before FROM")
        elif instruction == "ENV":
            self.env(envs, now.envs)
        elif instruction == "WORKDIR":
            self.workdir_(value, args, envs)
        elif instruction == "RUN":
            self.run(value, args)
        elif instruction in ("COPY", "ADD"):
            self.steps += _copy_steps(
                instruction, value, self.dockerfile.parent, self.cwd, args, envs
            )
        elif instruction == "USER":
            self.user = _substitute(value, args, envs)
        elif instruction == "SHELL":
            self.shell = _shell(value)
        elif instruction not in _SKIPPED:
            raise UnsupportedDockerfile(f"{self.dockerfile}: unknown instruction {instruction}")


def plan(
    dockerfile: Path,
    build_args: Mapping[str, str] | None = None,
    base_env: Mapping[str, str] | None = None,
    base_workdir: str = "/",
) -> ReplayPlan:
    """The replay plan of ``dockerfile``, whose directory is the build context.

    ``base_env`` and ``base_workdir`` are the ``FROM`` image's environment and working
    directory (read from a sandbox of it): ``$VAR`` references and relative ``WORKDIR``
    lines resolve against them as in a build. Without them, the plan still names the base
    image (:attr:`ReplayPlan.base_image`), which is what a first call is for.
    """
    text = dockerfile.read_bytes()
    heredoc = _HEREDOC.search(text.decode(errors="replace"))
    if heredoc:
        raise UnsupportedDockerfile(
            f"{dockerfile}: heredocs ({heredoc.group(0).strip()!r}) are not replayed"
        )
    supplied = dict(build_args or {})
    base = dict(base_env or {})
    parser = DockerfileParser(fileobj=io.BytesIO(text), build_args=supplied, parent_env=base)
    structure = parser.structure
    contexts = parser.context_structure
    if parser.is_multistage:
        raise UnsupportedDockerfile(f"{dockerfile}: multi-stage builds are not replayed")
    walk = _Replay(dockerfile, supplied, cwd=base_workdir or "/")
    for index, line in enumerate(structure):
        previous = contexts[index - 1] if index else None
        args = dict(previous.args) if previous else {}
        envs = dict(previous.envs) if previous else dict(base)
        walk.instruction(line["instruction"].upper(), line["value"], args, envs, contexts[index])
    if walk.image is None:
        raise UnsupportedDockerfile(f"{dockerfile}: no FROM")
    return ReplayPlan(
        base_image=walk.image,
        steps=walk.steps,
        env=walk.declared,
        workdir=walk.workdir,
        user=walk.user,
    )
