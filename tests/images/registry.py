"""A real registry for image store tests: Debian's ``docker-registry`` (the CNCF
distribution server) on 127.0.0.1, images pushed to it with ``docker push``, and a proxy in
front of it that asks for a bearer token, drops or corrupts blob downloads on request."""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from orchard_testing import docker, free_port

REGISTRY_BIN = "/usr/bin/docker-registry"
INSTALL_HINT = (
    "the image store's tests run a real registry: `apt-get install -y docker-registry` "
    "(scripts/test.sh installs it)"
)


class LocalRegistry:
    """``docker-registry serve`` on 127.0.0.1:<free port>, storage in ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        if shutil.which(REGISTRY_BIN) is None:
            pytest.fail(f"{REGISTRY_BIN} is missing: {INSTALL_HINT}")
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.host}"
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "config.yml"
        config.write_text(
            "version: 0.1\n"
            "log: {level: warn, accesslog: {disabled: true}}\n"
            f"storage: {{filesystem: {{rootdirectory: {workdir / 'data'}}}, "
            "delete: {enabled: true}}\n"
            f"http: {{addr: '{self.host}', secret: {secrets.token_hex(8)}}}\n"
        )
        self._log = (workdir / "registry.log").open("wb")
        self._proc = subprocess.Popen(
            [REGISTRY_BIN, "serve", str(config)], stdout=self._log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{self.url}/v2/", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log = (workdir / "registry.log").read_text(errors="replace")
                raise RuntimeError(f"docker-registry did not start: {log[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()

    def push(self, image: str, repo_tag: str) -> str:
        """``docker push`` local ``image`` as ``<registry>/repo_tag``: its manifest digest."""
        target = f"{self.host}/{repo_tag}"
        docker("tag", image, target)
        try:
            docker("push", target)
        finally:
            docker("rmi", target, check=False)  # the tag only: ``image`` keeps its own
        repo, _, tag = repo_tag.partition(":")
        return self.manifest(repo, tag or "latest")[1]

    def manifest(self, repo: str, reference: str) -> tuple[dict[str, Any], str]:
        """(manifest JSON, digest) as the registry serves it."""
        accept = (
            "application/vnd.docker.distribution.manifest.v2+json, "
            "application/vnd.oci.image.manifest.v1+json"
        )
        response = httpx.get(
            f"{self.url}/v2/{repo}/manifests/{reference}", headers={"Accept": accept}
        )
        response.raise_for_status()
        return response.json(), "sha256:" + hashlib.sha256(response.content).hexdigest()

    def put_manifest(self, repo: str, reference: str, doc: dict[str, Any]) -> str:
        """PUT a manifest or index document: its digest."""
        body = json.dumps(doc).encode()
        response = httpx.put(
            f"{self.url}/v2/{repo}/manifests/{reference}",
            content=body,
            headers={"Content-Type": doc["mediaType"]},
        )
        if response.status_code >= 300:
            raise RuntimeError(f"PUT manifest: {response.status_code} {response.text}")
        return "sha256:" + hashlib.sha256(body).hexdigest()


class RegistryProxy:
    """An HTTP front of a registry: asks for a bearer token of its own token endpoint
    (``/token``) and checks it; on request, cuts blob downloads short or corrupts them."""

    def __init__(self, upstream: str, *, auth: bool = True) -> None:
        self.upstream = upstream
        self.auth = auth
        self.tokens: list[str] = []  # issued
        self.token_queries: list[dict[str, list[str]]] = []
        self.requests: list[tuple[str, dict[str, str]]] = []  # (path, headers)
        self.cut_blobs_after: int | None = None  # send this many bytes of a blob, then close
        self.cut_times = 0  # how many blob downloads to cut (then serve whole)
        self.corrupt_blobs = False
        self.rewrite_manifests = False
        self._client = httpx.Client(timeout=30)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                proxy._handle(self)

            def do_HEAD(self) -> None:
                proxy._handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.host = f"127.0.0.1:{self._server.server_address[1]}"
        self.url = f"http://{self.host}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()

    def blob_requests(self) -> list[dict[str, str]]:
        return [h for p, h in self.requests if "/blobs/" in p]

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        url = urlsplit(req.path)
        headers = {k.lower(): v for k, v in req.headers.items()}
        if url.path == "/token":
            token = secrets.token_hex(16)
            self.tokens.append(token)
            self.token_queries.append(parse_qs(url.query))
            self._send(
                req,
                200,
                {"Content-Type": "application/json"},
                json.dumps({"token": token}).encode(),
            )
            return
        self.requests.append((url.path, headers))
        if self.auth and headers.get("authorization", "") not in {
            f"Bearer {t}" for t in self.tokens
        }:
            repo = url.path.removeprefix("/v2/").rsplit("/", 2)[0]
            challenge = f'Bearer realm="{self.url}/token",service="orchard-test"'
            if url.path != "/v2/":
                challenge += f',scope="repository:{repo}:pull"'
            body = b'{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}'
            self._send(
                req, 401, {"WWW-Authenticate": challenge, "Content-Type": "application/json"}, body
            )
            return
        forward = {k: v for k, v in headers.items() if k in ("accept", "range")}
        upstream = self._client.request(req.command, self.upstream + req.path, headers=forward)
        body = upstream.content
        out = {
            k: v
            for k, v in upstream.headers.items()
            if k.lower()
            in ("content-type", "docker-content-digest", "content-range", "accept-ranges")
        }
        if "/manifests/" in url.path and self.rewrite_manifests:
            body = body.replace(b"{", b"{ ", 1)  # the same document, another digest
        if "/blobs/" in url.path and req.command == "GET" and upstream.status_code < 300:
            if self.corrupt_blobs and body:
                middle = len(body) // 2
                body = body[:middle] + bytes([body[middle] ^ 0xFF]) + body[middle + 1 :]
            if self.cut_times and self.cut_blobs_after is not None and len(body) > 4096:
                self.cut_times -= 1
                self._send(req, upstream.status_code, out, body, cut=self.cut_blobs_after)
                return
        self._send(req, upstream.status_code, out, body)

    @staticmethod
    def _send(
        req: BaseHTTPRequestHandler,
        status: int,
        headers: dict[str, str],
        body: bytes,
        cut: int | None = None,
    ) -> None:
        req.send_response(status)
        for key, value in headers.items():
            req.send_header(key, value)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        if req.command == "HEAD":
            return
        if cut is None:
            req.wfile.write(body)
            return
        req.wfile.write(body[:cut])
        req.wfile.flush()
        req.close_connection = True
        req.connection.shutdown(socket.SHUT_RDWR)


def index_document(media_type: str, entries: list[tuple[str, int, str, str]]) -> dict[str, Any]:
    """A manifest list / OCI index of (manifest media type, size, digest, "os/arch")."""
    manifests = []
    for manifest_type, size, digest, platform in entries:
        os_name, _, arch = platform.partition("/")
        manifests.append(
            {
                "mediaType": manifest_type,
                "size": size,
                "digest": digest,
                "platform": {"os": os_name, "architecture": arch},
            }
        )
    return {"schemaVersion": 2, "mediaType": media_type, "manifests": manifests}
