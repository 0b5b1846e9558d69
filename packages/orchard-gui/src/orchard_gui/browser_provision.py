"""Get a sandbox ready to run ``browser_server.py``: a Python with Playwright, Node, Chromium.

``provision(sandbox)`` probes the sandbox once and then, in this order of preference:

1. uses a Python that already imports ``playwright`` (``/opt/venv/bin/python`` in the
   ``orchard-test/browser`` image, else ``python3``);
2. otherwise ships Playwright: a tar.gz of the host's installed ``playwright`` package and its
   dependencies (``greenlet``, ...), built once per host (cached under
   ``~/.cache/orchard-gui/``, keyed by the versions) and unpacked into
   ``/tmp/orchard-gui/site``. The bundle leaves out Playwright's own Node (144 MB) when the
   sandbox has ``node`` >= 20 (``PLAYWRIGHT_NODEJS_PATH`` points at it); otherwise a second,
   bigger bundle carries it. ``greenlet`` is compiled, so the sandbox's ``python3`` must be the
   host's major.minor on the same machine architecture.

Chromium must be in the image (``/usr/bin/chromium`` from Debian's ``chromium`` package, or
``chromium-browser`` / ``google-chrome``): Playwright cannot download browsers here.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.resources
import os
import platform
import re
import shlex
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import attrs

from orchard_env_client import AsyncSandbox

__all__ = [
    "REMOTE_DIR",
    "BrowserProvisionError",
    "BrowserRuntime",
    "bundle_path",
    "provision",
]

REMOTE_DIR = "/tmp/orchard-gui"
"""Where the server script and a shipped Playwright go inside the sandbox."""
IMAGE_PYTHONS = ("/opt/venv/bin/python", "python3")
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
MIN_NODE_MAJOR = 20
MIN_PLAYWRIGHT = (1, 49)  # page.aria_snapshot()

_PROBE = r"""
for py in {pythons}; do
  p=$(command -v "$py" 2>/dev/null) || continue
  v=$("$p" -c 'import sys, platform; print("%d.%d" % sys.version_info[:2], platform.machine())' 2>/dev/null) || continue
  pw=$("$p" -c 'from playwright._repo_version import version; print(version)' 2>/dev/null)
  echo "python=$p|$v|$pw"
done
for c in {chromiums}; do
  p=$(command -v "$c" 2>/dev/null) && echo "chromium=$p"
