"""What a local sandbox's ``image`` names, as an unpacked root filesystem tree.

``host`` is the machine's own root (shown through ``host_view``); an absolute path is a
root filesystem directory or a tar archive of one, allowed only under a directory the
operator named (``local.rootfs``); anything else is an image reference
(``python:3.11-slim``, ``127.0.0.1:5000/team/tool@sha256:…``) looked up in the image
store under the state dir, pulled into it first when it is missing and pulling is on.
Concurrent creates of one missing image wait on a single pull.

A stored image's config decides how commands run, as on Docker: its ``Env`` under the
request's, its ``WorkingDir`` as their directory (else ``/workspace``, as on every
backend), its ``User`` (a name is looked up in the image's own ``/etc/passwd`` and
``/etc/group``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import attrs

from orchard_env_agent import anchored

from ...images import (
    BadImage,
    ImageConfig,
    ImageError,
    ImageNotFound,
    ImageStore,
    StoredImage,
    normalize_reference,
)
from ...images.registry import canonical_registry
from ...settings import Settings
from ..base import BackendError, ImageUnavailable
from .rootfs import RootfsDirs

_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOW_TO_GET = (
    "`orchard-env image pull REF` fetches it from a registry, `orchard-env image import "
    "FILE` loads a `docker save` archive or an OCI layout, `orchard-env image ls` lists "
    "what the store holds"
)


@attrs.frozen
class ImageSource:
    """An image resolved for one create: its tree and, from the store, its config."""

    path: Path  # "/" for ``host``
    image: StoredImage | None = None
    fd: int | None = None  # a directory named by path, open: the root is made from it

    @property
    def is_host(self) -> bool:
        return self.path == Path("/")

    def close(self) -> None:
        """Close ``fd`` (once the root is made, or the create failed)."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)


@attrs.frozen
class RunAs:
    """How a stored image's commands run: user (uid, gid inside), home, env, directory."""

    uid: int
    gid: int
    home: str
    env: dict[str, str]
    workdir: str


class LocalImages:
    """Resolves ``image`` strings for the local backend (see the module doc)."""

    def __init__(self, settings: Settings, state: Path) -> None:
        self._settings = settings
        self._state = Path(os.path.realpath(state))
        self.store = ImageStore(settings.image_store_dir)
        self.rootfs_dirs = RootfsDirs(
            settings.local.rootfs_dirs, [self._state, self.store.root], state / "images"
        )
        self._pulls: dict[str, asyncio.Future[StoredImage]] = {}

    async def source(self, image: str) -> ImageSource:
        """The tree ``image`` names; raises ``ImageUnavailable`` when it has none."""
        if image == "host":
            return ImageSource(Path("/"))
        if image.startswith("/"):
            opened = await asyncio.to_thread(self.rootfs_dirs.open, image)
            return ImageSource(opened.path, fd=opened.fd)
        try:
            stored = await asyncio.to_thread(self.store.resolve, image)
        except ValueError as exc:
            raise ImageUnavailable("invalid", f"invalid image reference {image!r}: {exc}") from None
        if stored is None:
            stored = await self._pull(image)
        try:
            tree = await asyncio.to_thread(self.store.rootfs, stored)
        except ImageError as exc:
            raise BackendError(f"cannot unpack image {image!r}: {exc}") from exc
        return ImageSource(tree, stored)

    async def _pull(self, image: str) -> StoredImage:
        if self._settings.local.image_pull == "never":
            raise ImageUnavailable(
                "not_found",
                f"image {image!r} is not in this server's image store and pulling is off "
                f"(--image-pull never): {HOW_TO_GET}",
            )
        try:
            key = normalize_reference(image)
        except ValueError as exc:
            raise ImageUnavailable("invalid", f"invalid image reference {image!r}: {exc}") from None
        registry = key.split("/", 1)[0]
        if not self._may_pull_from(registry):
            raise ImageUnavailable(
                "invalid",
                f"image {image!r}: this server does not pull from registry {registry!r} for "
                "API requests (the operator allows registries with --pull-registry or "
                "ORCHARD_ENV_PULL_REGISTRIES); an operator can pull the image beforehand "
                f"with `orchard-env image pull {key}`",
            )
        pull = self._pulls.get(key)
        if pull is None:
            pull = asyncio.ensure_future(
                asyncio.to_thread(
                    self.store.pull,
                    image,
                    insecure=registry in self._settings.local.insecure_registries,
                    mirrors=self._settings.local.registry_mirrors,
                    allow_private=False,  # a tenant's reference: public hosts or named ones
                    timeout=self._settings.local.pull_timeout_s,
                )
            )
            self._pulls[key] = pull
            pull.add_done_callback(lambda _: self._pulls.pop(key, None))
        try:
            return await asyncio.shield(pull)
        except ImageNotFound as exc:
            raise ImageUnavailable(
                "not_found", f"image {image!r} is neither stored nor in its registry: {exc}"
            ) from None
        except BadImage as exc:
            raise ImageUnavailable("pull_failed", f"cannot pull image {image!r}: {exc}") from None
        except ImageError as exc:
            raise ImageUnavailable(
                "pull_failed", f"cannot pull image {image!r}: {exc}. {HOW_TO_GET}"
            ) from None

    def _may_pull_from(self, registry: str) -> bool:
        """Whether a create may pull from ``registry``: one of ``pull_registries``, or one
        the operator named as insecure or gave a mirror. Decided before any connection."""
        settings = self._settings
        named = (
            *settings.local.pull_registries,
            *settings.local.insecure_registries,
            *settings.local.registry_mirrors,
        )
        return canonical_registry(registry) in {canonical_registry(r) for r in named}


