"""The Kubernetes backend's own mechanisms, against the real test cluster.

The shared suite (exec, files, patch, streaming, lifecycle, ...) runs on this backend too;
these tests cover what only pods have: the objects a sandbox is made of, the pod's
confinement (capabilities, seccomp) and the namespace's network policies, replicas sharing
sandboxes, the watcher surviving API server restarts and 410 Gone, pods deleted behind
the orchestrator, images the kubelet cannot run, pods the kubelet ended at their deadline,
pods still being deleted at shutdown, the kubeconfig's TLS files, and 50 sandboxes at once.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchard_env_client import SandboxClient
from orchard_env_client.errors import OrchardError, SandboxFailed
from orchard_env_server.backends.hardening import SANDBOX_CAPABILITIES, capability_mask
from orchard_testing import (
    BUSYBOX_IMAGE,
    CLUSTER_DIR,
    RunningServer,
    cluster_env,
    create_ready,
    docker,
    kubectl,
    leftovers,
    only_backend,
)

pytestmark = [only_backend("kubernetes"), pytest.mark.kubernetes]


def _pod(server: RunningServer, sandbox_id: str) -> dict:
    return json.loads(
        kubectl("-n", server.namespace, "get", "pod", f"orchard-{sandbox_id}", "-o", "json")
    )


def _resources(server: RunningServer) -> dict:
    return httpx.get(f"{server.url}/resources").json()


def test_the_agent_is_injected_into_a_busybox_only_image(server):
    with SandboxClient(base_url=server.url) as client:
        sbx = client.create_sandbox(BUSYBOX_IMAGE)
        result = sbx.exec(
            "echo hello from $(hostname); test ! -e /usr/bin/python3 && echo no-python"
        )
        assert result.exit_code == 0
        assert result.stdout.splitlines()[1] == "no-python"
        sbx.upload_content("/tmp/note.txt", "written through the agent")
        assert sbx.download_content("/tmp/note.txt") == b"written through the agent"


def test_the_pod_holds_no_service_account_token_and_no_agent_token_in_plain_sight(server, image):
    with SandboxClient(base_url=server.url) as client:
        sbx = client.create_sandbox(
            image, block_network=True, cpu="500m", memory="256Mi", ttl_seconds=600
        )
        pod = _pod(server, sbx.sandbox_id)
        spec, meta = pod["spec"], pod["metadata"]
        assert spec["automountServiceAccountToken"] is False
        assert spec["enableServiceLinks"] is False
        assert spec["activeDeadlineSeconds"] == 600
        main = spec["containers"][0]
        assert main["resources"]["limits"] == {"cpu": "500m", "memory": str(256 << 20)}
        assert main["resources"]["requests"] == main["resources"]["limits"]
        assert spec["initContainers"][0]["image"].startswith("orchard/agent-injector")
        assert meta["labels"]["orchard.dev/sandbox-id"] == sbx.sandbox_id
        # No service-account token reached the sandbox.
        mounts = sbx.exec("cat /proc/mounts").stdout
        assert "serviceaccount" not in mounts
        assert sbx.exec("ls /var/run/secrets/kubernetes.io 2>&1").exit_code != 0
        # The agent token is only in the Secret, never in labels, annotations or env.
        secret = json.loads(
            kubectl(
                "-n", server.namespace, "get", "secret", f"orchard-{sbx.sandbox_id}", "-o", "json"
            )
        )
        token = base64.b64decode(secret["data"]["token"]).decode()
        assert len(token) >= 24 and token not in json.dumps(pod)
        # The Secret belongs to the pod: the garbage collector removes it with the pod.
        deadline = time.monotonic() + 10
        while not secret["metadata"].get("ownerReferences") and time.monotonic() < deadline:
            time.sleep(0.2)
            secret = json.loads(
                kubectl(
                    "-n",
                    server.namespace,
                    "get",
                    "secret",
                    f"orchard-{sbx.sandbox_id}",
                    "-o",
                    "json",
                )
            )
        assert secret["metadata"]["ownerReferences"][0]["uid"] == meta["uid"]


def test_block_network_creates_an_egress_policy_selecting_the_pod(server, image):
    with SandboxClient(base_url=server.url) as client:
        blocked = client.create_sandbox(image, block_network=True)
        open_ = client.create_sandbox(image, block_network=False)
        policy = json.loads(
            kubectl(
                "-n",
                server.namespace,
                "get",
                "networkpolicy",
                f"orchard-{blocked.sandbox_id}",
                "-o",
                "json",
            )
        )
        assert policy["spec"]["policyTypes"] == ["Egress"] and not policy["spec"].get("egress")
        selector = policy["spec"]["podSelector"]["matchLabels"]
        selected = kubectl(
            "-n",
            server.namespace,
            "get",
            "pods",
            "-l",
            ",".join(f"{k}={v}" for k, v in selector.items()),
            "-o",
            "name",
        )
        assert selected.split() == [f"pod/orchard-{blocked.sandbox_id}"]
        assert not kubectl(
            "-n",
            server.namespace,
            "get",
            "networkpolicy",
            f"orchard-{open_.sandbox_id}",
            "--ignore-not-found",
            "-o",
            "name",
        )


def test_the_pod_is_confined_and_a_root_shell_in_it_holds_only_the_kept_capabilities(server):
    with SandboxClient(base_url=server.url) as client:
        sbx = client.create_sandbox(BUSYBOX_IMAGE)  # runs as root
        spec = _pod(server, sbx.sandbox_id)["spec"]
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(key), key
        assert not [v for v in spec["volumes"] if "hostPath" in v]
        for container in spec["initContainers"] + spec["containers"]:
            context = container["securityContext"]
            assert context["capabilities"] == {
                "drop": ["ALL"],
                "add": list(SANDBOX_CAPABILITIES),
            }, container["name"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["privileged"] is False
            assert all("hostPort" not in port for port in container.get("ports", []))
        # What the runtime made of it, seen from inside.
        assert sbx.exec("id -u").stdout == "0\n"
        out = sbx.exec("grep -E '^(Cap|Seccomp|NoNewPrivs)' /proc/self/status").stdout
        status = {k: v.strip() for k, v in (line.split(":", 1) for line in out.splitlines())}
        for field in ("CapEff", "CapPrm", "CapBnd"):
            assert int(status[field], 16) == capability_mask(), (field, status)
        assert (status["Seccomp"], status["NoNewPrivs"]) == ("2", "1")
        refused = sbx.exec("mknod /tmp/disk b 8 0 && echo made")
        assert refused.exit_code != 0 and "made" not in refused.stdout


def _policy(server: RunningServer, name: str) -> dict:
    return json.loads(kubectl("-n", server.namespace, "get", "networkpolicy", name, "-o", "json"))


def _selected(server: RunningServer, selector: dict) -> set[str]:
    labels = ",".join(f"{k}={v}" for k, v in selector["matchLabels"].items())
    return set(kubectl("-n", server.namespace, "get", "pods", "-l", labels, "-o", "name").split())


def _agent_peers(sbx) -> set[str]:
    """The addresses connected to the agent's port, as the pod sees them (/proc/net/tcp)."""
    peers = set()
    for line in sbx.exec("cat /proc/net/tcp").stdout.splitlines()[1:]:
        local, remote, state = line.split()[1:4]
        if local.endswith(":1B58") and state == "01":  # port 7000, ESTABLISHED
            packed = bytes.fromhex(remote.split(":")[0])[::-1]  # little-endian on x86
            peers.add(str(ipaddress.ip_address(packed)))
    return peers


