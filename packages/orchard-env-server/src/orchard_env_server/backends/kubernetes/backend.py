"""The Kubernetes backend: one Pod per sandbox, served straight at its pod IP.

Nothing about a sandbox lives only in this process. The pod carries the record (labels and
a JSON annotation), a Secret the token; two watchers (LIST then WATCH, pods and token
Secrets of the namespace) keep every replica's view current, so any replica, or a
restarted one, serves any sandbox. Readiness comes from the watcher (the pod's Ready
condition, which the agent's readiness probe drives): ``wait_ready`` waits on an event.

Exec and file traffic go from the orchestrator to ``podIP:7000``; the API server sees
only create, delete and the watches.

Pods that have already ended are deleted with no grace period, and so is any pod still
there well past its grace period: on 1.20 a pod the kubelet failed at its deadline can
otherwise stay ``Terminating`` forever (see ``kubernetes.status.force_delete_reason``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import logging
import secrets
import socket
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

from ...quantities import parse_cpu, parse_memory
from ...records import AgentEndpoint, SandboxRecord
from ...settings import Settings
from ..base import (
    BackendError,
    BackendInfo,
    BackendUnavailable,
    Resources,
    SandboxExists,
    SandboxRegistry,
)
from .api import (
    CredentialFiles,
    KubeApi,
    KubeError,
    in_cluster_namespace,
    load_configuration,
)
from .network import (
    OrchestratorPlace,
    api_server_addresses,
    egress_policy_manifest,
    host_addresses,
    ingress_policy_manifest,
    replace_patch,
)
from .spec import (
    AGENT_PORT,
    ANNOTATION_LAST_ACTIVE,
    LABEL_ORCHESTRATOR,
    SANDBOX_SELECTOR,
    TOKEN_KEY,
    TOKEN_SELECTOR,
    label_value,
    network_policy_manifest,
    object_name,
    owner_reference,
    pod_manifest,
    record_from_pod,
    secret_manifest,
)
from .status import PodView, force_delete_reason, view_pod
from .watch import ResourceWatcher

log = logging.getLogger("orchard_env_server")

_SYNC_TIMEOUT_S = 30.0
_MAINTENANCE_EVERY_S = 5.0
_ORPHAN_GRACE_S = 60.0  # a token Secret whose pod has not appeared by then is garbage
# The kubelet's deadline counts from the pod's startTime, stored in whole seconds: it may
# come up to a second before the record's expires_at (more with a skewed node clock).
_EXPIRY_SLACK_S = 5.0


_FORCE_RETRY_S = 15.0
# On shutdown, how long this process's pods being deleted get to go by themselves before
# they are force-deleted: no maintenance pass runs after it to force them later.
_CLOSE_DRAIN_S = 5.0


@dataclass
class PodState:
    """What this replica knows of, and still has to do for, one sandbox pod (by name).

    An entry lives while any field holds something and is removed in one place,
    ``KubernetesBackend._prune``, once none does: the record of a sandbox this replica
    serves, its agent token (a Secret seen before its pod), readiness being awaited, a
    deletion to retry, or a pod being deleted that may need forcing.
    """

    record: SandboxRecord | None = None
    token: str | None = None
    creating: asyncio.Future[None] | None = None  # readiness awaited by create
    dead: str | None = None  # why the sandbox stopped serving
    doomed: bool = False  # a deletion to retry while the API is unreachable
    published: float = 0.0  # the last-active time last published on the pod
    expiring: bool = False  # the kubelet ended the pod at its deadline (ttl)
    deleting_since: float | None = None  # first seen being deleted (monotonic)
    forced_uid: str | None = None  # the incarnation force-deleted
    # When it was forced: a pod still there _FORCE_RETRY_S later is forced again (a
    # graceful delete that raced the force can leave it Terminating for good on 1.20).
    forced_at: float = 0.0

    def is_empty(self) -> bool:
        return (
            self.record is None
            and self.token is None
            and self.creating is None
            and self.dead is None
            and not self.doomed
            and not self.expiring
            and self.deleting_since is None
            and self.forced_uid is None
        )

    def clear_forced(self) -> None:
        self.forced_uid, self.forced_at = None, 0.0


class KubernetesBackend:
    """Sandboxes as pods in one namespace of a Kubernetes cluster."""

    name = "kubernetes"
    sandboxes_outlive_orchestrator = True  # they belong to the cluster, not to a replica
    supports_warm_pools = False
    reserved_ports: frozenset[int] = frozenset({AGENT_PORT})  # the agent listens in the pod

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._orchestrator = settings.kubernetes.orchestrator_id or socket.gethostname()
        self._api: KubeApi | None = None
        self._registry: SandboxRegistry | None = None
        self._states: dict[str, PodState] = {}  # by pod name
        self._credentials = CredentialFiles(settings.state_dir / "kubernetes" / "credentials")
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[object]] = set()
        self._pods: ResourceWatcher | None = None  # once started
        self._secrets: ResourceWatcher | None = None

    # -- per-pod state ----------------------------------------------------------------
    def _state(self, name: str) -> PodState:
        """The pod's entry, made on first use."""
        state = self._states.get(name)
        if state is None:
            state = self._states[name] = PodState()
        return state

    def _prune(self, name: str) -> None:
        """Drop the pod's entry once nothing is left in it (the only removal)."""
        state = self._states.get(name)
        if state is not None and state.is_empty():
            del self._states[name]

    def _records(self) -> Iterator[tuple[str, SandboxRecord]]:
        for name, state in list(self._states.items()):
            if state.record is not None:
                yield name, state.record

    def _record(self, name: str) -> SandboxRecord | None:
        state = self._states.get(name)
        return None if state is None else state.record

    def _watched_pod(self, name: str) -> dict[str, Any] | None:
        return self._pods.objects.get(name) if self._pods is not None else None

    @property
    def pods(self) -> ResourceWatcher:
        assert self._pods is not None, "start() first"
        return self._pods

    @property
    def token_secrets(self) -> ResourceWatcher:
        assert self._secrets is not None, "start() first"
        return self._secrets

    def attach(self, registry: SandboxRegistry) -> None:
        self._registry = registry

    @property
    def api(self) -> KubeApi:
        assert self._api is not None, "start() first"
        return self._api

    # -- start / stop ---------------------------------------------------------------
    async def start(self) -> list[SandboxRecord]:
        """Connect, list and watch; the kubeconfig's TLS files go to a private directory
        of the state dir (``CredentialFiles``) that ``close`` removes."""
        try:
            return await self._start()
        except BaseException:
            await self.close(delete_sandboxes=False)
            raise

    async def _start(self) -> list[SandboxRecord]:
        namespace = self._settings.kubernetes.namespace
        configuration = load_configuration(self._settings.kubernetes.kubeconfig, self._credentials)
        self._api = KubeApi(configuration, namespace)
        try:
            exists = await self.api.namespace_exists()
        except KubeError as exc:
            raise BackendError(
                f"cannot use the Kubernetes API at {self.api.server}: {exc}"
            ) from exc
        if exists is False:
            raise BackendError(
                f"namespace {namespace!r} does not exist: create it (kubectl create namespace "
                f"{namespace}) or apply infra/k8s, or pick another with --namespace"
            )
        await self._ensure_network_policies()
        self._secrets = ResourceWatcher(
            self.api, "secrets", TOKEN_SELECTOR, self._on_secret, self._on_secret_gone
        )
        self._pods = ResourceWatcher(
            self.api, "pods", SANDBOX_SELECTOR, self._on_pod, self._on_pod_gone
        )
        # Tokens first, so pods found on the first listing are served at once.
        for watcher in (self._secrets, self._pods):
            self._tasks.append(
                asyncio.create_task(watcher.run_forever(), name=f"k8s-{watcher.kind}")
            )
            try:
                await asyncio.wait_for(watcher.synced.wait(), _SYNC_TIMEOUT_S)
            except TimeoutError:
                raise BackendError(
                    f"could not list {watcher.kind} in namespace {namespace!r} within "
                    f"{_SYNC_TIMEOUT_S:g} s: {watcher.error}"
                ) from None
        self._tasks.append(asyncio.create_task(self._maintain_forever(), name="k8s-maintenance"))
        log.info(
            "kubernetes backend: %s, namespace %s, %d sandboxes found",
            self.api.server,
            namespace,
            sum(1 for _ in self._records()),
        )
        return []  # found sandboxes reach the service through the registry

    async def _ensure_network_policies(self) -> None:
        """Create the namespace's ingress and egress policies (``kubernetes.network``), or
        patch them to what this orchestrator sees: where it runs, the API server's
        addresses. Without them sandboxes would reach each other and the API server, so
        a failure here stops the start."""
        namespace = in_cluster_namespace(self._settings.kubernetes.kubeconfig)
        place = OrchestratorPlace(
            namespace=namespace, addresses=() if namespace else host_addresses()
        )
        try:
            service = await self.api.read_api_server_object("services")
            endpoints = await self.api.read_api_server_object("endpoints")
            api_server = api_server_addresses(service, endpoints, self.api.server)
            if service is None or endpoints is None:
                log.warning(
                    "the kubernetes Service or Endpoints of namespace default cannot be read "
                    "(missing, or no rights): sandboxes' egress excepts only %s",
                    ", ".join(api_server) or "nothing",
                )
            for manifest in (
                ingress_policy_manifest(place),
                egress_policy_manifest(place, api_server),
            ):
                name = manifest["metadata"]["name"]
                try:
                    await self.api.create("networkpolicies", manifest)
                except KubeError as exc:
                    if exc.status != 409:
                        raise
                    await self.api.patch("networkpolicies", name, replace_patch(manifest))
        except KubeError as exc:
            raise BackendError(
                f"cannot set up the network policies of namespace {self.api.namespace!r}: {exc}"
            ) from exc
        log.info(
            "network policies ensured: orchestrator %s, API server %s",
            namespace or ", ".join(place.addresses),
            ", ".join(api_server),
        )

    async def close(self, *, delete_sandboxes: bool) -> None:
        """Stop watching (deleting this process's sandboxes when asked), close the
        client and remove the private directory of its TLS files: no key stays on disk."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if delete_sandboxes and self._api is not None:
            mine = [
                r
                for _, r in self._records()
                if r.backend_state.get("orchestrator") == label_value(self._orchestrator)
            ]
            await asyncio.gather(*(self.delete(r) for r in mine), return_exceptions=True)
        if self._api is not None:
            # Bounded: with the API unreachable each call could wait out its timeouts.
            with contextlib.suppress(KubeError, TimeoutError):
                await asyncio.wait_for(self._drain_deletions(_CLOSE_DRAIN_S), 3 * _CLOSE_DRAIN_S)
            self._api.close()
        self._credentials.remove()

    async def _drain_deletions(self, wait_s: float) -> None:
        """Before this process goes: retry deletions the API refused, then give this
        orchestrator's pods being deleted ``wait_s`` to go, and force out those still there.

        A graceful delete needs the kubelet's confirmation, which 1.20 sometimes never
        sends (seen after an API server restart); with no process left to force the pod
        later, it would stay ``Terminating`` until another orchestrator starts.
        """
        await self._retry_refused_deletions()
        mine = f"{SANDBOX_SELECTOR},{LABEL_ORCHESTRATOR}={label_value(self._orchestrator)}"
        deadline = time.monotonic() + wait_s
        while True:
            pods, _ = await self.api.list_objects("pods", mine)
            deleting = [p for p in pods if p["metadata"].get("deletionTimestamp")]
            if not deleting:
                return
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.25)
        for pod in deleting:
            meta = pod["metadata"]
            await self._force_delete(
                meta["name"], str(meta.get("uid") or ""), "still being deleted at shutdown"
            )

    # -- create / ready / delete ----------------------------------------------------
    async def create(self, record: SandboxRecord) -> None:
        name = object_name(record.sandbox_id)
        pod = pod_manifest(record, self._settings, self._orchestrator)  # BackendError on bad input
        token = secrets.token_urlsafe(24)
        try:
            await self.api.create("secrets", secret_manifest(record, self._orchestrator, token))
        except KubeError as exc:
            if exc.status == 409:
                raise SandboxExists(f"sandbox id {record.sandbox_id!r} is taken") from exc
            raise self._create_error(exc) from exc
        record.backend_state = {"pod": name, "orchestrator": label_value(self._orchestrator)}
        state = self._state(name)
        state.token, state.record = token, record
        state.creating = asyncio.get_running_loop().create_future()
        try:
            if record.block_network:
                await self.api.create(
                    "networkpolicies", network_policy_manifest(record, self._orchestrator)
                )
            created = await self.api.create("pods", pod)
        except KubeError as exc:
            await self.delete(record)
            raise self._create_error(exc) from exc
        self._spawn(self._adopt_children(created, record.block_network))

    def _create_error(self, exc: KubeError) -> BackendError:
        if not exc.status or exc.status >= 500:  # unreachable or failing: retry later
            return BackendUnavailable(f"the Kubernetes API cannot create sandboxes now: {exc}")
        if exc.not_found:
            return BackendError(f"namespace {self.api.namespace!r} does not exist ({exc})")
        if exc.status == 403 and "RuntimeClass" in str(exc):
            return BackendError(
                f"runtime class {self._settings.kubernetes.runtime_class!r} is not in the cluster: {exc}"
            )
        if exc.status == 403:
            return BackendError(f"the orchestrator may not create sandboxes here: {exc}")
        if exc.status in (400, 422):
            return BackendError(f"the cluster rejected the sandbox: {exc}")
        return BackendError(f"cannot create the sandbox's pod: {exc}")

    async def _adopt_children(self, pod: dict[str, Any], with_policy: bool) -> None:
        """Make the pod own its Secret (and policy), so deleting the pod by any means,
        even with no orchestrator running, lets the garbage collector remove them."""
        name = pod["metadata"]["name"]
        patch = {"metadata": {"ownerReferences": [owner_reference(pod)]}}
        kinds = ["secrets", "networkpolicies"] if with_policy else ["secrets"]
        for kind in kinds:
            with contextlib.suppress(KubeError):
                await self.api.patch(kind, name, patch)

    async def wait_ready(self, record: SandboxRecord) -> None:
        name = record.backend_state["pod"]
        state = self._states.get(name)
        future = None if state is None else state.creating
        if state is None or future is None:
            raise BackendError("the sandbox's pod is gone")
        pod = self._watched_pod(name)
        if pod is not None:
            self._settle(name, record, view_pod(pod))
        try:
            await asyncio.shield(future)
        finally:
            if state.creating is future:
                state.creating = None
            self._prune(name)

    async def delete(self, record: SandboxRecord) -> None:
        name = record.backend_state.get("pod")
        if not name:
            return  # nothing was created
        self._forget(name, BackendError("the sandbox was deleted"))
        await self._delete_or_doom(name, record.block_network)

    async def retire(self, record: SandboxRecord) -> None:
        await self.delete(record)  # API calls: the kubelet does the slow part anyway

    async def reap(self, record: SandboxRecord) -> None:
        return None

    async def claim(self, record: SandboxRecord) -> None:
        raise BackendError(f"warm pools are not supported on the {self.name} backend")

    async def _delete_or_doom(self, name: str, with_policy: bool) -> None:
        """Delete the pod's objects, or keep the deletion for the next maintenance pass."""
        if not await self._delete_objects(name, with_policy):
            self._state(name).doomed = True

    async def _delete_objects(self, name: str, with_policy: bool = True) -> bool:
        """Delete the pod, its Secret and policy; False when the API could not be reached.

        A pod that has already ended (as last watched) is force-deleted: its containers
        are gone, and a graceful delete of it may never complete on 1.20.
        """
        try:
            await self._delete_pod(name)
            await self.api.delete("secrets", name)
            if with_policy:
                await self.api.delete("networkpolicies", name)
        except KubeError as exc:
            log.warning("could not delete sandbox objects %s (will retry): %s", name, exc)
            return False
        state = self._states.get(name)
        if state is not None:
            state.doomed = False
            self._prune(name)
        return True

    async def _retry_refused_deletions(self) -> None:
        for name in [n for n, state in self._states.items() if state.doomed]:
            await self._delete_objects(name)

    def _unforce(self, name: str) -> None:
        state = self._states.get(name)
        if state is not None:
            state.clear_forced()
            self._prune(name)

    async def _delete_pod(self, name: str) -> None:
        pod = self._watched_pod(name)
        why = None if pod is None else force_delete_reason(pod)
        if pod is not None and why is not None:
            log.info("force-deleting pod %s: %s", name, why)
            uid = str(pod["metadata"].get("uid") or "") or None
            if uid is not None:  # no second force right away when its deletion is seen
                state = self._state(name)
                state.forced_uid, state.forced_at = uid, time.monotonic()
            try:
                if await self.api.delete("pods", name, grace_period_s=0, uid=uid):
                    return
            except KubeError:
                self._unforce(name)
                raise
            # Gone already, or not the pod watched (a newer one of that name): gently then.
        await self.api.delete("pods", name)

    async def _force_delete(self, name: str, uid: str, why: str) -> None:
        """Remove a pod stuck being deleted from the API (only the incarnation ``uid``)."""
        log.warning("force-deleting pod %s: %s", name, why)
        try:
            await self.api.delete("pods", name, grace_period_s=0, uid=uid)
        except KubeError as exc:
            self._unforce(name)  # the next look tries again
            log.warning("could not force-delete pod %s (will retry): %s", name, exc)

    def _check_deleting(self, pod: dict[str, Any], now: float) -> None:
        """A pod being deleted: force it out when its deletion will not, or did not, end."""
        meta = pod["metadata"]
        name, uid = meta["name"], str(meta.get("uid") or "")
        state = self._state(name)
        if state.deleting_since is None:
            state.deleting_since = now
        if not uid:
            return
        if state.forced_uid == uid and now - state.forced_at < _FORCE_RETRY_S:
            return  # forced a moment ago: give that delete time to land before another
        why = force_delete_reason(pod, deleting_for_s=now - state.deleting_since)
        if why is not None:
            state.forced_uid, state.forced_at = uid, now
            self._spawn(self._force_delete(name, uid, why))

    def _forget(self, name: str, why: BackendError) -> SandboxRecord | None:
        """This replica no longer serves the sandbox: its record, token, failure and
        readiness go (readiness waiters get ``why``)."""
        state = self._states.get(name)
        if state is None:
            return None
        record, future = state.record, state.creating
        state.record = state.token = state.dead = state.creating = None
        state.published, state.expiring = 0.0, False
        if future is not None and not future.done():
            future.set_exception(why)
            future.exception()  # retrieved: nobody may be waiting any more
        self._prune(name)
        return record

    async def check(self, record: SandboxRecord) -> str | None:
        state = self._states.get(record.backend_state.get("pod", ""))
        return None if state is None else state.dead

    # -- what the watchers report ---------------------------------------------------
    def _on_secret(self, secret: dict[str, Any]) -> None:
        name = secret["metadata"]["name"]
        raw = (secret.get("data") or {}).get(TOKEN_KEY)
        if raw:
            self._state(name).token = base64.b64decode(raw).decode()
        pod = self._watched_pod(name)
        if pod is not None:
            self._on_pod(pod)

    def _on_secret_gone(self, secret: dict[str, Any]) -> None:
        name = secret["metadata"]["name"]
        state = self._states.get(name)
        if state is not None and state.record is None:
            state.token = None
            self._prune(name)

    def _on_pod(self, pod: dict[str, Any]) -> None:
        view = view_pod(pod)
        if view.deleting:
            self._check_deleting(pod, time.monotonic())
        record = self._record(view.name)
        if record is None:
            if view.deleting:
                return
            record = record_from_pod(pod)
            if record is None:
                log.warning("pod %s has no readable sandbox record; ignoring it", view.name)
                return
            labels = pod["metadata"].get("labels") or {}
            record.backend_state["orchestrator"] = labels.get(LABEL_ORCHESTRATOR)
            self._state(view.name).record = record
            if self._registry is not None:
                self._registry.discovered(record)
        self._sync_last_active(view.name, record, pod)
        self._settle(view.name, record, view)

    def _settle(self, name: str, record: SandboxRecord, view: PodView) -> None:
        """Act on a pod's state: ready, failed, or nothing yet."""
        if view.deleting:
            return  # its containers stopping is no failure: the DELETED event follows
        state = self._state(name)
        future, token = state.creating, state.token
        if view.expired and future is None:
            self._expire(name, record)
            return
        if view.failure:
            if future is not None:
                if not future.done():
                    future.set_exception(BackendError(view.failure))
            elif record.status == "pending":
                record.mark("failed", view.failure)
            else:
                state.dead = view.failure
            return
        if not (view.ready and view.ip and token):
            return
        if record.agent is None or record.agent.base_url != f"http://{view.ip}:{AGENT_PORT}":
            record.agent = AgentEndpoint(base_url=f"http://{view.ip}:{AGENT_PORT}", token=token)
        if future is not None:
            if not future.done():
                future.set_result(None)
        elif record.status == "pending":
            record.mark("ready")

    def _expire(self, name: str, record: SandboxRecord) -> None:
        """The kubelet ended the pod at ``activeDeadlineSeconds``, i.e. the sandbox's ttl,
        before a reaper deleted it (the reaper was late, or no orchestrator ran). That is
        no failure: delete the pod (by force, see ``_delete_pod``); once it is gone the
        sandbox is reaped for its ttl (see ``_on_pod_gone``)."""
        state = self._state(name)
        if state.expiring:
            return
        state.expiring = True
        log.info(
            "sandbox %s: the kubelet ended its pod at its deadline (ttl %s s)",
            record.sandbox_id,
            record.ttl_seconds,
        )
        self._spawn(self._delete_expired(name, record.block_network))

    async def _delete_expired(self, name: str, with_policy: bool) -> None:
        await self._delete_or_doom(name, with_policy)

    def _on_pod_gone(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        state = self._states.get(name)
        expired = state is not None and state.expiring
        if state is not None:
            state.deleting_since = None
            state.clear_forced()
        record = self._forget(name, BackendError("the sandbox's pod was deleted"))
        if record is None:
            return  # deleted through this replica
        if expired:
            if self._registry is None:
                return
            expires_at = record.expires_at
            if expires_at is not None and time.time() >= expires_at - _EXPIRY_SLACK_S:
                # Its ttl: reaped now, not at the reaper's next pass (seconds away, or
                # never if the orchestrator was frozen): terminated, then forgotten.
                self._registry.expired(record.sandbox_id)
            else:
                why = "the pod's deadline (activeDeadlineSeconds) passed: the kubelet ended it"
                self._registry.lost(record.sandbox_id, why)
            return  # its objects are being deleted already
        why = "the sandbox's pod was deleted (through another orchestrator replica, or out of band)"
        if self._registry is not None:
            self._registry.lost(record.sandbox_id, why)
        self._spawn(self._delete_objects(name, record.block_network))

    # -- idle time shared between replicas ------------------------------------------
    def _sync_last_active(self, name: str, record: SandboxRecord, pod: dict[str, Any]) -> None:
        raw = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_LAST_ACTIVE)
        if not raw:
            return
        with contextlib.suppress(ValueError):
            seen = time.monotonic() - max(0.0, time.time() - float(raw))
            if seen > record.last_active:
                record.last_active = seen
            state = self._state(name)
            state.published = max(state.published, seen)

    async def _publish_last_active(self) -> None:
        """Annotate recent use of sandboxes with an idle timeout, so that no replica reaps
        a sandbox another one is using (or still runs a command in). At most one patch per
        quarter idle timeout."""
        for name, record in self._records():
            idle = record.idle_timeout_seconds
            if idle is None or record.status != "ready":
                continue
            if record.busy:  # a long exec here is use too, though no request ends meanwhile
                record.touch()
            state = self._state(name)
            if record.last_active - state.published < max(1.0, idle / 4):
                continue
            state.published = record.last_active
            wall = time.time() - (time.monotonic() - record.last_active)
            patch = {"metadata": {"annotations": {ANNOTATION_LAST_ACTIVE: f"{wall:.3f}"}}}
            with contextlib.suppress(KubeError):
                await self.api.patch("pods", name, patch)

    # -- housekeeping -----------------------------------------------------------------
    async def _maintain_forever(self) -> None:
        while True:
            await asyncio.sleep(_MAINTENANCE_EVERY_S)
            try:
                await self._maintain_once()
            except Exception:
                log.exception("kubernetes housekeeping failed")

    async def _maintain_once(self) -> None:
        await self._retry_refused_deletions()
        # Deleted pods still there long past their grace period get force-deleted.
        now = time.monotonic()
        for name, state in list(self._states.items()):
            pod = self.pods.objects.get(name)
            if state.deleting_since is not None:
                if pod is None or not pod["metadata"].get("deletionTimestamp"):
                    state.deleting_since = None
                else:
                    self._check_deleting(pod, now)
            if state.forced_uid is not None and pod is None:
                state.clear_forced()
            self._prune(name)
        await self._publish_last_active()
        # Token Secrets whose pod never came: an orchestrator died between the two creates.
        now = time.time()
        for name, secret in list(self.token_secrets.objects.items()):
            if name in self.pods.objects or self._record(name) is not None:
                continue
            created = _timestamp(secret["metadata"].get("creationTimestamp"))
            if created is not None and now - created > _ORPHAN_GRACE_S:
                log.info("deleting token secret %s: its pod never appeared", name)
                await self._delete_objects(name)

    def _spawn(self, coro: Coroutine[Any, Any, object]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- facts ----------------------------------------------------------------------
    def info(self) -> BackendInfo:
        warnings = [w.error for w in (self._pods, self._secrets) if w is not None and w.error]
        return BackendInfo("kubernetes", warnings=warnings)

    async def resources(self) -> Resources:
        details: dict[str, Any] = {
            "api_server": self.api.server,
            "namespace": self.api.namespace,
            "orchestrator_id": self._orchestrator,
            "pods_watched": len(self.pods.objects),
            "pod_states_kept": len(self._states),  # 0 once no pod needs anything more
            "watch": {"pods": self.pods.stats(), "secrets": self.token_secrets.stats()},
        }
        cpu_count: float | None = None
        memory_total: int | None = None
        try:
            nodes = await self.api.nodes()
        except KubeError:
            nodes = None  # a namespaced Role cannot read nodes; capacity is then unknown
        if nodes is not None:
            cpu = memory = 0.0
            for node in nodes:
                allocatable = (node.get("status") or {}).get("allocatable") or {}
                with contextlib.suppress(ValueError):
                    cpu += parse_cpu(str(allocatable.get("cpu", "0")))
                    memory += parse_memory(str(allocatable.get("memory", "0")))
            details["nodes"] = len(nodes)
            cpu_count, memory_total = cpu, int(memory)
        return Resources(
            backend=self.name,
            isolation="kubernetes",
            sandboxes_running=sum(1 for _, r in self._records() if r.status == "ready"),
            cpu_count=cpu_count,
            memory_total_bytes=memory_total,
            details=details,
        )


def _timestamp(raw: str | None) -> float | None:
    if not raw:
        return None
    try:
        return datetime.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
