"""``orchard-env image ...``: pull, import, list, tag, remove and prune the image store the
local backend runs images from (``<state dir>/image-store``, the state dir of ``serve``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

    from .model import StoredImage
    from .store import ImageStore


def add_parser(sub: Any) -> None:
    """Add the ``image`` command to the ``orchard-env`` subparsers ``sub``."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="the server's state dir (default: that of `orchard-env serve`)",
    )
    common.add_argument(
        "--image-store",
        type=Path,
        default=None,
        help="the store's own directory (default: STATE_DIR/image-store; $ORCHARD_ENV_IMAGE_STORE)",
    )
    image = sub.add_parser(
        "image", help="the local backend's image store (docs/images.md)"
    ).add_subparsers(dest="image_command", required=True)
    pull = image.add_parser("pull", parents=[common], help="pull an image from its registry")
    pull.add_argument("ref", help="e.g. python:3.11-slim, 127.0.0.1:5000/team/tool:1")
    pull.add_argument(
        "--insecure",
        action="store_true",
        help="the registry may be plain http (or https with an unverified certificate)",
    )
    pull.add_argument(
        "--mirror",
        action="append",
        default=None,
        metavar="REGISTRY=URL",
        help="pull REGISTRY's images from URL instead (repeatable), "
        "e.g. docker.io=http://127.0.0.1:5000",
    )
    imp = image.add_parser(
        "import", parents=[common], help="load a `docker save` archive or an OCI layout"
    )
    imp.add_argument("file", type=Path, help="a tar file or a directory")
    ls = image.add_parser("ls", parents=[common], help="list the stored images")
    ls.add_argument("--json", action="store_true", help="print JSON")
    rm = image.add_parser("rm", parents=[common], help="untag names, or remove images by id")
    rm.add_argument("refs", nargs="+", metavar="REF")
    image.add_parser(
        "prune", parents=[common], help="free the disk space of removed images and failed pulls"
    )
    tag = image.add_parser("tag", parents=[common], help="give an image another name")
    tag.add_argument("source")
    tag.add_argument("target")


def run(args: argparse.Namespace) -> int:
    """Run an ``orchard-env image`` command; 1 with a message on stderr when it fails."""
    from rich.console import Console

    from ..settings import Settings
    from .errors import ImageError
    from .store import ImageStore

    settings = Settings.from_env(
        {"state_dir": args.state_dir, "local.image_store": args.image_store}
    )
    err = Console(stderr=True)
    try:
        store = ImageStore(settings.image_store_dir)
        command = args.image_command
        if command == "pull":
            return _pull(store, args, settings, err)
        if command == "import":
            return _import(store, args.file, err)
        if command == "ls":
            return _list(store, args.json)
        if command == "rm":
            for ref in args.refs:
                image = store.remove(ref)
                print(f"removed {ref} ({image.id[7:19]})")
            print("`orchard-env image prune` frees the disk space of images no name is left on")
            return 0
        if command == "prune":
            files, freed = store.prune()
            print(f"removed {files} files, freed {_size(freed)}")
            return 0
        if command == "tag":
            image = store.tag(args.source, args.target)
            print(f"{args.target} -> {image.id[7:19]}")
            return 0
    except (ImageError, FileNotFoundError, PermissionError, ValueError) as exc:
        print(f"orchard-env image {args.image_command}: {exc}", file=sys.stderr)
        return 1
    return 2


def _pull(store: ImageStore, args: argparse.Namespace, settings: Any, err: Console) -> int:
    from ..settings import parse_mirrors
    from .reference import parse_reference

    mirrors = parse_mirrors(args.mirror) if args.mirror else settings.local.registry_mirrors
    insecure = (
        args.insecure or parse_reference(args.ref).registry in settings.local.insecure_registries
    )
    started = time.monotonic()
    with _Bars(err) as bars:  # the operator's own pull: any host, no deadline
        image = store.pull(
            args.ref,
            insecure=insecure,
            mirrors=mirrors,
            progress=bars.update,
            allow_private=True,
        )
    pulled = time.monotonic() - started
    unpack = _unpack(store, image, err)
    print(
        f"pulled {parse_reference(args.ref)} ({image.id[7:19]}, {_size(image.size_bytes)}) "
        f"in {pulled:.1f} s, unpacked in {unpack:.1f} s"
    )
    return 0


def _import(store: ImageStore, path: Path, err: Console) -> int:
    with _Bars(err) as bars:
        images = store.import_archive(path, progress=bars.update)
    if not images:
        err.print(f"{path} holds no images")
        return 1
    for image in images:
        unpack = _unpack(store, image, err)
        name = ", ".join(image.names) or "(no name: use its id)"
        size = _size(image.size_bytes)
        print(f"imported {name} ({image.id[7:19]}, {size}), unpacked in {unpack:.1f} s")
    return 0


def _unpack(store: ImageStore, image: StoredImage, err: Console) -> float:
    """Unpack now, so that the first sandbox of the image does not wait for it."""
    started = time.monotonic()
    with err.status(f"unpacking {image.id[7:19]}"):
        store.rootfs(image)
    return time.monotonic() - started


def _list(store: ImageStore, as_json: bool) -> int:
    images = store.list()
    if as_json:
        rows = [
            {
                "id": im.id,
                "names": list(im.names),
                "manifest_digest": im.manifest_digest,
                "size_bytes": im.size_bytes,
                "created": im.created,
                "config": {
                    "env": list(im.config.env),
                    "working_dir": im.config.working_dir,
                    "user": im.config.user,
                    "entrypoint": im.config.entrypoint,
                    "cmd": im.config.cmd,
                },
            }
            for im in images
        ]
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for column in ("NAME", "ID", "SIZE", "CREATED"):
        table.add_column(column, no_wrap=True)
    for im in images:
        for name in im.names or ("<none>",):
            created = (im.created or "")[:19].replace("T", " ")
            table.add_row(name, im.id[7:19], _size(im.size_bytes), created)
    Console(width=200 if not sys.stdout.isatty() else None).print(table)
    return 0


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


class _Bars:
    """A rich progress bar per blob (the store's ``ProgressCallback``)."""

    def __init__(self, console: Console) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._progress: Progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> _Bars:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, what: str, done: int, total: int | None) -> None:
        task = self._tasks.get(what)
        if task is None:
            task = self._tasks[what] = self._progress.add_task(what, total=total)
        self._progress.update(task, completed=done, total=total)