def test_the_namespace_policies_keep_sandboxes_apart_and_off_the_api_server(server, image):
    """Objects and selectors only: this cluster's CNI bridge does not enforce policies."""
    with SandboxClient(base_url=server.url) as client:
        blocked = client.create_sandbox(image, block_network=True)
        open_ = client.create_sandbox(image, block_network=False)
        pods = {f"pod/orchard-{blocked.sandbox_id}", f"pod/orchard-{open_.sandbox_id}"}

        ingress = _policy(server, "orchard-sandbox-ingress")
        assert ingress["metadata"]["labels"]["orchard.dev/namespace-policy"] == "ingress"
        assert "orchard.dev/role" not in ingress["metadata"]["labels"]  # not a leftover
        spec = ingress["spec"]
        assert spec["policyTypes"] == ["Ingress"]
        assert pods <= _selected(server, spec["podSelector"])
        (rule,) = spec["ingress"]
        assert rule["ports"] == [{"protocol": "TCP", "port": 7000}]
        allowed = {ipaddress.ip_network(p["ipBlock"]["cidr"]) for p in rule["from"]}
        assert all(n.prefixlen == n.max_prefixlen for n in allowed)  # single hosts, no pods
        # The orchestrator's own connections to the agent come from an admitted address.
        peers = _agent_peers(open_)
        assert peers and all(any(ipaddress.ip_address(p) in n for n in allowed) for p in peers)

        egress = _policy(server, "orchard-sandbox-egress")
        spec = egress["spec"]
        assert spec["policyTypes"] == ["Egress"]
        assert _selected(server, spec["podSelector"]) & pods == {f"pod/orchard-{open_.sandbox_id}"}
        (rule,) = spec["egress"]
        v4 = rule["to"][0]["ipBlock"]
        assert v4["cidr"] == "0.0.0.0/0"
        service_ip = json.loads(
            kubectl("-n", "default", "get", "service", "kubernetes", "-o", "json")
        )["spec"]["clusterIP"]
        node_ip = cluster_env()["NODE_IP"]  # the API server listens there
        assert {f"{service_ip}/32", f"{node_ip}/32"} <= set(v4["except"])
        assert {str(n) for n in allowed if n.version == 4} <= set(v4["except"])


