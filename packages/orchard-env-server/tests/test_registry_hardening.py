"""Pulls that an API user may cause, against hostile registries: small real HTTP servers on
127.0.0.1 (no mocks) that point token realms and redirects at hosts nobody named, answer
with internal pages, gzip bombs, endless bodies and blobs longer than declared, or stall.

Nothing here connects anywhere but 127.0.0.1: references to other private addresses must
be refused before any connection, which an audit hook on ``socket.connect`` checks."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import sys
import tarfile
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from orchard_env_server.cli import _parser
from orchard_env_server.images import BadImage, ImageNotFound, ImageStore, RegistryError
from orchard_env_server.images.model import machine_platform
from orchard_env_server.images.registry import (
    MAX_DOCUMENT_BYTES,
    canonical_registry,
    is_public_address,
)
from orchard_env_server.settings import DEFAULT_PULL_REGISTRIES, Settings

Route = Callable[[BaseHTTPRequestHandler], None]
SECRET = "internal-secret-7f3a9c"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"

# -- connections, seen by an audit hook (installed once; it records only while asked)

_connects: list[Any] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "socket.connect" and _connects is not None:
        _connects.append(args[1])


sys.addaudithook(_audit)


@pytest.fixture
def connects() -> Iterator[list[Any]]:
    """Addresses this process connects to during the test."""
    global _connects
    _connects = []
    try:
        yield _connects
    finally:
        _connects = None


# -- servers


def reply(
    req: BaseHTTPRequestHandler,
    status: int,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> None:
    req.send_response(status)
    for key, value in (headers or {}).items():
        req.send_header(key, value)
    req.send_header("Content-Length", str(len(body)))
    req.end_headers()
    req.wfile.write(body)


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that hung up on a body it refused


class Site:
    """An HTTP server on 127.0.0.1:<free port>: ``routes`` by path, every request kept."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.closing = threading.Event()
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                site.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                route = site.routes.get(urlsplit(self.path).path)
                try:
                    if route is None:
                        body = b'{"errors":[{"code":"NOT_FOUND","message":"no such path"}]}'
                        reply(self, 404, body, {"Content-Type": "application/json"})
                    else:
                        route(self)
                except OSError:  # the client hung up on a body it refused
                    self.close_connection = True

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.host}"
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()

    def stop(self) -> None:
        self.closing.set()
        self._server.shutdown()
        self._server.server_close()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class FakeRegistry(Site):
    """A registry of one image, ``test/img:1`` (one small gzip layer), anonymous."""

    def __init__(self) -> None:
        super().__init__()
        content = b"hello from a small registry\n" * 20
        tar_buf = io.BytesIO()
        with tarfile.open(fileobj=tar_buf, mode="w") as tar:
            info = tarfile.TarInfo("hello.txt")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
        self.layer = gzip.compress(tar_buf.getvalue(), mtime=0)
        arch, _ = machine_platform()
        self.config = json.dumps(
            {
                "architecture": arch,
                "os": "linux",
                "rootfs": {"type": "layers", "diff_ids": [_digest(tar_buf.getvalue())]},
                "config": {},
            }
        ).encode()
        self.manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": _digest(self.config),
                    "size": len(self.config),
                },
                "layers": [
                    {
                        "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": _digest(self.layer),
                        "size": len(self.layer),
                    }
                ],
            }
        ).encode()
        self.ref = f"{self.host}/test/img:1"
        self.manifest_path = "/v2/test/img/manifests/1"
        self.layer_path = f"/v2/test/img/blobs/{_digest(self.layer)}"
        self.routes.update(
            {
                "/v2/": lambda req: reply(req, 200, b"{}", {"Content-Type": "application/json"}),
                self.manifest_path: self.serve(self.manifest, {"Content-Type": OCI_MANIFEST}),
                f"/v2/test/img/blobs/{_digest(self.config)}": self.serve(self.config),
                self.layer_path: self.serve(self.layer),
            }
        )

    @staticmethod
    def serve(body: bytes, headers: dict[str, str] | None = None) -> Route:
        return lambda req: reply(req, 200, body, headers)


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    return ImageStore(tmp_path / "store")


@pytest.fixture
def registry() -> Iterator[FakeRegistry]:
    site = FakeRegistry()
    yield site
    site.stop()


