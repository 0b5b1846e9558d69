"""What the store says about an image, and the JSON documents it is made of."""

from __future__ import annotations

import json
import platform
from collections.abc import Callable
from typing import Any

import attrs

from .errors import BadImage, ImageNotFound
from .reference import DIGEST

ProgressCallback = Callable[[str, int, "int | None"], None]
"""``(what, done_bytes, total_bytes)``; total is None when unknown."""

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
MAX_DOCUMENT_BYTES = 4 << 20  # a manifest, index or config larger than this is refused


@attrs.frozen
class ImageConfig:
    """How the image's processes run: the ``config`` object of its config JSON."""

    env: tuple[str, ...] = ()  # "K=V" as in the config
    working_dir: str = ""
    user: str = ""  # "name", "uid", "uid:gid", "name:group"; "" = root
    entrypoint: tuple[str, ...] | None = None
    cmd: tuple[str, ...] | None = None


@attrs.frozen
class StoredImage:
    """An image in the store."""

    id: str  # "sha256:<hex>" of the config blob (Docker's image id)
    names: tuple[str, ...]  # normalized references that point at it
    manifest_digest: str | None  # the registry's (or OCI layout's) manifest digest
    config: ImageConfig
    size_bytes: int  # the layers' size as stored (compressed when pulled)
    created: str | None  # the config's "created", RFC 3339

    @property
    def hex(self) -> str:
        return self.id.split(":", 1)[1]


