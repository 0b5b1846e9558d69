"""A task's Dockerfile as a replay plan, for backends that cannot build images.

Orchard's image store imports and pulls images but has no builder, so on the local and
Kubernetes backends a Dockerfile task is *replayed*: the sandbox starts from the ``FROM``
image and the provider performs each step in it (``RUN`` as a command with the build's
``ENV``/``ARG`` values, ``COPY``/``ADD`` as uploads from the build context, ``WORKDIR`` as
``mkdir -p``), leaving the same filesystem a build would. The image's runtime settings
(``ENV``, the last ``WORKDIR``) become the sandbox's. Parsing (continuations, quoting,
variable substitution, per-line build context) is ``dockerfile-parse``'s.

Refused with :class:`UnsupportedDockerfile`: multi-stage builds, ``COPY --from``, ``ADD``
of URLs or archives (Docker would fetch or unpack them), and sources outside the context.
``USER`` is recorded (commands run as the sandbox's root); ``CMD``, ``ENTRYPOINT``,
``EXPOSE``, ``LABEL``, ``VOLUME``, ``HEALTHCHECK``, ``STOPSIGNAL``, ``SHELL`` and
``ONBUILD`` do not change the filesystem and are skipped.
"""

from __future__ import annotations

import io
import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dockerfile_parse import DockerfileParser
from dockerfile_parse.parser import image_from
from dockerfile_parse.util import WordSplitter

__all__ = ["CopyStep", "ReplayPlan", "RunStep", "UnsupportedDockerfile", "WorkdirStep", "plan"]

_SKIPPED = {
    "CMD",
    "ENTRYPOINT",
    "EXPOSE",
    "LABEL",
    "MAINTAINER",
    "VOLUME",
    "HEALTHCHECK",
    "STOPSIGNAL",
    "SHELL",
    "ONBUILD",
    "COMMENT",
}
_ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


class UnsupportedDockerfile(ValueError):
    """The Dockerfile uses something a replay cannot reproduce (the message says what)."""


@dataclass(frozen=True)
class RunStep:
    """``RUN``: a shell command (a string) or an argv, with the build's environment."""

    command: str | list[str]
    cwd: str
    env: dict[str, str]


@dataclass(frozen=True)
class CopyStep:
    """``COPY``/``ADD`` of one context path (file or directory) to an absolute target."""

    source: Path
    target: str


@dataclass(frozen=True)
class WorkdirStep:
    """``WORKDIR``: the directory is created."""

    path: str


Step = RunStep | CopyStep | WorkdirStep


@dataclass(frozen=True)
class ReplayPlan:
    """The base image, the steps in order, and the image's runtime settings."""

    base_image: str
    steps: list[Step] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    user: str | None = None


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


def _copy_steps(
    instruction: str,
    value: str,
    context: Path,
    cwd: str,
    args: Mapping[str, str],
    envs: Mapping[str, str],
) -> list[CopyStep]:
    words = _json_form(value) or _words(value, args, envs)
    flags = [w for w in words if w.startswith("--")]
    paths = [w for w in words if not w.startswith("--")]
    if any(flag.startswith("--from") for flag in flags):
        raise UnsupportedDockerfile(f"{instruction} --from needs a multi-stage build")
    if len(paths) < 2:
        raise UnsupportedDockerfile(f"{instruction} {value!r}: a source and a target are needed")
    *sources, target = paths
    into_dir = target.endswith(("/", "/.")) or target == "." or len(sources) > 1
    target = posixpath.normpath(posixpath.join(cwd, target))
    root = context.resolve()
    steps = []
    for pattern in sources:
        if instruction == "ADD" and "://" in pattern:
            raise UnsupportedDockerfile(f"ADD {pattern}: fetching URLs is not replayed")
        relative = posixpath.normpath(pattern.lstrip("/"))
        try:
            matches = [root] if relative == "." else sorted(root.glob(relative))
        except (ValueError, IndexError, AttributeError) as exc:  # patterns pathlib rejects
            raise UnsupportedDockerfile(f"{instruction} {pattern}: {exc}") from exc
        if not matches:
            raise UnsupportedDockerfile(f"{instruction} {pattern}: not in the build context")
        into_dir = into_dir or len(matches) > 1
        for match in matches:
            resolved = match.resolve()
            if resolved != root and root not in resolved.parents:
                raise UnsupportedDockerfile(f"{instruction} {pattern}: outside the build context")
            if instruction == "ADD" and resolved.name.endswith(_ARCHIVE_SUFFIXES):
                raise UnsupportedDockerfile(f"ADD {pattern}: unpacking archives is not replayed")
            if resolved.is_dir():
                steps.append(CopyStep(resolved, target))
            else:
                name = posixpath.join(target, resolved.name) if into_dir else target
                steps.append(CopyStep(resolved, name))
    return steps


def plan(dockerfile: Path, build_args: Mapping[str, str] | None = None) -> ReplayPlan:
    """The replay plan of ``dockerfile``, whose directory is the build context."""
    source = io.BytesIO(dockerfile.read_bytes())
    parser = DockerfileParser(fileobj=source, build_args=dict(build_args or {}))
    structure = parser.structure
    contexts = parser.context_structure
    if parser.is_multistage:
        raise UnsupportedDockerfile(f"{dockerfile}: multi-stage builds are not replayed")
    base: str | None = None
    steps: list[Step] = []
    env: dict[str, str] = {}
    cwd = "/"
    workdir: str | None = None
    user: str | None = None
    before_args: dict[str, str] = {}
    for index, line in enumerate(structure):
        instruction, value = line["instruction"].upper(), line["value"]
        previous = contexts[index - 1] if index else None
        args = dict(previous.args) if previous else {}
        envs = dict(previous.envs) if previous else {}
        if instruction == "FROM":
            image = image_from(value)[0]
            if image is None:
                raise UnsupportedDockerfile(f"{dockerfile}: FROM {value!r} names no image")
            base = WordSplitter(image, args=before_args).dequote()
        elif instruction == "ARG" and base is None:
            before_args.update(contexts[index].args)
        elif base is None:
            raise UnsupportedDockerfile(f"{dockerfile}: {instruction} before FROM")
        elif instruction == "ENV":
            env = dict(contexts[index].envs)
        elif instruction == "WORKDIR":
            cwd = posixpath.normpath(
                posixpath.join(cwd, WordSplitter(value, args=args, envs=envs).dequote())
            )
            workdir = cwd
            steps.append(WorkdirStep(cwd))
        elif instruction == "RUN":
            command: str | list[str] = _json_form(value) or value
            steps.append(RunStep(command, cwd, {**args, **envs}))
        elif instruction in ("COPY", "ADD"):
            steps += _copy_steps(instruction, value, dockerfile.parent, cwd, args, envs)
        elif instruction == "USER":
            user = WordSplitter(value, args=args, envs=envs).dequote()
        elif instruction not in _SKIPPED and instruction != "ARG":
            raise UnsupportedDockerfile(f"{dockerfile}: unknown instruction {instruction}")
    if base is None:
        raise UnsupportedDockerfile(f"{dockerfile}: no FROM")
    return ReplayPlan(base_image=base, steps=steps, env=env, workdir=workdir, user=user)