def run_as(tree: Path, config: ImageConfig, sandbox_id: str) -> RunAs:
    """Docker's rules for a stored image's commands (blocking: reads its passwd file)."""
    uid, gid, home = _user(tree, config.user)
    env = {"PATH": _PATH, "HOSTNAME": sandbox_id, "HOME": home}
    for item in config.env:
        name, sep, value = item.partition("=")
        if sep and name:
            env[name] = value
    return RunAs(uid=uid, gid=gid, home=home, env=env, workdir=config.working_dir or "/workspace")


def _user(tree: Path, spec: str) -> tuple[int, int, str]:
    """(uid, gid, home) of a config ``User``: ``name``, ``uid``, ``name:group``, ``uid:gid``."""
    name, _, group = spec.partition(":")
    passwd = _table(tree, "etc/passwd")
    uid, gid, home = 0, 0, "/root"
    if name:
        entry = next((e for e in passwd if name in (e[0], e[2]) and len(e) >= 6), None)
        if entry is not None:
            uid, gid, home = int(entry[2]), int(entry[3]), entry[5] or "/"
        elif name.isdigit():
            uid, gid, home = int(name), 0, "/"
        else:
            raise BackendError(f"the image's user {name!r} is not in its /etc/passwd")
    else:
        entry = next((e for e in passwd if e[2] == "0" and len(e) >= 6), None)
        home = entry[5] if entry is not None and entry[5] else "/root"
    if group:
        found = next((e for e in _table(tree, "etc/group") if group in (e[0], e[2])), None)
        if found is not None:
            gid = int(found[2])
        elif group.isdigit():
            gid = int(group)
        else:
            raise BackendError(f"the image's group {group!r} is not in its /etc/group")
    if not (0 <= uid < 65536 and 0 <= gid < 65536):
        raise BackendError(f"the image's user {spec!r} is outside a sandbox's ids (0..65535)")
    return uid, gid, home


def _table(tree: Path, name: str) -> list[list[str]]:
    """The rows of a passwd-style file of the image (read inside its tree: a link in the
    image cannot lead this read out of it); rows whose third field is a number only."""
    with contextlib.suppress(OSError, ValueError):
        fd = os.open(tree, os.O_PATH | os.O_DIRECTORY)
        try:
            text = anchored.read_file(fd, name).decode(errors="replace")
        finally:
            os.close(fd)
        rows = [line.split(":") for line in text.splitlines()]
        return [
            r for r in rows if len(r) >= 3 and r[2].isdigit() and (len(r) < 6 or r[3].isdigit())
        ]
    return []