done
n=$(command -v node 2>/dev/null) && echo "node=$n|$("$n" --version 2>/dev/null)"
for m in {remote}/site/.bundle-*; do [ -e "$m" ] && echo "bundle=${{m##*/.bundle-}}"; done
true
"""


class BrowserProvisionError(RuntimeError):
    """The sandbox cannot run the browser server; the message says what is missing."""


@attrs.frozen
class BrowserRuntime:
    """How to run ``browser_server.py`` in one sandbox (``provision``'s answer)."""

    python: str
    """The Python that imports Playwright there."""
    chromium: str
    """Chromium's path there."""
    server_path: str
    """Where ``browser_server.py`` was uploaded."""
    env: dict[str, str]
    """Environment for the server (PYTHONPATH, PLAYWRIGHT_NODEJS_PATH when shipped)."""
    shipped: str | None
    """The bundle key when Playwright was shipped, ``None`` when the image had it."""
    timings: dict[str, float]
    """Seconds spent: ``probe``, ``bundle_build`` (0 when cached), ``upload``, ``total``."""


@attrs.frozen
class _Probe:
    pythons: list[tuple[str, str, str, str]]  # (path, "3.11", machine, playwright version or "")
    chromium: str | None
    node: str | None
    node_major: int | None
    bundles: frozenset[str]


def _parse_probe(text: str) -> _Probe:
    pythons: list[tuple[str, str, str, str]] = []
    chromium = node = None
    node_major = None
    bundles = set()
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key == "python":
            path, version_machine, pw = ([*value.split("|"), "", ""])[:3]
            version, _, machine = version_machine.partition(" ")
            pythons.append((path, version, machine, pw.strip()))
        elif key == "chromium" and chromium is None:
            chromium = value.strip()
        elif key == "node":
            node, _, version = value.partition("|")
            match = re.match(r"v?(\d+)", version.strip())
            node_major = int(match.group(1)) if match else None
        elif key == "bundle":
            bundles.add(value.strip())
    return _Probe(pythons, chromium, node, node_major, frozenset(bundles))


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


# ---------------------------------------------------------------- the bundle


def _requirement_name(requirement: str) -> str | None:
    """The distribution a requirement names, ``None`` for extras-only ones."""
    name, _, marker = requirement.partition(";")
    if "extra" in marker:
        return None
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", name)
    return match.group(1) if match else None


def _closure(root: str) -> list[importlib.metadata.Distribution]:
    """``root`` and the installed distributions it requires, transitively."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    todo = [(root, True)]
    while todo:
        name, required = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            if required:
                raise BrowserProvisionError(
                    f"cannot ship Playwright: {name!r} is not installed on the host"
                ) from None
            continue  # a conditional dependency this Python does not need
        seen[key] = dist
        for requirement in dist.requires or []:
            dep = _requirement_name(requirement)
            if dep:
                todo.append((dep, ";" not in requirement))
    return list(seen.values())


def bundle_key(with_node: bool) -> str:
    """Names the bundle by what is in it: versions, Python, architecture, Node or not."""
    parts = [
        f"{dist.metadata['Name'].lower()}-{dist.version}"
        for dist in sorted(_closure("playwright"), key=lambda d: d.metadata["Name"].lower())
    ]
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    return "_".join([*parts, py, platform.machine(), "node" if with_node else "nonode"])


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "orchard-gui"


_build_lock = threading.Lock()


def bundle_path(with_node: bool) -> tuple[Path, str, float]:
    """The cached bundle (built now if missing): ``(path, key, seconds spent building)``."""
    key = bundle_key(with_node)
    target = _cache_dir() / f"playwright-bundle-{key}.tar.gz"
    with _build_lock:
        if target.exists():
            return target, key, 0.0
        started = time.monotonic()
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".bundle-", suffix=".part")
        os.close(fd)
        try:
            with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
                for dist in _closure("playwright"):
                    _add_distribution(tar, dist, with_node)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target, key, time.monotonic() - started


def _add_distribution(
    tar: tarfile.TarFile, dist: importlib.metadata.Distribution, with_node: bool
) -> None:
    files = dist.files
    if files is None:
        name = dist.metadata["Name"]
        raise BrowserProvisionError(f"cannot ship {name}: its installed files are not recorded")
    for entry in files:
        rel = entry.as_posix()
        if rel.startswith("..") or "__pycache__" in rel or rel.endswith(".pyc"):
            continue  # scripts outside site-packages; byte code is rebuilt there
        if not with_node and rel == "playwright/driver/node":
            continue
        source = Path(str(dist.locate_file(entry)))
        if source.is_file():
            tar.add(source, arcname=rel, recursive=False)


# ---------------------------------------------------------------- provisioning


async def _exec_ok(sandbox: AsyncSandbox, command: str, what: str, timeout: float = 120) -> str:
    job = await sandbox.exec(command, timeout=timeout)
    if job.exit_code != 0:
        tail = (job.stderr or job.stdout or job.error or "").strip()[-2000:]
        raise BrowserProvisionError(f"{what} failed in the sandbox (exit {job.exit_code}): {tail}")
    return job.stdout


async def provision(sandbox: AsyncSandbox, *, remote_dir: str = REMOTE_DIR) -> BrowserRuntime:
    """Make ``sandbox`` able to run the browser server; ``BrowserProvisionError`` says why not."""
    started = time.monotonic()
    timings = {"probe": 0.0, "bundle_build": 0.0, "upload": 0.0}
    script = _PROBE.format(
        pythons=" ".join(IMAGE_PYTHONS),
        chromiums=" ".join(CHROMIUM_NAMES),
        remote=shlex.quote(remote_dir),
    )
    probe = _parse_probe(await _exec_ok(sandbox, script, "probing for Python and Chromium", 60))
    timings["probe"] = time.monotonic() - started
    if probe.chromium is None:
        raise BrowserProvisionError(
            "no Chromium in the sandbox image (looked for "
            f"{', '.join(CHROMIUM_NAMES)}): install Debian's `chromium` package "
            "(apt-get install chromium) in the image; Playwright cannot download browsers here"
        )
    env: dict[str, str] = {"HOME": "/tmp", "TMPDIR": "/tmp"}
    python = shipped = None
    for path, _version, _machine, pw in probe.pythons:
        if pw and _version_tuple(pw) >= MIN_PLAYWRIGHT:
            python = path
            break
    if python is None:
        python, shipped = await _ship(sandbox, probe, remote_dir, timings)
        env["PYTHONPATH"] = f"{remote_dir}/site"
        if probe.node is not None and (probe.node_major or 0) >= MIN_NODE_MAJOR:
            env["PLAYWRIGHT_NODEJS_PATH"] = probe.node

    upload_started = time.monotonic()
    server_path = f"{remote_dir}/browser_server.py"
    source = importlib.resources.files("orchard_gui").joinpath("browser_server.py").read_bytes()
    await sandbox.upload_content(server_path, source)
    timings["upload"] += time.monotonic() - upload_started
    timings["total"] = time.monotonic() - started
    return BrowserRuntime(
        python=python,
        chromium=probe.chromium,
        server_path=server_path,
        env=env,
        shipped=shipped,
        timings=timings,
    )


async def _ship(
    sandbox: AsyncSandbox, probe: _Probe, remote_dir: str, timings: dict[str, float]
) -> tuple[str, str]:
    """Upload (unless already there) the Playwright bundle; the python to run it with."""
    host = "{}.{}".format(*sys.version_info[:2])
    python3 = next((p for p in probe.pythons if p[0].endswith("python3")), None)
    if python3 is None:
        raise BrowserProvisionError(
            "the sandbox has no python3 and no Python with Playwright: use an image with "
            f"python{host} (Playwright is then shipped in) or one with Playwright installed"
        )
    path, version, machine, _ = python3
    if version != host or machine != platform.machine():
        raise BrowserProvisionError(
            f"the sandbox's python3 ({path}) is Python {version} on {machine or '?'}, the host's "
            f"is Python {host} on {platform.machine()}: the shipped Playwright bundle holds "
            "compiled code (greenlet) for the host's; use an image with Playwright installed "
            "(e.g. orchard-test/browser, /opt/venv) or with the host's Python version"
        )
    with_node = probe.node is None or (probe.node_major or 0) < MIN_NODE_MAJOR
    key = bundle_key(with_node)
    if key in probe.bundles:
        return path, key  # shipped by an earlier session in this sandbox
    bundle, key, built = await asyncio.to_thread(bundle_path, with_node)
    timings["bundle_build"] = built
    upload_started = time.monotonic()
    archive = f"{remote_dir}/playwright-bundle.tar.gz"
    site = f"{remote_dir}/site"
    await sandbox.upload_file(bundle, archive)
    unpack = (
        f"mkdir -p {shlex.quote(site)} && "
        f"{shlex.quote(path)} -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "
        f"{shlex.quote(archive)} {shlex.quote(site)} && "
        f"rm -f {shlex.quote(archive)} && touch {shlex.quote(f'{site}/.bundle-{key}')}"
    )
    await _exec_ok(sandbox, unpack, "unpacking the Playwright bundle", 300)
    timings["upload"] = time.monotonic() - upload_started
    return path, key
