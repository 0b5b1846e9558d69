"""Pulls over the OCI distribution API (Docker registries, registry mirrors).

Anonymous only: a registry that answers ``401`` with a ``Bearer`` challenge gets a token
from the challenge's realm for ``repository:<name>:pull``. Manifest lists and OCI indexes
resolve to this machine's ``linux/<arch>`` entry. Every manifest and blob is checked
against its digest (and declared size) before the store names it; a blob download is
kept in ``tmp/<hex>.partial`` and continued with a ``Range`` request, within a pull after
a dropped connection and by the next pull after a failed one.

A pull may be asked for by an API user, so what a registry answers is not trusted:

- **Addresses.** Before a request to the registry, to a token realm or to a redirect's
  target, its host is resolved and refused when any of its addresses is loopback,
  private, link-local, multicast, unspecified, reserved or shared (an IPv6 address that
  embeds an IPv4 one counts as that one), unless the operator named that host: the
  registry of an ``insecure`` pull, the mirror in use (``host`` or ``host:port`` as
  written), or every host for ``allow_private`` (the operator's own ``image pull``).
- **Schemes.** A token realm, and a redirect, is https; plain http only to the host the
  registry itself is reached on over plain http (an insecure registry, an http mirror).
- **Redirects** are followed here, at most ``MAX_REDIRECTS``, each target checked as
  above; the ``Authorization`` header goes only to the origin it was meant for.
- **Bounded reads.** Every request asks for ``Accept-Encoding: identity`` and an answer
  with any other ``Content-Encoding`` is refused, never decoded (a few kB of gzip can
  expand to gigabytes). Manifests, indexes and configs are read up to
  ``MAX_DOCUMENT_BYTES``, token answers ``MAX_TOKEN_BYTES``, error bodies
  ``MAX_ERROR_BYTES``; a blob stops at its descriptor's size.
- **Messages.** An error quotes a registry's JSON ``errors[].code/message`` (truncated),
  never other body text (an internal service's page must not reach an API user), else
  the status code and its reason.
- **Deadline.** ``timeout`` bounds the whole pull: no request waits past it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from .addresses import is_public_address
from .blobs import Blobs
from .errors import BadImage, ImageError, ImageNotFound, RegistryError
from .model import (
    DOCKER_LIST,
    DOCKER_MANIFEST,
    INDEX_TYPES,
    MAX_DOCUMENT_BYTES,
    OCI_INDEX,
    OCI_MANIFEST,
    Descriptor,
    Manifest,
    NewImage,
    ParsedConfig,
    ProgressCallback,
    choose_manifest,
    load_json,
)
from .reference import DOCKER_HUB, Reference

DOCKER_HUB_API = "https://registry-1.docker.io"
_HUB_ALIASES = {"index.docker.io", "registry-1.docker.io", "registry.hub.docker.com"}
MANIFEST_ACCEPT = ", ".join((OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST))
PARALLEL_DOWNLOADS = 3
ATTEMPTS = 4  # per blob: the first try and three continuations after a dropped connection
MAX_REDIRECTS = 5
MAX_TOKEN_BYTES = 1 << 20
MAX_ERROR_BYTES = 64 << 10
MAX_MESSAGE_CHARS = 200  # of a registry's own error message, as quoted in ours
READ_TIMEOUT = 60.0
CONNECT_TIMEOUT = 10.0
_CHUNK = 1 << 20
_PARAM = re.compile(r'(\w+)=(?:"([^"]*)"|([^,\s]*))')


def canonical_registry(name: str) -> str:
    """A registry host as references name it: lowercase, Docker Hub's aliases as
    ``docker.io``."""
    host = name.strip().lower()
    return DOCKER_HUB if host in _HUB_ALIASES else host


def pull(
    ref: Reference,
    blobs: Blobs,
    *,
    insecure: bool = False,
    mirrors: Mapping[str, str] | None = None,
    progress: ProgressCallback | None = None,
    allow_private: bool = False,
    timeout: float | None = None,
) -> NewImage:
    """Fetch ``ref``'s manifest, config and layers into ``blobs``; the image to record.

    ``allow_private``: any host may be reached (the operator's own pull), else only public
    addresses and the hosts the operator named (see the module doc). ``timeout``: seconds
    the whole pull may take (None: no limit)."""
    try:
        return _pull(ref, blobs, insecure, mirrors, progress, allow_private, timeout)
    except RecursionError:  # json.loads of a document nested thousands deep
        raise BadImage(f"{ref}: a manifest or config is nested too deeply") from None


def _pull(
    ref: Reference,
    blobs: Blobs,
    insecure: bool,
    mirrors: Mapping[str, str] | None,
    progress: ProgressCallback | None,
    allow_private: bool,
    timeout: float | None,
) -> NewImage:
    with Registry(
        ref, insecure=insecure, mirrors=mirrors, allow_private=allow_private, timeout=timeout
    ) as registry:
        body, top = registry.manifest(ref.digest or ref.tag or "latest")
        blobs.put_bytes(body, top)
        stored = [top]
        doc = load_json(body, f"manifest of {ref}")
        digest = top
        if doc.get("mediaType") in INDEX_TYPES or "manifests" in doc:
            desc = choose_manifest(doc, f"manifest list of {ref}")
            body, digest = registry.manifest(desc.digest)
            if len(body) != desc.size:
                raise BadImage(f"manifest {desc.digest}: {len(body)} bytes, {desc.size} declared")
            blobs.put_bytes(body, digest)
            stored.append(digest)
        manifest = Manifest.parse(body, f"manifest {digest}")
        for layer in manifest.layers:
            if "zstd" in layer.media_type:
                raise BadImage(f"layer {layer.digest}: zstd-compressed layers are not supported")
            if "foreign" in layer.media_type:
                raise BadImage(f"layer {layer.digest}: a foreign (Windows) layer")
        if manifest.config.size > MAX_DOCUMENT_BYTES:
            raise BadImage(f"config {manifest.config.digest} is larger than {MAX_DOCUMENT_BYTES}")
        registry.fetch_blob(manifest.config, blobs)
        config = ParsedConfig.parse(blobs.read(manifest.config.digest))
        if len(config.diff_ids) != len(manifest.layers):
            raise BadImage(f"manifest {digest}: layers and the config's diff_ids differ")
        registry.fetch_layers(manifest.layers, blobs, progress)
        return NewImage(
            config=manifest.config.digest,
            manifest=digest,
            manifest_digest=top,
            blobs=(*stored, manifest.config.digest, *(d.digest for d in manifest.layers)),
            size_bytes=sum(d.size for d in manifest.layers),
        )


class Registry:
    """One repository of one registry, for the length of a pull."""

    def __init__(
        self,
        ref: Reference,
        *,
        insecure: bool,
        mirrors: Mapping[str, str] | None,
        allow_private: bool = False,
        timeout: float | None = None,
    ) -> None:
        self._repo = ref.repository
        self._host = ref.registry
        mirror = _mirror_for(ref.registry, mirrors or {})
        # Hosts the operator named, reached whatever their addresses: (host, port), port
        # None when written without one (then any port of the host).
        self._trusted: set[tuple[str, int | None]] = set()
        if mirror is not None:
            self._bases = [mirror]
            self._trusted.add(_host_port(mirror))
        elif ref.registry == DOCKER_HUB:
            self._bases = [DOCKER_HUB_API]
        elif insecure:
            self._bases = [f"https://{ref.registry}", f"http://{ref.registry}"]
            self._trusted.add(_host_port(f"http://{ref.registry}"))
        else:
            self._bases = [f"https://{ref.registry}"]
        self._allow_private = allow_private
        self._public: set[tuple[str, int]] = set()  # hosts found public in this pull
        self._timeout = timeout
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._client = httpx.Client(
            follow_redirects=False,  # followed by ``_request``, each target checked
            timeout=httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT),
            verify=not insecure,
            headers={"User-Agent": "orchard-env", "Accept-Encoding": "identity"},
        )
        self._base: str | None = None
        self._plain_host: str | None = None  # the registry's host when reached over http
        self._token: str | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()

    # -- limits

    def _check_deadline(self) -> None:
        if self._deadline is not None and time.monotonic() >= self._deadline:
            raise RegistryError(
                f"the pull from {self._host} did not finish within {self._timeout:g} s "
                "(the server's pull timeout)"
            )

    def _request_timeout(self) -> httpx.Timeout:
        """Per-request timeouts, never past the pull's deadline."""
        self._check_deadline()
        if self._deadline is None:
            return httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT)
        left = max(self._deadline - time.monotonic(), 0.001)
        return httpx.Timeout(min(READ_TIMEOUT, left), connect=min(CONNECT_TIMEOUT, left))

    def _check_target(self, url: httpx.URL, what: str) -> None:
        """Refuse ``url`` unless its scheme is allowed and its host is public or trusted
        (raises ``RegistryError`` before any connection to it)."""
        if url.scheme == "http":
            if self._plain_host is None or url.host != self._plain_host:
                raise RegistryError(
                    f"{what}: refused plain-http URL {_show(url)}: only https, or http to "
                    "the host of a registry that is itself reached over http"
                )
        elif url.scheme != "https":
            raise RegistryError(f"{what}: refused URL {_show(url)}: not http(s)")
        if not url.host:
            raise RegistryError(f"{what}: refused URL {_show(url)}: no host")
        if self._allow_private or self._is_trusted(url):
            return
        port = url.port or (443 if url.scheme == "https" else 80)
        if (url.host, port) in self._public:
            return
        try:
            found = socket.getaddrinfo(url.host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            raise RegistryError(f"{what}: cannot resolve host {url.host}") from None
        addresses = {str(info[4][0]) for info in found}
        if not addresses or not all(is_public_address(a) for a in addresses):
            raise RegistryError(
                f"{what}: refused host {url.host}: it has a loopback, private or other "
                "non-public address, and the operator did not name it (an insecure "
                "registry or a mirror; `orchard-env image pull` may pull from anywhere)"
            )
        self._public.add((url.host, port))

    def _is_trusted(self, url: httpx.URL) -> bool:
        return (url.host, None) in self._trusted or (url.host, url.port) in self._trusted

    # -- requests

    @contextlib.contextmanager
    def _request(
        self, url: httpx.URL, headers: Mapping[str, str], what: str
    ) -> Iterator[httpx.Response]:
        """A streamed GET of ``url``, redirects followed here (each target checked, the
        ``Authorization`` header kept only for the origin it was meant for)."""
        sent = dict(headers)
        for _ in range(MAX_REDIRECTS + 1):
            self._check_target(url, what)
            with self._client.stream(
                "GET", url, headers=sent, timeout=self._request_timeout()
            ) as response:
                if not response.is_redirect:
                    yield response
                    return
                try:
                    target = url.join(response.headers["location"])
                except httpx.InvalidURL:
                    raise RegistryError(f"{what}: a redirect to an invalid URL") from None
            if (target.scheme, target.host, target.port) != (url.scheme, url.host, url.port):
                sent.pop("Authorization", None)
            url = target
        raise RegistryError(f"{what}: more than {MAX_REDIRECTS} redirects")

    def _connect(self) -> str:
        """The base URL that answers ``/v2/`` (https first when plain http is allowed too),
        with a token already fetched when it asks for one."""
        if self._base is not None:
            return self._base
        failures = []
        message = ""
        for base in self._bases:
            url = httpx.URL(f"{base}/v2/")
            self._plain_host = url.host if url.scheme == "http" else None
            try:
                with self._request(url, {}, f"registry {self._host}") as response:
                    status = response.status_code
                    challenge = response.headers.get("www-authenticate", "")
                    if status not in (200, 401):
                        message = self._describe(response)
            except httpx.TransportError as exc:
                self._check_deadline()
                failures.append(f"{base}: {_reason(exc)}")
                continue
            if status == 401:
                self._authenticate(challenge)
            elif status != 200:
                raise RegistryError(f"{base}/v2/ answered {message}: is it a registry?")
            self._base = base
            return base
        plain_http = any(b.startswith("http://") for b in self._bases)
        hint = "" if plain_http else " (a registry on plain http needs --insecure)"
        raise RegistryError(f"cannot reach registry {self._host}: {'; '.join(failures)}{hint}")

    def _authenticate(self, challenge: str) -> None:
        scheme, _, params = challenge.partition(" ")
        if scheme.lower() != "bearer":
            raise RegistryError(
                f"registry {self._host} asks for credentials ({scheme or 'no challenge'}); "
                "only anonymous pulls are supported"
            )
        fields = {m.group(1).lower(): m.group(2) or m.group(3) for m in _PARAM.finditer(params)}
        realm = fields.get("realm", "")
        try:
            url = httpx.URL(realm)
        except httpx.InvalidURL:
            url = None
        if url is None or url.scheme not in ("https", "http") or not url.host:
            raise RegistryError(f"registry {self._host}: invalid token realm {realm[:200]!r}")
        query = {"scope": f"repository:{self._repo}:pull"}
        if fields.get("service"):
            query["service"] = fields["service"]
        url = url.copy_merge_params(query)
        what = f"the token service {_show(url)} of registry {self._host}"
        try:
            with self._request(url, {}, what) as answer:
                if answer.status_code != 200:
                    raise RegistryError(f"{what} answered {self._describe(answer)}")
                body = self._read(answer, MAX_TOKEN_BYTES, what, RegistryError)
        except httpx.TransportError as exc:
            self._check_deadline()
            raise RegistryError(f"cannot reach {what}: {_reason(exc)}") from None
        try:
            doc = json.loads(body)
            token = doc.get("token") or doc.get("access_token")
        except (ValueError, AttributeError, RecursionError):
            token = None
        if not isinstance(token, str) or not token:
            raise RegistryError(f"{what} gave no token")
        self._token = token

    @contextlib.contextmanager
    def _get(self, path: str, headers: dict[str, str]) -> Iterator[httpx.Response]:
        """A streamed GET of ``/v2/<repo>/<path>``, authenticated (again, once, on a 401)."""
        base = self._connect()
        url = httpx.URL(f"{base}/v2/{self._repo}/{path}")
        for attempt in range(2):
            sent = dict(headers)
            if self._token:
                sent["Authorization"] = f"Bearer {self._token}"
            try:
                with self._request(url, sent, f"registry {self._host}") as response:
                    if response.status_code != 401 or attempt == 1:
                        yield response
                        return
                    challenge = response.headers.get("www-authenticate", "")
            except httpx.TransportError as exc:
                self._check_deadline()
                raise _Dropped(f"{_show(url)}: {_reason(exc)}") from exc
            with self._lock:
                self._authenticate(challenge)
        raise AssertionError("unreachable")

    def _read(
        self,
        response: httpx.Response,
        cap: int,
        what: str,
        error: Callable[[str], ImageError] = BadImage,
    ) -> bytes:
        """The body of ``response``, read raw up to ``cap`` bytes (``error`` beyond)."""
        _identity(response, what)
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            raise error(f"{what} is larger than {cap} bytes")
        body = bytearray()
        for chunk in response.iter_raw():
            self._check_deadline()
            body += chunk
            if len(body) > cap:
                raise error(f"{what} is larger than {cap} bytes")
        return bytes(body)

    def _describe(self, response: httpx.Response) -> str:
        """``<status> <reason>``, with the registry's JSON error messages when it sent
        some: never other body text."""
        status = f"{response.status_code} {response.reason_phrase}".strip()
        try:
            body = self._read(response, MAX_ERROR_BYTES, "an error body", RegistryError)
        except RegistryError:
            return status
        message = _registry_message(body)
        return f"{status}: {message}" if message else status

    def _check(self, response: httpx.Response, what: str) -> None:
        if response.status_code not in (200, 206):
            raise RegistryError(f"{what}: the registry answered {self._describe(response)}")

    def manifest(self, reference: str) -> tuple[bytes, str]:
        """(body, digest) of a manifest or index, checked when ``reference`` is a digest
        and against the registry's ``Docker-Content-Digest``."""
        what = f"manifest {self._repo}:{reference}"
        try:
            with self._get(f"manifests/{reference}", {"Accept": MANIFEST_ACCEPT}) as response:
                if response.status_code == 404:
                    raise ImageNotFound(
                        f"{self._host}/{self._repo}:{reference} is not in its registry: "
                        f"{self._describe(response)}"
                    )
                self._check(response, what)
                body = self._read(response, MAX_DOCUMENT_BYTES, what)
                header = response.headers.get("docker-content-digest", "")
        except _Dropped as exc:
            raise RegistryError(f"registry {self._host}: {exc}") from None
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if reference.startswith("sha256:") and digest != reference:
            raise BadImage(f"manifest {reference}: the registry sent content of digest {digest}")
        if header.startswith("sha256:") and header != digest:
            raise BadImage(
                f"manifest {reference}: content of digest {digest}, header says {header}"
            )
        return body, digest

    # -- blobs

    def fetch_layers(
        self, layers: tuple[Descriptor, ...], blobs: Blobs, progress: ProgressCallback | None
    ) -> None:
        lock = threading.Lock()

        def report(what: str, done: int, total: int | None) -> None:
            if progress is not None:
                with lock:
                    progress(what, done, total)

        unique = {d.digest: d for d in layers}.values()
        missing = [d for d in unique if not blobs.has(d.digest)]
        for d in unique:
            if d not in missing:
                report(f"layer {d.digest[7:19]}", d.size, d.size)
        if not missing:
            return
        with ThreadPoolExecutor(min(PARALLEL_DOWNLOADS, len(missing))) as pool:
            for future in [pool.submit(self.fetch_blob, d, blobs, report) for d in missing]:
                future.result()

    def fetch_blob(
        self, desc: Descriptor, blobs: Blobs, progress: ProgressCallback | None = None
    ) -> None:
        """Blob ``desc`` into the store (continuing a partial download), checked."""
        if blobs.has(desc.digest):
            return
        partial = blobs.tmp / f"{desc.digest[7:]}.partial"
        with _locked_partial(partial) as fd:
            if blobs.has(desc.digest):  # another pull finished it while we waited
                return
            self._download(desc, fd, progress)
            if os.fstat(fd).st_size != desc.size or _hash_fd(fd) != desc.digest:
                os.unlink(partial)
                raise BadImage(f"blob {desc.digest}: the registry sent different content")
            blobs.commit(partial, desc.digest)

    def _download(self, desc: Descriptor, fd: int, progress: ProgressCallback | None) -> None:
        what = f"layer {desc.digest[7:19]}"
        for attempt in range(ATTEMPTS):
            self._check_deadline()
            have = os.fstat(fd).st_size
            if have > desc.size:
                os.ftruncate(fd, 0)
                have = 0
            if have == desc.size:
                return
            headers = {"Range": f"bytes={have}-"} if have else {}
            try:
                with self._get(f"blobs/{desc.digest}", headers) as response:
                    if response.status_code == 416:
                        os.ftruncate(fd, 0)  # the registry disagrees with what we have
                        continue
                    if response.status_code == 404:
                        raise RegistryError(f"blob {desc.digest} is not in the registry")
                    self._check(response, f"blob {desc.digest}")
                    _identity(response, f"blob {desc.digest}")
                    if response.status_code != 206 or not _continues(response, have):
                        os.ftruncate(fd, 0)  # a 200: the whole blob from its start
                        have = 0
                    os.lseek(fd, have, os.SEEK_SET)
                    for chunk in response.iter_raw():
                        self._check_deadline()
                        have += len(chunk)
                        if have > desc.size:
                            os.ftruncate(fd, 0)
                            raise BadImage(
                                f"blob {desc.digest}: the registry sent more than the "
                                f"{desc.size} bytes its descriptor declares"
                            )
                        _write_all(fd, chunk)
                        if progress is not None:
                            progress(what, have, desc.size)
                return
            except (_Dropped, httpx.TransportError) as exc:
                self._check_deadline()
                if attempt == ATTEMPTS - 1:
                    raise RegistryError(
                        f"download of blob {desc.digest} failed {ATTEMPTS} times "
                        f"({os.fstat(fd).st_size} of {desc.size} bytes kept for the next "
                        f"pull): {_reason(exc)}"
                    ) from None
                time.sleep(0.5 * (attempt + 1))


class _Dropped(Exception):
    """A request that failed in transport (continued with Range when it was a blob)."""


def _mirror_for(registry: str, mirrors: Mapping[str, str]) -> str | None:
    for name, url in mirrors.items():
        if canonical_registry(name) == registry.lower():
            if not url.startswith(("http://", "https://")):
                raise RegistryError(f"mirror of {registry}: {url!r} is not an http(s) URL")
            return url.rstrip("/")
    return None


def _host_port(url: str) -> tuple[str, int | None]:
    """(host, port as written or None) of an http(s) URL."""
    parsed = httpx.URL(url)
    return parsed.host, parsed.port


def _show(url: httpx.URL) -> str:
    """``url`` for a message: without its user info and query."""
    return str(url.copy_with(userinfo=b"", query=None))[:200]


def _identity(response: httpx.Response, what: str) -> None:
    """Refuse an answer in a ``Content-Encoding`` we did not ask for (none is decoded)."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise RegistryError(
            f"{what}: the registry answered with Content-Encoding {encoding[:40]!r} though "
            "asked for identity (compressed answers are refused, never decoded)"
        )


@contextlib.contextmanager
def _locked_partial(path: Path) -> Iterator[int]:
    """An fd of ``path`` with its flock held; the file is still ``path`` (not renamed or
    removed by whoever held the lock before)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield fd
    finally:
        os.close(fd)


def _hash_fd(fd: int) -> str:
    hasher = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, _CHUNK):
        hasher.update(chunk)
    return "sha256:" + hasher.hexdigest()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _continues(response: httpx.Response, have: int) -> bool:
    """Whether a 206 answers ``bytes=have-`` (its Content-Range starts there)."""
    match = re.match(r"bytes (\d+)-", response.headers.get("content-range", ""))
    return match is not None and int(match.group(1)) == have


def _registry_message(body: bytes) -> str:
    """The registry's own words, ``{"errors": [{"code", "message"}]}``, truncated; "" when
    the body is not that."""
    try:
        doc: Any = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    errors = doc.get("errors") if isinstance(doc, dict) else None
    if not isinstance(errors, list):
        return ""
    parts = []
    for e in errors:
        if isinstance(e, dict):
            text = f"{e.get('code', '')}: {e.get('message', '')}".strip(": ")
            parts.append("".join(c if c.isprintable() else " " for c in text))
    message = "; ".join(p for p in parts if p)
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[: MAX_MESSAGE_CHARS - 1] + "…"
    return message


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED:
        return "connection refused"
    return text
