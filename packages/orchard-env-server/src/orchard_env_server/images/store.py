"""The image store: content-addressed blobs, names, and each image's root unpacked once.

Layout under the root (0700: unpacked trees keep their setuid files and owners)::

    blobs/sha256/<hex>   manifests, configs and layers, each checked against its digest
    refs.json            {"names": {name: {"id", "manifest_digest"}},
                          "images": {id: {"manifest", "manifest_digest", "blobs", ...}}}
    rootfs/<hex>/        an image's layers applied (``<hex>`` of its config digest)
    rootfs/<hex>.lock    held while that tree is unpacked
    tmp/                 blobs being written, partial downloads, trees being unpacked
    refs.lock, gc.lock   refs.json's writers; pulls/imports/unpacks (shared) vs prune

Several processes may share a store: refs.json is replaced atomically under ``refs.lock``,
a tree is unpacked into ``tmp/`` under its lock and renamed into place, and ``prune``
waits (``gc.lock``) until no pull, import or unpack is under way.
"""

from __future__ import annotations

import builtins
import fcntl
import json
import os
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import archive, registry
from .blobs import Blobs
from .errors import BadImage, ImageNotFound, InvalidReference
from .files import Removed, flocked, remove_path, try_flock, write_json
from .layers import LayerStream, RootBuilder
from .model import Manifest, NewImage, ParsedConfig, ProgressCallback, StoredImage
from .reference import parse_reference

_ID = re.compile(r"(sha256:)?([0-9a-f]{12,64})")