@attrs.frozen
class Descriptor:
    """A content descriptor of a manifest: media type, digest, size."""

    media_type: str
    digest: str
    size: int
    platform: dict[str, Any] | None = None
    annotations: dict[str, str] = attrs.Factory(dict)

    @classmethod
    def parse(cls, raw: object, what: str) -> Descriptor:
        if not isinstance(raw, dict):
            raise BadImage(f"{what}: a descriptor is not an object")
        digest, size = raw.get("digest"), raw.get("size")
        if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
            raise BadImage(f"{what}: unsupported or invalid digest {digest!r} (sha256 only)")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BadImage(f"{what}: invalid size {size!r}")
        platform = raw.get("platform")
        annotations = raw.get("annotations") or {}
        if not isinstance(annotations, dict):
            annotations = {}
        return cls(
            media_type=str(raw.get("mediaType") or ""),
            digest=digest,
            size=size,
            platform=platform if isinstance(platform, dict) else None,
            annotations={str(k): str(v) for k, v in annotations.items()},
        )

    def to_json(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


def load_json(data: bytes, what: str) -> dict[str, Any]:
    """A JSON object, or ``BadImage``."""
    doc = _load_bounded(data, what)
    if not isinstance(doc, dict):
        raise BadImage(f"{what} is not a JSON object")
    return doc


def load_json_list(data: bytes, what: str) -> list[Any]:
    """A JSON array, or ``BadImage``."""
    doc = _load_bounded(data, what)
    if not isinstance(doc, list):
        raise BadImage(f"{what} is not a JSON list")
    return doc


def _load_bounded(data: bytes, what: str) -> Any:
    if len(data) > MAX_DOCUMENT_BYTES:
        raise BadImage(f"{what} is larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        return json.loads(data)
    except ValueError as exc:
        raise BadImage(f"{what} is not JSON: {exc}") from None
    except RecursionError:
        raise BadImage(f"{what} is nested too deeply") from None


@attrs.frozen
class Manifest:
    """An image manifest: its config and its layers, bottom first."""

    config: Descriptor
    layers: tuple[Descriptor, ...]

    @classmethod
    def parse(cls, data: bytes, what: str = "manifest") -> Manifest:
        doc = load_json(data, what)
        if doc.get("schemaVersion") == 1:
            raise BadImage(f"{what}: Docker's schema 1 manifests are not supported")
        media_type = doc.get("mediaType")
        if media_type in INDEX_TYPES or "manifests" in doc:
            raise BadImage(f"{what} is an index, not an image manifest")
        layers = doc.get("layers")
        if not isinstance(layers, list):
            raise BadImage(f"{what} has no layers list")
        return cls(
            config=Descriptor.parse(doc.get("config"), f"{what} config"),
            layers=tuple(Descriptor.parse(layer, f"{what} layer") for layer in layers),
        )

    def to_json(self) -> bytes:
        """An OCI manifest of these descriptors (for images that came without one)."""
        doc = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": self.config.to_json(),
            "layers": [layer.to_json() for layer in self.layers],
        }
        return json.dumps(doc, separators=(",", ":")).encode()


@attrs.frozen
class ParsedConfig:
    """The parts of an image config JSON the store uses."""

    config: ImageConfig
    diff_ids: tuple[str, ...]
    created: str | None
    os: str
    architecture: str

    @classmethod
    def parse(cls, data: bytes, what: str = "image config") -> ParsedConfig:
        doc = load_json(data, what)
        rootfs = doc.get("rootfs")
        diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
        if not isinstance(diff_ids, list) or not all(
            isinstance(d, str) and DIGEST.fullmatch(d) for d in diff_ids
        ):
            raise BadImage(f"{what} has no valid rootfs.diff_ids")
        created = doc.get("created")
        return cls(
            config=_image_config(doc.get("config") or {}, what),
            diff_ids=tuple(diff_ids),
            created=created if isinstance(created, str) else None,
            os=str(doc.get("os") or ""),
            architecture=str(doc.get("architecture") or ""),
        )


def _image_config(raw: object, what: str) -> ImageConfig:
    if not isinstance(raw, dict):
        raise BadImage(f"{what}: config is not an object")

    def strings(key: str) -> tuple[str, ...] | None:
        value = raw.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise BadImage(f"{what}: {key} is not a list of strings")
        return tuple(value)

    def text(key: str) -> str:
        value = raw.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise BadImage(f"{what}: {key} is not a string")
        return value

    return ImageConfig(
        env=strings("Env") or (),
        working_dir=text("WorkingDir"),
        user=text("User"),
        entrypoint=strings("Entrypoint"),
        cmd=strings("Cmd"),
    )


@attrs.frozen
class NewImage:
    """An image a pull or an import has put in the blob store, to be recorded."""

    config: str  # the config blob's digest: the image id
    manifest: str  # the stored image manifest (the registry's, or one made for an archive)
    manifest_digest: str | None  # what the reference named at the registry (an index, maybe)
    blobs: tuple[str, ...]  # every blob the image needs (index, manifest, config, layers)
    size_bytes: int


def machine_platform() -> tuple[str, str]:
    """(architecture, variant) of this machine in OCI terms: ("amd64", ""), ("arm64", "v8")."""
    machine = platform.machine().lower()
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        machine, machine
    )
    return arch, "v8" if arch == "arm64" else ""


def choose_manifest(index: dict[str, Any], what: str) -> Descriptor:
    """The linux/<this machine> image manifest of an index (a manifest list)."""
    raw = index.get("manifests")
    if not isinstance(raw, list):
        raise BadImage(f"{what} has no manifests list")
    entries = [Descriptor.parse(d, f"{what} entry") for d in raw]
    arch, variant = machine_platform()
    matching = [
        d
        for d in entries
        if d.platform is not None
        and d.platform.get("os") == "linux"
        and d.platform.get("architecture") == arch
        and d.media_type not in INDEX_TYPES
    ]
    # arm64: an entry saying v8, or no variant at all, before any other variant.
    matching.sort(
        key=lambda d: d.platform is None or d.platform.get("variant") not in (variant, None)
    )
    if matching:
        return matching[0]
    unlabelled = [d for d in entries if d.platform is None]
    if unlabelled:
        return unlabelled[0]
    offered = sorted(
        {f"{d.platform.get('os')}/{d.platform.get('architecture')}" for d in entries if d.platform}
    )
    raise ImageNotFound(f"{what} has no linux/{arch} image (it has {', '.join(offered) or 'none'})")
