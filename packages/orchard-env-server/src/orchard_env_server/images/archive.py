"""Import of ``docker save`` archives and OCI image layouts, as tar files or directories.

A ``docker save`` archive has ``manifest.json`` (its ``RepoTags`` name the images); an OCI
layout has ``index.json`` (an ``io.containerd.image.name`` annotation, or an
``org.opencontainers.image.ref.name`` one holding a full reference, names an image; one
holding only a tag does not, and the image is stored by id). Every blob is copied into the
store and checked against its digest; the archive's own paths are only ever read inside it.
"""

from __future__ import annotations

import contextlib
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from orchard_env_agent.anchored import open_at

from .blobs import Blobs
from .errors import BadImage, InvalidReference
from .model import (
    INDEX_TYPES,
    MAX_DOCUMENT_BYTES,
    OCI_CONFIG,
    OCI_LAYER,
    Descriptor,
    Manifest,
    NewImage,
    ParsedConfig,
    ProgressCallback,
    choose_manifest,
    load_json,
    load_json_list,
)
from .reference import normalize_reference

REF_NAME = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"
Imported = tuple[tuple[str, ...], NewImage]


class _Source:
    """Files of an archive (a tar file or a directory), read by their names in it."""

    def exists(self, name: str) -> bool:
        raise NotImplementedError

    def open(self, name: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        raise NotImplementedError

    def read(self, name: str) -> bytes:
        with self.open(name) as fh:
            data = fh.read(MAX_DOCUMENT_BYTES + 1)
        if len(data) > MAX_DOCUMENT_BYTES:
            raise BadImage(f"{name} is larger than {MAX_DOCUMENT_BYTES} bytes")
        return data


class _DirSource(_Source):
    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        os.close(self._fd)

    def exists(self, name: str) -> bool:
        try:
            os.close(open_at(self._fd, name, os.O_PATH))
        except OSError:
            return False
        return True

    @contextlib.contextmanager
    def open(self, name: str) -> Iterator[IO[bytes]]:
        try:
            fd = open_at(self._fd, name, os.O_RDONLY)  # links resolve inside the layout
        except OSError as exc:
            raise BadImage(f"{name}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as fh:
            yield fh


class _TarSource(_Source):
    def __init__(self, path: Path) -> None:
        try:
            self._tf = tarfile.open(path, "r:*")  # noqa: SIM115 (closed by close())
            self._members = {_norm(m.name): m for m in self._tf.getmembers()}
        except (tarfile.TarError, EOFError) as exc:
            raise BadImage(f"{path} is not a readable tar archive: {exc}") from None

    def close(self) -> None:
        self._tf.close()

    def exists(self, name: str) -> bool:
        return name in self._members

    @contextlib.contextmanager
    def open(self, name: str) -> Iterator[IO[bytes]]:
        member = self._members.get(_norm(name))
        try:
            fh = self._tf.extractfile(member) if member is not None else None
        except (KeyError, tarfile.TarError):
            fh = None  # a link to a member that is not there
        if fh is None:
            raise BadImage(f"{name} is not a file of the archive")
        with fh:
            yield fh


def _norm(name: str) -> str:
    return "/".join(p for p in name.split("/") if p not in ("", "."))


def import_archive(
    path: Path, blobs: Blobs, progress: ProgressCallback | None = None
) -> list[Imported]:
    """The images of archive ``path``, their blobs stored: [(names, image)]."""
    if not path.exists():
        raise FileNotFoundError(f"no such file or directory: {path}")
    source: _DirSource | _TarSource = _DirSource(path) if path.is_dir() else _TarSource(path)
    try:
        if source.exists("manifest.json"):
            return _docker_save(source, blobs, progress)
        if source.exists("index.json"):
            return _oci_layout(source, blobs, progress)
        raise BadImage(
            f"{path} is neither a `docker save` archive (manifest.json) "
            "nor an OCI image layout (index.json)"
        )
    finally:
        source.close()


def _docker_save(
    source: _Source, blobs: Blobs, progress: ProgressCallback | None
) -> list[Imported]:
    raw = load_json_list(source.read("manifest.json"), "manifest.json")
    images: list[Imported] = []
    for entry in raw:
        if not isinstance(entry, dict) or not isinstance(entry.get("Config"), str):
            raise BadImage("manifest.json: an entry without a Config")
        layers = entry.get("Layers")
        if not isinstance(layers, list) or not all(isinstance(x, str) for x in layers):
            raise BadImage("manifest.json: an entry without a Layers list")
        config_data = source.read(entry["Config"])
        config = blobs.put_bytes(config_data)
        parsed = ParsedConfig.parse(config_data, entry["Config"])
        if len(parsed.diff_ids) != len(layers):
            raise BadImage(
                f"{entry['Config']}: {len(parsed.diff_ids)} diff_ids for {len(layers)} layers"
            )
        descriptors = [
            _copy_layer(source, name, diff_id, blobs, progress)
            for name, diff_id in zip(layers, parsed.diff_ids, strict=True)
        ]
        names = tuple(_name(tag) for tag in entry.get("RepoTags") or ())
        images.append((names, _record(blobs, config, len(config_data), descriptors, None)))
    return images


def _copy_layer(
    source: _Source, name: str, diff_id: str, blobs: Blobs, progress: ProgressCallback | None
) -> Descriptor:
    """A ``docker save`` layer: an uncompressed tar whose digest is its diff_id (a
    compressed one is checked against its diff_id when it is unpacked)."""
    if blobs.has(diff_id):
        return Descriptor(OCI_LAYER, diff_id, blobs.size(diff_id))
    with source.open(name) as fh:
        total = fh.seek(0, os.SEEK_END)
        fh.seek(0)
        head = fh.read(2)
        digest, size = blobs.put_stream(
            _Prefixed(head, fh), size=total, progress=progress, what=f"layer {diff_id[7:19]}"
        )
    compressed = head == b"\x1f\x8b"
    if not compressed and digest != diff_id:
        raise BadImage(f"{name}: content has digest {digest}, the config says {diff_id}")
    return Descriptor(OCI_LAYER + ("+gzip" if compressed else ""), digest, size)


def _oci_layout(source: _Source, blobs: Blobs, progress: ProgressCallback | None) -> list[Imported]:
    index = load_json(source.read("index.json"), "index.json")
    raw = index.get("manifests")
    if not isinstance(raw, list) or not raw:
        raise BadImage("index.json lists no manifests")
    images: list[Imported] = []
    for item in raw:
        top = Descriptor.parse(item, "index.json entry")
        extra: list[str] = []
        desc = top
        if top.media_type in INDEX_TYPES:
            nested = _blob(source, blobs, top, "nested index")
            desc = choose_manifest(load_json(nested, f"index {top.digest}"), f"index {top.digest}")
            extra.append(top.digest)
        manifest_data = _blob(source, blobs, desc, "manifest")
        manifest = Manifest.parse(manifest_data, f"manifest {desc.digest}")
        config_data = _blob(source, blobs, manifest.config, "config")
        parsed = ParsedConfig.parse(config_data, f"config {manifest.config.digest}")
        if len(parsed.diff_ids) != len(manifest.layers):
            raise BadImage(f"manifest {desc.digest}: layers and the config's diff_ids differ")
        for layer in manifest.layers:
            if "zstd" in layer.media_type:
                raise BadImage(f"layer {layer.digest}: zstd-compressed layers are not supported")
            if not blobs.has(layer.digest):
                with source.open(_blob_path(layer.digest)) as fh:
                    blobs.put_stream(
                        fh, layer.digest, layer.size, progress, f"layer {layer.digest[7:19]}"
                    )
        name = top.annotations.get(CONTAINERD_NAME) or top.annotations.get(REF_NAME, "")
        names = (_name(name),) if ("/" in name or ":" in name) else ()
        image = NewImage(
            config=manifest.config.digest,
            manifest=desc.digest,
            manifest_digest=top.digest,
            blobs=(
                *extra,
                desc.digest,
                manifest.config.digest,
                *(layer.digest for layer in manifest.layers),
            ),
            size_bytes=sum(layer.size for layer in manifest.layers),
        )
        images.append((names, image))
    return images


def _blob(source: _Source, blobs: Blobs, desc: Descriptor, what: str) -> bytes:
    """A small blob of the layout (index, manifest, config), checked and stored."""
    data = source.read(_blob_path(desc.digest))
    if len(data) != desc.size:
        raise BadImage(f"{what} {desc.digest}: {len(data)} bytes where {desc.size} were declared")
    blobs.put_bytes(data, desc.digest)
    return data


def _blob_path(digest: str) -> str:
    return "blobs/" + digest.replace(":", "/", 1)


def _record(
    blobs: Blobs,
    config: str,
    config_size: int,
    layers: list[Descriptor],
    manifest_digest: str | None,
) -> NewImage:
    """An image that came without a manifest gets one made (an OCI manifest, stored)."""
    manifest = Manifest(Descriptor(OCI_CONFIG, config, config_size), tuple(layers))
    stored = blobs.put_bytes(manifest.to_json())
    return NewImage(
        config=config,
        manifest=stored,
        manifest_digest=manifest_digest,
        blobs=(stored, config, *(layer.digest for layer in layers)),
        size_bytes=sum(layer.size for layer in layers),
    )


def _name(ref: str) -> str:
    try:
        return normalize_reference(ref)
    except InvalidReference as exc:
        raise BadImage(f"the archive names an image {ref!r}: {exc}") from None


class _Prefixed:
    """``head`` (already read) followed by the rest of ``fh``."""

    def __init__(self, head: bytes, fh: IO[bytes]) -> None:
        self._head, self._fh = head, fh

    def read(self, n: int = -1) -> bytes:
        if self._head:
            out, self._head = self._head, b""
            return out
        return self._fh.read(n)
