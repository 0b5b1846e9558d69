"""The few Kubernetes API calls the backend makes, async, through the official client.

The official client is synchronous, so calls run on a small thread pool and watches each
get a thread that feeds the event loop. Answers are taken as raw JSON
(``_preload_content=False``): the backend reads a handful of fields, and building the
client's model objects for every pod event would cost more CPU than everything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from .base import BackendError

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


def load_configuration(kubeconfig: Path | None) -> client.Configuration:
    """``kubeconfig`` when given; in a pod, the in-cluster config; else $KUBECONFIG / ~/.kube."""
    cfg = client.Configuration()
    try:
        if kubeconfig is not None:
            config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
        else:
            config.load_kube_config(client_configuration=cfg)
    except (config.ConfigException, OSError, TypeError, ValueError) as exc:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise BackendError(
            f"no usable Kubernetes configuration ({where}): {exc}; give --kubeconfig PATH "
            "or run the orchestrator in a pod"
        ) from exc
    return cfg


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

    async def delete(self, kind: str, name: str) -> bool:
        """Delete one object (the pod's own grace period applies); False when already gone."""
        try:
            await self._call(
                self._method("delete", kind), name, self.namespace, propagation_policy="Background"
            )
        except KubeError as exc:
            if exc.not_found:
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