@pytest.fixture
def internal() -> Iterator[Site]:
    """An "internal service" nobody named: it must never be asked anything."""
    site = Site()
    site.routes["/token"] = lambda req: reply(req, 200, json.dumps({"token": SECRET}).encode())
    site.routes["/x"] = lambda req: reply(req, 200, SECRET.encode())
    yield site
    site.stop()


def redirect(location: str) -> Route:
    return lambda req: reply(req, 307, b"", {"Location": location})


def challenge(realm: str) -> Route:
    return lambda req: reply(
        req, 401, b"", {"WWW-Authenticate": f'Bearer realm="{realm}",service="test"'}
    )


# -- the address check


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.8.9.10",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",  # shared address space (carrier-grade NAT, tailnets)
        "0.0.0.0",
        "224.0.0.251",
        "239.1.2.3",
        "240.0.0.1",
        "255.255.255.255",
        "192.0.0.8",
        "198.18.0.1",
        "::1",
        "::",
        "fe80::1",
        "fe80::1%1",
        "fc00::1",
        "fd12:3456::1",
        "ff02::1",
        "ff0e::1",
        "::ffff:127.0.0.1",  # IPv4-mapped
        "::ffff:10.0.0.1",
        "::ffff:169.254.169.254",
        "::127.0.0.1",  # IPv4-compatible (deprecated)
        "2002:a00:1::1",  # 6to4 of 10.0.0.1
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
        "64:ff9b:1::1",
        "2001:db8::1",  # documentation
    ],
)
def test_non_public_addresses(address: str) -> None:
    assert not is_public_address(address)


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "1.1.1.1",
        "140.82.112.3",
        "2606:4700:4700::1111",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",  # NAT64 of 8.8.8.8 (DNS64 on an IPv6-only network)
        "2002:808:808::1",  # 6to4 of 8.8.8.8
    ],
)
def test_public_addresses(address: str) -> None:
    assert is_public_address(address)


def test_registry_names_are_compared_as_references_name_them() -> None:
    assert canonical_registry("Index.Docker.IO") == "docker.io"
    assert canonical_registry("registry-1.docker.io") == "docker.io"
    assert canonical_registry(" GHCR.io ") == "ghcr.io"
    assert canonical_registry("127.0.0.1:5000") == "127.0.0.1:5000"