def test_a_starting_orchestrator_puts_the_namespace_policies_back(fresh_server):
    fresh_server.start()
    fresh_server.stop()  # and leaves them: replicas and running sandboxes rely on them
    assert leftovers(fresh_server) == []
    egress = _policy(fresh_server, "orchard-sandbox-egress")
    kubectl("-n", fresh_server.namespace, "delete", "networkpolicy", "orchard-sandbox-ingress")
    widened = {
        "spec": {"podSelector": {"matchLabels": {"orchard.dev/role": "nothing"}}, "egress": [{}]}
    }
    kubectl(
        "-n",
        fresh_server.namespace,
        "patch",
        "networkpolicy",
        "orchard-sandbox-egress",
        "--type",
        "strategic",
        "-p",
        json.dumps(widened),
    )
    fresh_server.start()
    assert _policy(fresh_server, "orchard-sandbox-egress")["spec"] == egress["spec"]
    ingress = _policy(fresh_server, "orchard-sandbox-ingress")["spec"]
    assert ingress["podSelector"] == {"matchLabels": {"orchard.dev/role": "sandbox"}}


def test_a_runtime_class_runs_the_sandbox_pod_and_a_missing_one_is_refused(server, tmp_path: Path):
    """spec.runtimeClassName as the backend writes it (``runtime_class`` setting), on
    this cluster's dockershim, whose only handler is ``docker``: gVisor and Kata are
    not installed here, so a class of theirs would fail the same way a missing one does."""
    from orchard_env_server.backends.kubernetes.spec import pod_manifest, secret_manifest
    from orchard_env_server.records import SandboxRecord
    from orchard_env_server.settings import KubernetesSettings, Settings

    suffix = os.urandom(4).hex()
    runtime_class = f"orchard-test-docker-{suffix}"
    record = SandboxRecord(sandbox_id=f"rc-{suffix}", tenant="t", image=BUSYBOX_IMAGE)
    settings = Settings(
        kubernetes=KubernetesSettings(runtime_class=runtime_class, image_pull_policy="Never")
    )
    files = {
        "class": {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": runtime_class},
            "handler": "docker",
        },
        "secret": secret_manifest(record, "test", "t" * 32),
        "pod": pod_manifest(record, settings, "test"),
    }
    for name, manifest in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(manifest))
    ns = ["-n", server.namespace]
    pod = f"pod/orchard-{record.sandbox_id}"
    kubectl("create", "-f", str(tmp_path / "class.json"))
    try:
        kubectl(*ns, "create", "-f", str(tmp_path / "secret.json"))
        kubectl(*ns, "create", "-f", str(tmp_path / "pod.json"))
        kubectl(*ns, "wait", "--for=condition=Ready", pod, "--timeout=60s", timeout=90)
        assert kubectl(*ns, "get", pod, "-o", "jsonpath={.spec.runtimeClassName}") == (
            runtime_class
        )
    finally:
        kubectl(
            *ns,
            "delete",
            pod,
            f"secret/orchard-{record.sandbox_id}",
            "--ignore-not-found",
            "--wait=false",
            check=False,
        )
        kubectl("delete", "runtimeclass", runtime_class, "--ignore-not-found", check=False)
    done = subprocess.run(
        [
            f"{cluster_env()['K8S_BIN']}/kubectl",
            "--kubeconfig",
            cluster_env()["KUBECONFIG"],
            *ns,
            "create",
            "--dry-run=server",
            "-f",
            str(tmp_path / "pod.json"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and f'RuntimeClass "{runtime_class}" not found' in done.stderr


@contextlib.contextmanager
def two_replicas(backend: str, tmp_path: Path) -> Iterator[tuple[RunningServer, RunningServer]]:
    """Two orchestrators sharing one namespace; nothing of theirs may be left after."""
    first = RunningServer(backend=backend, state_dir=tmp_path / "a")
    second = RunningServer(backend=backend, state_dir=tmp_path / "b", namespace=first.namespace)
    first.start()
    second.start("--orchestrator-id", "replica-b")
    try:
        yield first, second
    finally:
        second.stop()
        first.stop()
    assert leftovers(first) == []


def test_a_sandbox_made_through_one_replica_is_served_and_deleted_by_another(backend, tmp_path):
    with two_replicas(backend, tmp_path) as (first, second):
        with SandboxClient(base_url=first.url, auto_cleanup=False) as one:
            sbx = one.create_sandbox(BUSYBOX_IMAGE)
            sbx.exec("echo made-by-a > /tmp/proof")
        with SandboxClient(base_url=second.url, auto_cleanup=False) as two:
            deadline = time.monotonic() + 10
            while True:  # the second replica learns of it from its watch
                try:
                    again = two.get_sandbox(sbx.sandbox_id)
                    break
                except OrchardError:
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
            assert again.exec("cat /tmp/proof").stdout == "made-by-a\n"
            again.delete()
        deadline = time.monotonic() + 15
        while True:  # and the first replica sees it terminated
            info = httpx.get(f"{first.url}/sandboxes/{sbx.sandbox_id}").json()
            if info.get("status") == "terminated":
                assert "deleted" in info["error"]
                break
            assert time.monotonic() < deadline, info
            time.sleep(0.2)


def test_a_replica_does_not_reap_as_idle_a_sandbox_another_runs_a_long_command_in(
    backend, tmp_path
):
    """Idle time is shared through a pod annotation; a command running longer than the
    idle timeout on one replica keeps the sandbox in use for the other one too."""
    with (
        two_replicas(backend, tmp_path) as (first, second),
        SandboxClient(base_url=first.url, auto_cleanup=False) as one,
    ):
        sbx = one.create_sandbox(BUSYBOX_IMAGE, idle_timeout_seconds=10)
        deadline = time.monotonic() + 10
        while httpx.get(f"{second.url}/sandboxes/{sbx.sandbox_id}").status_code != 200:
            assert time.monotonic() < deadline, "the second replica never saw the sandbox"
            time.sleep(0.1)
        job = sbx.exec("sleep 25; echo still-here", timeout=60)
        assert job.stdout == "still-here\n", job
        info = httpx.get(f"{second.url}/sandboxes/{sbx.sandbox_id}").json()
        assert info["status"] == "ready", info
        sbx.delete()


def test_a_pod_deleted_out_of_band_terminates_its_sandbox(server):
    with SandboxClient(base_url=server.url, auto_cleanup=False) as client:
        sbx = client.create_sandbox(BUSYBOX_IMAGE)
        kubectl(
            "-n", server.namespace, "delete", "pod", f"orchard-{sbx.sandbox_id}", "--wait=false"
        )
        deadline = time.monotonic() + 30
        while True:
            info = httpx.get(f"{server.url}/sandboxes/{sbx.sandbox_id}").json()
            if info["status"] == "terminated":
                break
            assert time.monotonic() < deadline, info
            time.sleep(0.2)
        assert "out of band" in info["error"]
        response = httpx.post(
            f"{server.url}/sandboxes/{sbx.sandbox_id}/exec", json={"command": "true"}
        )
        assert response.status_code == 409 and response.json()["code"] == "sandbox_not_ready"
    # Its Secret and policy go too (garbage collector or the orchestrator).
    deadline = time.monotonic() + 30
    while kubectl(
        "-n",
        server.namespace,
        "get",
        "secret,networkpolicy",
        "--ignore-not-found",
        "-o",
        "name",
        f"orchard-{sbx.sandbox_id}",
    ):
        assert time.monotonic() < deadline
        time.sleep(0.5)


def test_no_pod_state_is_kept_once_pods_are_gone_however_they_went(server):
    """Sandboxes deleted through the API, and pods force-deleted out of band: once every
    pod is gone the backend keeps no state about any of them (``pod_states_kept``)."""
    with SandboxClient(base_url=server.url, auto_cleanup=False) as client:
        made = [client.create_sandbox(BUSYBOX_IMAGE, block_network=i % 2 == 0) for i in range(8)]
        for sbx in made[:4]:
            sbx.delete()
        pods = [f"orchard-{sbx.sandbox_id}" for sbx in made[4:]]
        kubectl(
            "-n",
            server.namespace,
            "delete",
            "pod",
            *pods,
            "--grace-period=0",
            "--force",
            "--wait=false",
            check=False,
        )
        deadline = time.monotonic() + 60
        while True:
            kept = httpx.get(f"{server.url}/resources").json()["pod_states_kept"]
            if kept == 0:
                break
            assert time.monotonic() < deadline, f"{kept} pod states still kept"
            time.sleep(0.5)


def test_an_image_the_node_lacks_fails_fast_with_the_kubelets_reason(server):
    started = time.monotonic()
    body = create_ready(server.url, {"image": "orchard-test/no-such-image:1"})
    elapsed = time.monotonic() - started
    assert body["status"] == "failed"
    assert "ErrImageNeverPull" in body["error"], body["error"]
    assert elapsed < 30, f"took {elapsed:.1f} s"


def test_the_watcher_relists_after_410_and_survives_api_server_restarts(fresh_server, image):
    fresh_server.start()
    with SandboxClient(base_url=fresh_server.url) as client:
        before = _resources(fresh_server)["watch"]["pods"]
        kept = client.create_sandbox(BUSYBOX_IMAGE)
        env = cluster_env()
        etcd = ["etcdctl", "--endpoints", env["ETCD_ENDPOINT"]]
        # While the API server is down, move etcd's revision on and compact everything
        # before it: the watcher's resourceVersion is then gone, and it must list again.
        script = (
            f"{' '.join(etcd)} put /orchard-test/bump x >/dev/null && "
            f"rev=$({' '.join(etcd)} endpoint status -w json | python3 -c "
            '\'import json,sys; print(json.load(sys.stdin)[0]["Status"]["header"]["revision"])\') && '
            f"{' '.join(etcd)} compact $rev >/dev/null"
        )
        subprocess.run(
            [
                str(Path(__file__).parents[1] / "infra/test-cluster/restart-apiserver"),
                "--",
                "sh",
                "-c",
                script,
            ],
            check=True,
            timeout=120,
            env={
                "ETCDCTL_API": "3",
                "PATH": "/usr/bin:/bin:/usr/sbin:/sbin",
                "ORCHARD_TEST_CLUSTER_DIR": str(CLUSTER_DIR),
            },
        )
        deadline = time.monotonic() + 60
        while True:
            after = _resources(fresh_server)["watch"]["pods"]
            if after["lists"] > before["lists"] and after["error"] is None:
                break
            assert time.monotonic() < deadline, after
            time.sleep(0.3)
        assert after["gone"] > before["gone"]
        # Readiness still arrives through the new watch, and the old sandbox still serves.
        fresh = client.create_sandbox(BUSYBOX_IMAGE)
        assert fresh.exec("echo after-restart").stdout == "after-restart\n"
        assert kept.exec("echo kept").stdout == "kept\n"
    fresh_server.stop()
    assert leftovers(fresh_server) == []


def _pod_or_none(server: RunningServer, name: str) -> dict | None:
    raw = kubectl("-n", server.namespace, "get", "pod", name, "--ignore-not-found", "-o", "json")
    return json.loads(raw) if raw else None


def test_a_pod_the_kubelet_ended_at_its_deadline_is_deleted_not_left_terminating(fresh_server):
    """kubernetes/kubernetes#88613: a pod failed at activeDeadlineSeconds (the sandbox's
    ttl) before the reaper deleted it may never finish a graceful delete on 1.20. The
    orchestrator is frozen (SIGSTOP: no reaper) until the kubelet has failed the pod."""
    ttl = 12  # a pod takes 2-5 s to be ready here, more on a loaded machine
    fresh_server.start()
    assert fresh_server.proc is not None
    with SandboxClient(base_url=fresh_server.url, auto_cleanup=False) as client:
        for _attempt in range(3):  # the reaper must not have acted before the freeze
            asked = time.monotonic()
            with contextlib.suppress(SandboxFailed):  # reaped: it took longer than its ttl
                sbx = client.create_sandbox(BUSYBOX_IMAGE, ttl_seconds=ttl, block_network=True)
                if time.monotonic() - asked < ttl - 3:
                    fresh_server.proc.send_signal(signal.SIGSTOP)
                    break
                sbx.delete()
        else:
            pytest.fail("no sandbox was ready well within its ttl")
    name = f"orchard-{sbx.sandbox_id}"
    try:
        deadline = time.monotonic() + 60
        while True:
            pod = _pod_or_none(fresh_server, name)
            assert pod is not None, "the pod went while the orchestrator was frozen"
            assert not pod["metadata"].get("deletionTimestamp")
            if pod["status"].get("reason") == "DeadlineExceeded":
                break
            assert time.monotonic() < deadline, pod["status"]
            time.sleep(0.5)
    finally:
        fresh_server.proc.send_signal(signal.SIGCONT)
    resumed = time.monotonic()
    while (pod := _pod_or_none(fresh_server, name)) is not None:
        assert time.monotonic() - resumed < 30, json.dumps(pod["metadata"]) + fresh_server.log()
        time.sleep(0.5)
    assert f"force-deleting pod {name}" in fresh_server.log()
    # Its record ends terminated by its ttl (or is already forgotten), never failed.
    response = httpx.get(f"{fresh_server.url}/sandboxes/{sbx.sandbox_id}")
    if response.status_code != 404:
        info = response.json()
        assert info["status"] == "terminated" and "ttl" in info["error"], info
    assert f"sandbox {sbx.sandbox_id} died" not in fresh_server.log()
    # The Secret and the policy go with the pod.
    deadline = time.monotonic() + 30
    while kubectl(
        "-n",
        fresh_server.namespace,
        "get",
        "secret,networkpolicy",
        "--ignore-not-found",
        "-o",
        "name",
        name,
    ):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    fresh_server.stop()
    assert leftovers(fresh_server) == []


@contextlib.contextmanager
def _kubelet_frozen() -> Iterator[None]:
    """The test node's kubelet stopped (SIGSTOP): it confirms no deletion meanwhile."""
    pid = int((CLUSTER_DIR / "run" / "kubelet.pid").read_text())
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_pod_still_being_deleted_at_shutdown_is_forced_out_not_left_terminating(fresh_server):
    """A graceful delete waits for the kubelet; once the orchestrator has stopped, nothing
    would force out a pod whose deletion the kubelet never confirms (seen on 1.20 after an
    API server restart). Shutdown gives such pods a moment, then force-deletes them."""
    fresh_server.start()
    with SandboxClient(base_url=fresh_server.url, auto_cleanup=False) as client:
        sbx = client.create_sandbox(BUSYBOX_IMAGE)
        name = f"orchard-{sbx.sandbox_id}"
        with _kubelet_frozen():
            sbx.delete()
            pod = _pod_or_none(fresh_server, name)
            assert pod is not None and pod["metadata"].get("deletionTimestamp"), pod
            fresh_server.stop()
            # Gone from the API while the kubelet still sleeps: the orchestrator did it.
            assert _pod_or_none(fresh_server, name) is None
    assert "still being deleted at shutdown" in fresh_server.log()
    assert leftovers(fresh_server) == []
    # The kubelet, awake again, stops the containers of the pod it no longer finds.
    deadline = time.monotonic() + 60
    while containers := docker("ps", "-aq", "--filter", f"name=_{name}_"):
        assert time.monotonic() < deadline, containers
        time.sleep(0.5)


def _kubeconfig_with_a_client_key(path: Path) -> Path:
    """The test cluster's kubeconfig, authenticating with an inline client certificate and
    key (the kubelet client's, system:masters) instead of a token."""
    pki = CLUSTER_DIR / "pki"

    def inline(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    cluster = {
        "server": cluster_env()["APISERVER_URL"],
        "certificate-authority-data": inline("ca.crt"),
    }
    user = {
        "client-certificate-data": inline("kubelet-client.crt"),
        "client-key-data": inline("kubelet-client.key"),
    }
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "t", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}],
        "current-context": "t",
    }
    path.touch(mode=0o600)
    path.write_text(json.dumps(config))
    return path


def test_the_kubeconfigs_tls_files_are_private_and_gone_after_a_graceful_stop(
    backend, tmp_path, monkeypatch
):
    """The client would write the inline CA, certificate and key to $TMPDIR and remove
    them only at interpreter exit, which a server stopped by SIGTERM never reaches."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir(mode=0o700)
    monkeypatch.setenv("TMPDIR", str(tmpdir))  # the server's, inherited
    kubeconfig = _kubeconfig_with_a_client_key(tmp_path / "kubeconfig")
    key = (CLUSTER_DIR / "pki" / "kubelet-client.key").read_bytes()
    srv = RunningServer(backend=backend, state_dir=tmp_path / "state", kubeconfig=kubeconfig)
    credentials = srv.state_dir / "kubernetes" / "credentials"
    try:
        srv.start()
        [private] = credentials.iterdir()
        assert stat.S_IMODE(credentials.stat().st_mode) == 0o700
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
        files = list(private.iterdir())
        assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
        assert key in [f.read_bytes() for f in files]
        with SandboxClient(base_url=srv.url) as client:  # the key authenticates
            sbx = client.create_sandbox(BUSYBOX_IMAGE)
            assert sbx.exec("echo ok").stdout == "ok\n"
        srv.stop()
        assert "Application shutdown complete" in srv.log()
        assert list(credentials.iterdir()) == []
        assert list(tmpdir.iterdir()) == []
        # A killed server cannot clean up: the next start removes what it left.
        srv.start()
        srv.kill()
        [left] = credentials.iterdir()
        srv.start()
        assert left not in list(credentials.iterdir())
        srv.stop()
        assert list(credentials.iterdir()) == []
        assert list(tmpdir.iterdir()) == []
    finally:
        srv.stop()
        kubeconfig.unlink()
    assert leftovers(srv) == []