class ImageStore:
    """Images under ``root`` (``<state_dir>/image-store``); safe to share between processes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(root, 0o700)
        self._tmp = root / "tmp"
        self._rootfs = root / "rootfs"
        for sub in (self._tmp, self._rootfs):
            sub.mkdir(exist_ok=True, mode=0o700)
        self._blobs = Blobs(root / "blobs", self._tmp)
        self._refs = root / "refs.json"

    # -- names

    def _read(self) -> dict[str, Any]:
        try:
            doc = json.loads(self._refs.read_bytes())
        except FileNotFoundError:
            doc = {}
        doc.setdefault("names", {})
        doc.setdefault("images", {})
        return doc

    def _image(self, doc: dict[str, Any], image_id: str) -> StoredImage:
        record = doc["images"][image_id]
        config = ParsedConfig.parse(self._blobs.read(image_id), f"config {image_id}")
        return StoredImage(
            id=image_id,
            names=tuple(sorted(n for n, e in doc["names"].items() if e["id"] == image_id)),
            manifest_digest=record.get("manifest_digest"),
            config=config.config,
            size_bytes=int(record.get("size_bytes", 0)),
            created=config.created,
        )

    def _find(self, doc: dict[str, Any], ref: str) -> tuple[str | None, str | None]:
        """(name, id) that ``ref`` names: a stored name, else an id or unique id prefix."""
        text = ref.strip()
        id_match = _ID.fullmatch(text)
        if not text.startswith("sha256:"):
            try:
                name = str(parse_reference(text))
            except InvalidReference:
                if id_match is None:
                    raise
                name = None
            if name is not None and name in doc["names"]:
                return name, doc["names"][name]["id"]
        if id_match is not None:
            prefix = "sha256:" + id_match.group(2)
            found = [i for i in doc["images"] if i.startswith(prefix)]
            if len(found) == 1:
                return None, found[0]
        return None, None

    def resolve(self, ref: str) -> StoredImage | None:
        """The image ``ref`` names (a name, ``sha256:<hex>``, or an id prefix of 12+ hex
        digits), or None; ``InvalidReference`` (a ValueError) when it names nothing."""
        doc = self._read()
        _, image_id = self._find(doc, ref)
        return None if image_id is None else self._image(doc, image_id)

    def list(self) -> list[StoredImage]:
        """Every image, newest first."""
        doc = self._read()
        images = [self._image(doc, i) for i in doc["images"]]
        added = {i: r.get("added", 0) for i, r in doc["images"].items()}
        return sorted(images, key=lambda im: (-added[im.id], im.names))

    def tag(self, source: str, target: str) -> StoredImage:
        """Name image ``source`` also ``target`` (a name moves from any image it named)."""
        name = parse_reference(target)
        if name.digest is not None:
            raise InvalidReference(f"{target!r}: a tag cannot hold a digest")
        with flocked(self.root / "refs.lock"):
            doc = self._read()
            _, image_id = self._find(doc, source)
            if image_id is None:
                raise ImageNotFound(f"no image {source!r} in the store")
            old = doc["names"].get(str(name), {})
            manifest_digest = old.get("manifest_digest") if old.get("id") == image_id else None
            doc["names"][str(name)] = {
                "id": image_id,
                "manifest_digest": manifest_digest
                or doc["images"][image_id].get("manifest_digest"),
            }
            self._drop_unnamed(doc, old.get("id"))
            write_json(self._refs, doc)
            return self._image(doc, image_id)

    def remove(self, ref: str) -> StoredImage:
        """Untag name ``ref`` (the image goes with its last name), or remove image ``ref``
        (an id) with all its names. Disk space comes back with ``prune``."""
        with flocked(self.root / "refs.lock"):
            doc = self._read()
            name, image_id = self._find(doc, ref)
            if image_id is None:
                raise ImageNotFound(f"no image {ref!r} in the store")
            image = self._image(doc, image_id)
            if name is not None:
                del doc["names"][name]
                self._drop_unnamed(doc, image_id)
            else:
                for n in image.names:
                    del doc["names"][n]
                del doc["images"][image_id]
            write_json(self._refs, doc)
            return image

    def _drop_unnamed(self, doc: dict[str, Any], image_id: str | None) -> None:
        """An image that lost its last name is gone, unless it came without any."""
        if image_id is None or image_id not in doc["images"]:
            return
        if any(e["id"] == image_id for e in doc["names"].values()):
            return
        if doc["images"][image_id].get("named", True):
            del doc["images"][image_id]

    def _record(self, names: tuple[str, ...], new: NewImage) -> StoredImage:
        with flocked(self.root / "refs.lock"):
            doc = self._read()
            previous = {n: doc["names"][n]["id"] for n in names if n in doc["names"]}
            for n in names:
                doc["names"][n] = {"id": new.config, "manifest_digest": new.manifest_digest}
            doc["images"][new.config] = {
                "manifest": new.manifest,
                "manifest_digest": new.manifest_digest,
                "blobs": list(dict.fromkeys(new.blobs)),
                "size_bytes": new.size_bytes,
                "added": time.time(),
                "named": bool(names) or doc["images"].get(new.config, {}).get("named", False),
            }
            for old in set(previous.values()) - {new.config}:
                self._drop_unnamed(doc, old)
            write_json(self._refs, doc)
            return self._image(doc, new.config)

    # -- getting images

    def pull(
        self,
        ref: str,
        *,
        insecure: bool = False,
        progress: ProgressCallback | None = None,
        mirrors: Mapping[str, str] | None = None,
        allow_private: bool = False,
        timeout: float | None = None,
    ) -> StoredImage:
        """Pull ``ref`` from its registry (or its mirror) and name it ``ref`` (normalized).
        Blocking. ``insecure``: plain http (and unverified https) allowed, and the registry
        reached whatever its address. ``allow_private``: any host may be reached (the
        operator's own pull); else hosts with a loopback, private or other non-public
        address are refused unless the operator named them (an insecure registry, a
        mirror). ``timeout``: seconds the whole pull may take (None: no limit)."""
        parsed = parse_reference(ref)
        with flocked(self.root / "gc.lock", shared=True):
            new = registry.pull(
                parsed,
                self._blobs,
                insecure=insecure,
                mirrors=mirrors,
                progress=progress,
                allow_private=allow_private,
                timeout=timeout,
            )
            return self._record((str(parsed),), new)

    def import_archive(
        self, path: Path, progress: ProgressCallback | None = None
    ) -> builtins.list[StoredImage]:
        """Import a ``docker save`` archive or an OCI layout (a tar file or a directory)."""
        with flocked(self.root / "gc.lock", shared=True):
            found = archive.import_archive(Path(path), self._blobs, progress)
            return [self._record(names, new) for names, new in found]

    # -- trees

    def rootfs(self, image: StoredImage) -> Path:
        """The image's layers applied, unpacked the first time it is asked for (blocking;
        concurrent callers, in any process, wait for one unpack)."""
        final = self._rootfs / image.hex
        if final.is_dir():
            return final
        with (
            flocked(self.root / "gc.lock", shared=True),
            flocked(self._rootfs / f"{image.hex}.lock"),
        ):
            if final.is_dir():
                return final
            record = self._read()["images"].get(image.id)
            if record is None:
                raise ImageNotFound(f"image {image.id} is no longer in the store")
            partial = Path(tempfile.mkdtemp(dir=self._tmp, prefix=f"rootfs-{image.hex[:12]}-"))
            try:
                self._unpack(image.id, record["manifest"], partial)
                os.rename(partial, final)
            except BaseException:
                remove_path(partial, Removed())
                raise
        return final

    def _unpack(self, image_id: str, manifest_digest: str, into: Path) -> None:
        manifest = Manifest.parse(self._blobs.read(manifest_digest))
        config = ParsedConfig.parse(self._blobs.read(image_id))
        if len(config.diff_ids) != len(manifest.layers):
            raise BadImage(f"image {image_id}: layers and the config's diff_ids differ")
        with RootBuilder(into) as builder:
            for layer, diff_id in zip(manifest.layers, config.diff_ids, strict=True):
                what = f"layer {layer.digest[7:19]}"
                try:
                    blob = open(self._blobs.path(layer.digest), "rb")  # noqa: SIM115
                except FileNotFoundError:
                    raise BadImage(f"{what} is missing from the store: pull again") from None
                with blob:
                    stream = LayerStream(blob, what)
                    builder.apply(stream, what)
                    stream.drain()
                if stream.diff_id() != diff_id:
                    raise BadImage(f"{what}: its content is {stream.diff_id()}, not {diff_id}")
            builder.finish()

    # -- disk

    def prune(self) -> tuple[int, int]:
        """Remove blobs and trees no image needs, and leftovers of failed pulls and
        unpacks: (files removed, bytes freed). Waits for pulls and unpacks under way. A
        tree someone holds an flock on (a backend whose sandboxes still use it) stays."""
        removed = Removed()
        with flocked(self.root / "gc.lock"):
            doc = self._read()
            keep = {d for record in doc["images"].values() for d in record.get("blobs", ())}
            keep.update(doc["images"])
            for path in self._blobs.dir.iterdir():
                if f"sha256:{path.name}" not in keep:
                    remove_path(path, removed)
            hexes = {i.split(":", 1)[1] for i in doc["images"]}
            for path in self._rootfs.iterdir():
                stem = path.name.removesuffix(".lock")
                if stem in hexes:
                    continue
                if path.name.endswith(".lock"):
                    path.unlink(missing_ok=True)
                elif self._unused(path):
                    remove_path(path, removed)
            for path in self._tmp.iterdir():
                remove_path(path, removed)
        return removed.files, removed.bytes

    @staticmethod
    def _unused(tree: Path) -> bool:
        try:
            fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return True
        try:
            return try_flock(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
