"""The few Kubernetes API calls the backend makes, async, through the official client.

The official client is synchronous, so calls run on a small thread pool and watches each
get a thread that feeds the event loop. Answers are taken as raw JSON
(``_preload_content=False``): the backend reads a handful of fields, and building the
client's model objects for every pod event would cost more CPU than everything else.

The TLS material of a kubeconfig (inline CA, client certificate and key) has to be files
for the TLS library; ``CredentialFiles`` keeps them in a private directory the backend
removes when it closes, instead of the client's own temp files in ``$TMPDIR``, which it
removes only at interpreter exit (never, for a server stopped by a signal).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config import kube_config

from ..base import BackendError

log = logging.getLogger("orchard_env_server")


class KubeError(Exception):
    """An API call failed; ``status`` is the HTTP status (0 when the server was not reached)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def gone(self) -> bool:
        return self.status == 410


_LOCK_NAME = ".lock"  # flock-ed by the process using the directory
_UNLOCKED_GRACE_S = 60.0  # a directory without a lock file yet may be one being made
_REGISTRY_LOCK = threading.Lock()
_SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class CredentialFiles:
    """A private directory (0700, one per process) for the TLS files of a kubeconfig.

    The official client writes inline ``certificate-authority-data``,
    ``client-certificate-data`` and ``client-key-data`` to files, since TLS libraries load
    them from paths on every new connection; by default as ``$TMPDIR/tmpXXXXXXXX``, removed
    only by an ``atexit`` hook that a server ended by a signal never runs. Here they go to
    ``root/<random>/`` (files 0600 from ``mkstemp``), a lock file in it ``flock``-ed while
    the process uses it. ``remove()`` deletes the directory; ``create()`` first deletes the
    directories under ``root`` whose lock nobody holds: those of processes that died.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path: Path | None = None
        self._lock_fd: int | None = None

    def create(self) -> Path:
        """Sweep what dead processes left, then make and lock this process's directory."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        self.sweep()
        path = Path(tempfile.mkdtemp(prefix="p-", dir=self.root))  # 0700
        fd = os.open(path / _LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.path, self._lock_fd = path, fd
        return path

    def sweep(self) -> list[Path]:
        """Delete the directories under ``root`` that no living process holds."""
        removed = []
        with contextlib.suppress(FileNotFoundError):
            for entry in self.root.iterdir():
                if entry == self.path or entry.is_symlink() or not entry.is_dir():
                    continue
                if _abandoned(entry):
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(entry)
        if removed:
            log.info("removed %d credential directories of dead orchestrators", len(removed))
        return removed

    def remove(self) -> None:
        """Delete this process's directory and everything the client wrote into it."""
        if self.path is None:
            return
        _forget_client_temp_files(self.path)
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
        self.path = self._lock_fd = None


def _abandoned(directory: Path) -> bool:
    try:
        fd = os.open(directory / _LOCK_NAME, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            return time.time() - directory.stat().st_mtime > _UNLOCKED_GRACE_S
        return False
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # its process is alive
    finally:
        os.close(fd)  # releases the lock, if it was taken
    return True


def _forget_client_temp_files(directory: Path) -> None:
    """Drop the client's registry entries for files in ``directory``, so that no later
    config load is handed a cached path there (the client reuses files by content)."""
    registry = getattr(kube_config, "_temp_files", None)
    if isinstance(registry, dict):
        for key, name in list(registry.items()):
            if Path(str(name)).parent == directory:
                registry.pop(key, None)


def load_configuration(
    kubeconfig: Path | None, credentials: CredentialFiles | None = None
) -> client.Configuration:
    """``kubeconfig`` when given; in a pod, the in-cluster config; else $KUBECONFIG / ~/.kube.

    With ``credentials``, a kubeconfig's inline TLS data is written to its directory
    (created here), not to ``$TMPDIR``; the caller removes it when done with the client.
    """
    cfg = client.Configuration()
    try:
        if _in_cluster(kubeconfig):
            config.load_incluster_config(client_configuration=cfg)  # files of the pod: no copies
        else:
            path = None if kubeconfig is None else str(kubeconfig)
            _load_kube_config(path, cfg, None if credentials is None else credentials.create())
    except (config.ConfigException, OSError, TypeError, ValueError) as exc:
        if credentials is not None:
            credentials.remove()
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise BackendError(
            f"no usable Kubernetes configuration ({where}): {exc}; give --kubeconfig PATH "
            "or run the orchestrator in a pod"
        ) from exc
    return cfg


def _in_cluster(kubeconfig: Path | None) -> bool:
    return kubeconfig is None and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def in_cluster_namespace(kubeconfig: Path | None) -> str | None:
    """The namespace of the pod this process runs in, when it uses the in-cluster config
    (as ``load_configuration`` decides); None outside the cluster."""
    if not _in_cluster(kubeconfig):
        return None
    try:
        return (_SERVICE_ACCOUNT / "namespace").read_text().strip() or None
    except OSError:
        return None


def _load_kube_config(path: str | None, cfg: client.Configuration, files: Path | None) -> None:
    if files is None:
        config.load_kube_config(config_file=path, client_configuration=cfg)
        return
    # The client caches its temp files by content in a module-wide registry: an earlier
    # load of the same kubeconfig would hand out its file, outside ``files``. Load with an
    # empty registry of our own, so that every file lands in ``files`` and is ours alone.
    with _REGISTRY_LOCK:
        outer = getattr(kube_config, "_temp_files", None)
        if isinstance(outer, dict):
            kube_config._temp_files = {}
        try:
            config.load_kube_config(
                config_file=path, client_configuration=cfg, temp_file_path=str(files)
            )
        finally:
            if isinstance(outer, dict):
                kube_config._temp_files = outer


def _error(exc: BaseException) -> KubeError:
    if isinstance(exc, ApiException):
        message = exc.reason or ""
        with contextlib.suppress(Exception):
            message = json.loads(exc.body).get("message") or message
        return KubeError(int(exc.status or 0), f"{exc.status} {message}")
    return KubeError(0, f"the API server is unreachable: {exc}")


class KubeApi:
    """Namespaced calls on pods, secrets and network policies."""

    def __init__(self, configuration: client.Configuration, namespace: str, workers: int = 16):
        configuration.connection_pool_maxsize = workers + 4
        self.namespace = namespace
        self.server = str(configuration.host)
        self._api = client.ApiClient(configuration)
        self._core = client.CoreV1Api(self._api)
        self._net = client.NetworkingV1Api(self._api)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="orchard-k8s")

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        def blocking() -> Any:
            response = fn(*args, _preload_content=False, _request_timeout=(5, 30), **kwargs)
            data = response.data
            return json.loads(data) if data else None

        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, blocking)
        except Exception as exc:
            raise _error(exc) from exc

    def _method(self, verb: str, kind: str) -> Callable[..., Any]:
        api = self._net if kind == "networkpolicies" else self._core
        singular = {"pods": "pod", "secrets": "secret", "networkpolicies": "network_policy"}
        return getattr(api, f"{verb}_namespaced_{singular[kind]}")

    async def create(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            self._method("create", kind), self.namespace, body
        )
        return result

    async def delete(
        self, kind: str, name: str, *, grace_period_s: int | None = None, uid: str | None = None
    ) -> bool:
        """Delete one object; False when already gone (or, given ``uid``, replaced by
        another of the same name). The pod's own grace period applies unless
        ``grace_period_s`` is given: 0 removes the pod from the API at once (a force
        delete), without waiting for the kubelet to confirm its containers stopped."""
        # All options go in the body: the API server reads DeleteOptions from the body when
        # there is one and ignores the query then (a grace period of 0 given as a query
        # parameter beside a uid precondition was silently a graceful delete).
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        options: dict[str, Any] = {"body": body}
        try:
            await self._call(self._method("delete", kind), name, self.namespace, **options)
        except KubeError as exc:
            if exc.not_found or (uid is not None and exc.status == 409):
                return False
            raise
        return True

    async def patch(self, kind: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            self._method("patch", kind), name, self.namespace, body
        )
        return result

    async def list_objects(self, kind: str, selector: str) -> tuple[list[dict[str, Any]], str]:
        """All matching objects and the list's resourceVersion to watch from."""
        data = await self._call(self._method("list", kind), self.namespace, label_selector=selector)
        return list(data.get("items") or []), str(data["metadata"]["resourceVersion"])

    async def read_api_server_object(self, kind: str) -> dict[str, Any] | None:
        """The ``kubernetes`` Service or Endpoints (``kind``) of namespace ``default``;
        None when there is none or the caller may not read it."""
        read = {
            "services": self._core.read_namespaced_service,
            "endpoints": self._core.read_namespaced_endpoints,
        }[kind]
        try:
            found: dict[str, Any] = await self._call(read, "kubernetes", "default")
        except KubeError as exc:
            if exc.not_found or exc.status == 403:
                return None
            raise
        return found

    async def nodes(self) -> list[dict[str, Any]]:
        """The cluster's nodes (needs cluster-wide read on nodes, which a namespaced Role lacks)."""
        data = await self._call(self._core.list_node)
        return list(data.get("items") or [])

    async def namespace_exists(self) -> bool | None:
        """True or False; None when the caller may not read namespaces (a namespaced Role)."""
        try:
            await self._call(self._core.read_namespace, self.namespace)
        except KubeError as exc:
            if exc.not_found:
                return False
            if exc.status == 403:
                return None
            raise
        return True

    async def watch(
        self, kind: str, selector: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[dict[str, Any]]:
        """Events after ``resource_version`` until the server ends the watch.

        A thread reads the chunked answer and hands each event to the loop; leaving the
        iteration early shuts the socket, which ends the thread.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[dict[str, Any] | BaseException | None] = asyncio.Queue()
        method = self._method("list", kind)
        holder: dict[str, Any] = {}

        def read() -> None:
            try:
                response = method(
                    self.namespace,
                    label_selector=selector,
                    watch=True,
                    resource_version=resource_version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=timeout_s,
                    _preload_content=False,
                    _request_timeout=(5, timeout_s + 30),
                )
                holder["response"] = response
                pending = b""
                for chunk in response.stream(amt=None, decode_content=True):
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        if line.strip():
                            loop.call_soon_threadsafe(queue.put_nowait, json.loads(line))
                loop.call_soon_threadsafe(queue.put_nowait, None)
            except BaseException as exc:  # handed to the loop, which decides
                loop.call_soon_threadsafe(queue.put_nowait, exc)

        thread = threading.Thread(target=read, name=f"orchard-k8s-watch-{kind}", daemon=True)
        thread.start()
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise _error(item) from item
                yield item
        finally:
            response = holder.get("response")
            if response is not None:
                with contextlib.suppress(Exception):
                    response.shutdown()
                with contextlib.suppress(Exception):
                    response.release_conn()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(Exception):
            self._api.close()