def test_settings_of_who_may_pull(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ORCHARD_ENV_PULL_REGISTRIES", "ORCHARD_ENV_PULL_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    default = Settings.from_env()
    assert default.local.pull_registries == list(DEFAULT_PULL_REGISTRIES)
    assert "docker.io" in default.local.pull_registries and default.local.pull_timeout_s == 1800.0
    monkeypatch.setenv("ORCHARD_ENV_PULL_REGISTRIES", "ghcr.io, registry.example.com:5000,")
    monkeypatch.setenv("ORCHARD_ENV_PULL_TIMEOUT", "90")
    env = Settings.from_env()
    assert env.local.pull_registries == ["ghcr.io", "registry.example.com:5000"]
    assert env.local.pull_timeout_s == 90.0
    args = _parser().parse_args(
        ["serve", "--pull-registry", "quay.io", "--pull-registry", "a.b:1", "--pull-timeout", "5"]
    )
    assert args.pull_registries == ["quay.io", "a.b:1"] and args.pull_timeout_s == 5.0
    flags = Settings.from_env(
        {"local.pull_registries": args.pull_registries, "local.pull_timeout_s": 5.0}
    )
    assert flags.local.pull_registries == ["quay.io", "a.b:1"] and flags.local.pull_timeout_s == 5.0


# -- hosts nobody named


@pytest.mark.parametrize(
    "ref",
    [
        "10.0.0.1:5000/x:y",
        "10.1.2.3:8080/x:y",
        "169.254.169.254/x",
        "localhost:6379/x",
        "[::1]:5000/x",
        "[fd00::1]/x",
    ],
)
def test_a_private_registry_is_refused_before_any_connection(
    store: ImageStore, connects: list[Any], ref: str
) -> None:
    with pytest.raises(RegistryError, match=r"refused host .*non-public address"):
        store.pull(ref)
    assert connects == []
    with pytest.raises(RegistryError, match="refused host"):  # insecure names another host
        store.pull(ref, insecure=False, mirrors={"other.example": "http://127.0.0.1:9"})
    assert connects == []


def test_a_listening_loopback_registry_is_not_asked(
    store: ImageStore, internal: Site, connects: list[Any]
) -> None:
    with pytest.raises(RegistryError, match=r"refused host 127\.0\.0\.1"):
        store.pull(f"{internal.host}/x:y")
    assert connects == [] and internal.requests == []


def test_a_registry_the_operator_named_is_pulled_from(
    store: ImageStore, registry: FakeRegistry
) -> None:
    # Insecure: the operator named it. Its layer is on "storage" of the same host and
    # port, behind a redirect (followed).
    storage = f"/storage/{_digest(registry.layer)}"
    registry.routes[storage] = registry.serve(registry.layer)
    registry.routes[registry.layer_path] = redirect(storage)
    image = store.pull(registry.ref, insecure=True, timeout=30)
    assert image.names == (registry.ref,)
    assert (store.rootfs(image) / "hello.txt").read_bytes().startswith(b"hello")
    assert any(path == storage for path, _ in registry.requests)
    # A mirror the operator configured is named too.
    mirrored = store.pull("docker.io/test/img:1", mirrors={"docker.io": registry.url})
    assert mirrored.id == image.id


@pytest.mark.parametrize(
    "realm",
    [
        "http://127.0.0.1:{port}/token",  # http, same host, another (unnamed) port
        "https://127.0.0.1:{port}/token",
        "http://localhost:{port}/token",  # plain http to another host
        "https://10.0.0.1/token",
        "https://169.254.169.254/latest/meta-data",
        "ftp://127.0.0.1:{port}/token",
    ],
)
def test_a_token_realm_nobody_named_is_refused(
    store: ImageStore,
    registry: FakeRegistry,
    internal: Site,
    connects: list[Any],
    realm: str,
) -> None:
    registry.routes["/v2/"] = challenge(realm.format(port=internal.port))
    with pytest.raises(RegistryError, match=r"refused|invalid token realm") as info:
        store.pull(registry.ref, insecure=True)
    assert internal.requests == []
    assert {a[1] for a in connects} == {registry.port}  # the registry only
    assert SECRET not in str(info.value)


def test_a_token_realm_on_the_registrys_own_host_is_used(
    store: ImageStore, registry: FakeRegistry
) -> None:
    registry.routes["/v2/"] = challenge(f"{registry.url}/token")
    registry.routes["/token"] = lambda req: reply(req, 200, b'{"token": "tok"}')
    store.pull(registry.ref, insecure=True)
    repo = [h for p, h in registry.requests if p.startswith("/v2/test/")]
    assert repo and all(h.get("authorization") == "Bearer tok" for h in repo)


@pytest.mark.parametrize(
    "target",
    [
        "http://127.0.0.1:{port}/x",
        "https://127.0.0.1:{port}/x",
        "http://localhost:{port}/x",
        "https://10.0.0.1/x",
        "http://10.0.0.1/x",
        "file:///etc/passwd",
    ],
)
@pytest.mark.parametrize("what", ["manifest", "layer"])
def test_a_redirect_nobody_named_is_refused(
    store: ImageStore,
    registry: FakeRegistry,
    internal: Site,
    connects: list[Any],
    target: str,
    what: str,
) -> None:
    path = registry.manifest_path if what == "manifest" else registry.layer_path
    registry.routes[path] = redirect(target.format(port=internal.port))
    with pytest.raises(RegistryError, match="refused") as info:
        store.pull(registry.ref, insecure=True)
    assert internal.requests == []
    assert {a[1] for a in connects} == {registry.port}
    assert SECRET not in str(info.value)


def test_redirects_are_few(store: ImageStore, registry: FakeRegistry) -> None:
    registry.routes[registry.manifest_path] = redirect(registry.manifest_path)
    with pytest.raises(RegistryError, match="more than 5 redirects"):
        store.pull(registry.ref, insecure=True)
    assert sum(p == registry.manifest_path for p, _ in registry.requests) == 6


def test_the_token_does_not_follow_a_redirect_to_another_host(
    store: ImageStore, registry: FakeRegistry, internal: Site
) -> None:
    # The operator's own pull (any host): the layer is elsewhere, and gets no token.
    registry.routes["/v2/"] = challenge(f"{registry.url}/token")
    registry.routes["/token"] = lambda req: reply(req, 200, b'{"token": "tok"}')
    registry.routes[registry.layer_path] = redirect(f"{internal.url}/layer")
    internal.routes["/layer"] = registry.serve(registry.layer)
    store.pull(registry.ref, insecure=True, allow_private=True)
    (layer,) = internal.requests
    assert "authorization" not in layer[1]
    blob = [h for p, h in registry.requests if p == registry.layer_path]
    assert blob and blob[0]["authorization"] == "Bearer tok"


# -- what the tenant is told


@pytest.mark.parametrize("where", ["v2", "manifest", "manifest-404", "token", "layer"])
def test_a_non_json_body_is_never_echoed(
    store: ImageStore, registry: FakeRegistry, where: str
) -> None:
    page = f"<html><body>{SECRET} root:x:0:0 db_password=hunter2</body></html>".encode()

    def internal_page(status: int) -> Route:
        return lambda req: reply(req, status, page, {"Content-Type": "text/html"})

    if where == "v2":
        registry.routes["/v2/"] = internal_page(502)
    elif where == "manifest":
        registry.routes[registry.manifest_path] = internal_page(500)
    elif where == "manifest-404":
        registry.routes[registry.manifest_path] = internal_page(404)
    elif where == "token":
        registry.routes["/v2/"] = challenge(f"{registry.url}/token")
        registry.routes["/token"] = internal_page(403)
    else:
        registry.routes[registry.layer_path] = internal_page(503)
    error = ImageNotFound if where == "manifest-404" else RegistryError
    with pytest.raises(error) as info:
        store.pull(registry.ref, insecure=True)
    message = str(info.value)
    assert SECRET not in message and "hunter2" not in message and "html" not in message
    status = {"v2": 502, "manifest": 500, "manifest-404": 404, "token": 403, "layer": 503}
    assert str(status[where]) in message


def test_a_registrys_json_errors_are_quoted_truncated(
    store: ImageStore, registry: FakeRegistry
) -> None:
    doc = {"errors": [{"code": "MANIFEST_UNKNOWN", "message": "m" * 5000}]}
    registry.routes[registry.manifest_path] = lambda req: reply(
        req, 404, json.dumps(doc).encode(), {"Content-Type": "application/json"}
    )
    with pytest.raises(ImageNotFound, match="MANIFEST_UNKNOWN: mmm") as info:
        store.pull(registry.ref, insecure=True)
    assert "m" * 201 not in str(info.value)


@pytest.mark.parametrize("where", ["manifest", "token", "error"])
def test_json_nested_too_deeply_is_an_image_error(
    store: ImageStore, registry: FakeRegistry, where: str
) -> None:
    deep = b'{"schemaVersion": 2, "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    if where == "manifest":
        registry.routes[registry.manifest_path] = registry.serve(deep)
        error: type[Exception] = BadImage
    elif where == "token":
        registry.routes["/v2/"] = challenge(f"{registry.url}/token")
        registry.routes["/token"] = registry.serve(deep)
        error = RegistryError
    else:
        registry.routes[registry.manifest_path] = lambda req: reply(req, 500, deep)
        error = RegistryError
    with pytest.raises(error):
        store.pull(registry.ref, insecure=True)


# -- bounded reads


@pytest.fixture(scope="module")
def gzip_bomb() -> bytes:
    """256 MiB of zeros as a gzip stream of ~250 kB."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    parts = [compressor.compress(zeros) for _ in range(256)]
    parts.append(compressor.flush())
    return b"".join(parts)


@pytest.mark.parametrize("where", ["manifest", "token", "error", "layer"])
def test_a_gzip_bomb_is_not_opened(
    store: ImageStore, registry: FakeRegistry, gzip_bomb: bytes, where: str
) -> None:
    def bomb(status: int, content_type: str = "application/json") -> Route:
        headers = {"Content-Encoding": "gzip", "Content-Type": content_type}
        return lambda req: reply(req, status, gzip_bomb, headers)

    if where == "manifest":
        registry.routes[registry.manifest_path] = bomb(200, OCI_MANIFEST)
    elif where == "token":
        registry.routes["/v2/"] = challenge(f"{registry.url}/token")
        registry.routes["/token"] = bomb(200)
    elif where == "error":
        registry.routes[registry.manifest_path] = bomb(404)
    else:
        registry.routes[registry.layer_path] = bomb(200, "application/octet-stream")
    info, peak = _failed_pull(store, registry, (RegistryError, ImageNotFound))
    assert peak < 16 << 20, peak
    if where == "error":
        assert "404 Not Found" in str(info.value)
    else:
        assert "Content-Encoding 'gzip'" in str(info.value)
    requests_of_layer = [p for p, _ in registry.requests if p == registry.layer_path]
    assert len(requests_of_layer) <= 1  # refused, not retried


def endless(req: BaseHTTPRequestHandler, status: int = 200, limit: int = 64 << 20) -> None:
    """``status`` and a body with no declared length that goes on (until ``limit``)."""
    req.send_response(status)
    req.send_header("Connection", "close")
    req.end_headers()
    req.close_connection = True
    chunk = b"{" * (64 << 10)
    sent = 0
    try:
        while sent < limit:
            req.wfile.write(chunk)
            sent += len(chunk)
    except OSError:
        pass


def test_an_endless_manifest_stops_at_the_cap(store: ImageStore, registry: FakeRegistry) -> None:
    registry.routes[registry.manifest_path] = endless
    tracemalloc.start()
    try:
        with pytest.raises(BadImage, match=f"larger than {MAX_DOCUMENT_BYTES}"):
            store.pull(registry.ref, insecure=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * MAX_DOCUMENT_BYTES, peak


@pytest.mark.parametrize("where", ["token", "error"])
def test_endless_token_and_error_bodies_stop_at_their_caps(
    store: ImageStore, registry: FakeRegistry, where: str
) -> None:
    if where == "token":
        registry.routes["/v2/"] = challenge(f"{registry.url}/token")
        registry.routes["/token"] = endless
    else:
        registry.routes[registry.manifest_path] = lambda req: endless(req, 500)
    info, peak = _failed_pull(store, registry, RegistryError)
    assert peak < 4 << 20, peak
    if where == "token":
        assert "larger than 1048576 bytes" in str(info.value)
    else:
        assert "500 Internal Server Error" in str(info.value)


@pytest.mark.parametrize("how", ["declared", "endless"])
def test_a_blob_longer_than_its_descriptor_is_refused(
    store: ImageStore, registry: FakeRegistry, how: str
) -> None:
    if how == "declared":
        registry.routes[registry.layer_path] = registry.serve(registry.layer + b"x" * 100)
    else:
        registry.routes[registry.layer_path] = endless
    with pytest.raises(BadImage, match=f"more than the {len(registry.layer)} bytes"):
        store.pull(registry.ref, insecure=True)
    assert store.list() == []
    assert all(p.stat().st_size == 0 for p in (store.root / "tmp").glob("*.partial"))


# -- the deadline


@pytest.mark.parametrize("how", ["stall-v2", "stall-layer", "drip-layer"])
def test_a_pull_past_its_deadline_fails(
    store: ImageStore, registry: FakeRegistry, how: str
) -> None:
    def stall(req: BaseHTTPRequestHandler) -> None:
        registry.closing.wait(60)

    def stall_body(req: BaseHTTPRequestHandler) -> None:
        req.send_response(200)
        req.send_header("Content-Length", str(len(registry.layer)))
        req.end_headers()
        req.wfile.flush()
        registry.closing.wait(60)

    def drip(req: BaseHTTPRequestHandler) -> None:
        req.send_response(200)
        req.send_header("Content-Length", str(len(registry.layer)))
        req.end_headers()
        try:
            for byte in registry.layer:
                req.wfile.write(bytes([byte]))
                req.wfile.flush()
                if registry.closing.wait(0.1):
                    return
        except OSError:
            pass

    if how == "stall-v2":
        registry.routes["/v2/"] = stall
    elif how == "stall-layer":
        registry.routes[registry.layer_path] = stall_body
    else:
        registry.routes[registry.layer_path] = drip
    started = time.monotonic()
    with pytest.raises(RegistryError, match=r"did not finish within 1\.5 s"):
        store.pull(registry.ref, insecure=True, timeout=1.5)
    assert time.monotonic() - started < 5


def _failed_pull(store: Any, registry: Any, errors: Any) -> tuple[Any, int]:
    """The error a pull from ``registry`` fails with, and the peak memory it used."""
    tracemalloc.start()
    try:
        with pytest.raises(errors) as info:
            store.pull(registry.ref, insecure=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return info, peak
