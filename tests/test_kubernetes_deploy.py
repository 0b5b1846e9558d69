"""The orchestrator deployed into the Kubernetes 1.20 test cluster with infra/k8s.

Builds the server image (infra/server/build), applies the test-cluster overlay with the
cluster's own kubectl (`apply -k`), waits for both replicas, and drives sandboxes through
their pod IPs with the real client, across replicas. It also proves the orchestrator's
service account has only the rights it needs, and that the overlays render alike with
kubectl 1.20's kustomize v2.0.3 and a current kubectl.

Each run applies a copy of infra/k8s whose two namespaces carry a random suffix, so runs
(and other users of the shared cluster) never collide; the copy is deleted again and the
test waits until both namespaces are gone. Needs infra/test-cluster/up to have run: with no
cluster this module fails, it does not skip.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import yaml

from orchard_env_client import SandboxClient

pytestmark = [pytest.mark.kubernetes, pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[1]
K8S_DIR = REPO / "infra" / "k8s"
CLUSTER_DIR = Path(os.environ.get("ORCHARD_TEST_CLUSTER_DIR", "/var/tmp/orchard-test-cluster"))
SYSTEM_NS = "orchard-system"
SANDBOX_NS = "orchard-sandboxes"
SERVICE_ACCOUNT = "orchard-env"
SERVER_BASE = os.environ.get("ORCHARD_SERVER_BASE", "orchard-test/debian")
SANDBOX_IMAGE = "orchard-test/busybox"
ORCHESTRATOR_SELECTOR = (
    "app.kubernetes.io/name=orchard-env,app.kubernetes.io/component=orchestrator"
)
READY_TIMEOUT_S = 240.0
GONE_TIMEOUT_S = 240.0


def _server_version() -> str:
    pyproject = REPO / "packages" / "orchard-env-server" / "pyproject.toml"
    return str(tomllib.loads(pyproject.read_text())["project"]["version"])


def _run(
    argv: list[str], timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
        )
    return done


@attrs.frozen
class Cluster:
    """The test cluster as infra/test-cluster/up left it."""

    kubeconfig: str
    kubectl_bin: str

    def kubectl(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        """Run the cluster's own kubectl (1.20) and return its stdout."""
        argv = [self.kubectl_bin, "--kubeconfig", self.kubeconfig, *args]
        return _run(argv, timeout=timeout, check=check).stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def can_i(self, user: str, *query: str) -> bool:
        """``kubectl auth can-i`` as ``user``: exit 0 is yes, 1 is no, anything else breaks."""
        argv = [self.kubectl_bin, "--kubeconfig", self.kubeconfig, "auth", "can-i", "--as", user]
        done = _run([*argv, *query], check=False)
        answer = done.stdout.strip().splitlines()[-1:] or [""]
        if done.returncode not in (0, 1) or answer[0] not in ("yes", "no"):
            raise AssertionError(f"auth can-i {' '.join(query)}: {done.stdout}{done.stderr}")
        return answer[0] == "yes"


@attrs.frozen
class Deployed:
    """One applied copy of the test-cluster overlay."""

    cluster: Cluster
    overlay: Path
    system_ns: str
    sandbox_ns: str
    api_key: str
    ready_seconds: float

    @property
    def service_account(self) -> str:
        return f"system:serviceaccount:{self.system_ns}:{SERVICE_ACCOUNT}"

    def orchestrator_pods(self) -> list[dict[str, Any]]:
        pods = self.cluster.json("-n", self.system_ns, "get", "pods", "-l", ORCHESTRATOR_SELECTOR)
        return [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]

    def urls(self) -> list[str]:
        """The base URL of every Ready replica, straight at its pod IP."""
        return [
            f"http://{p['status']['podIP']}:8000" for p in self.orchestrator_pods() if _ready(p)
        ]

    def client(self, url: str) -> SandboxClient:
        return SandboxClient(base_url=url, api_key=self.api_key, timeout=60)

    def diagnostics(self) -> str:
        """What to look at when the orchestrator does not come up: pods, events, and the
        containers' own output (the test cluster's API server cannot fetch pod logs)."""
        parts = [
            self.cluster.kubectl("-n", self.system_ns, "get", "pods", "-o", "wide", check=False),
            self.cluster.kubectl("-n", self.system_ns, "get", "events", check=False)[-3000:],
        ]
        names = _run(["docker", "ps", "-a", "--format", "{{.Names}}"], check=False).stdout.split()
        for name in names:
            if name.startswith("k8s_orchard-env_") and f"_{self.system_ns}_" in name:
                logs = _run(["docker", "logs", "--tail", "30", name], check=False)
                parts.append(f"--- docker logs {name}\n{logs.stdout}{logs.stderr}")
        return "\n".join(parts)


def _ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    """The running test cluster, or a failure that says how to get one."""
    env_file = CLUSTER_DIR / "env"
    if not env_file.is_file():
        pytest.fail(
            f"no Kubernetes test cluster: {env_file} is missing. Bring one up with "
            "`bash infra/docker/up && infra/images/build && infra/test-cluster/up` (as root)",
            pytrace=False,
        )
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    found = Cluster(kubeconfig=env["KUBECONFIG"], kubectl_bin=f"{env['K8S_BIN']}/kubectl")
    try:
        found.kubectl("get", "--raw", "/readyz", timeout=20)
    except (AssertionError, subprocess.TimeoutExpired, OSError) as exc:
        pytest.fail(
            f"the test cluster of {env_file} does not answer ({exc}); restart it with "
            "infra/test-cluster/up",
            pytrace=False,
        )
    return found


@pytest.fixture(scope="module")
def server_image(cluster: Cluster) -> str:
    """orchard/server:<version>, built (or found up to date) on the cluster's own engine,
    with the sandbox and injector images next to it."""
    _run(
        [
            str(REPO / "infra/images/build"),
            "--only",
            "debian",
            "--only",
            "busybox",
            "--only",
            "injector",
        ],
        timeout=1200,
    )
    started = time.monotonic()
    done = _run([str(REPO / "infra/server/build"), "--base", SERVER_BASE], timeout=1200)
    ref = done.stdout.strip().splitlines()[-1]
    print(f"infra/server/build: {ref} in {time.monotonic() - started:.1f} s")
    assert ref == f"orchard/server:{_server_version()}"
    return ref


def _copy_with_namespaces(target: Path, suffix: str) -> Path:
    """infra/k8s copied to ``target`` with both namespaces renamed, and a fresh API key."""
    shutil.copytree(K8S_DIR, target, ignore=shutil.ignore_patterns("api-keys.txt"))
    for manifest in target.rglob("*.yaml"):
        text = manifest.read_text()
        for name in (SYSTEM_NS, SANDBOX_NS):
            text = re.sub(rf"\b{name}\b", f"{name}-{suffix}", text)
        manifest.write_text(text)
    return target / "overlays" / "test-cluster"


def _wait_gone(cluster: Cluster, namespaces: list[str]) -> None:
    deadline = time.monotonic() + GONE_TIMEOUT_S
    while time.monotonic() < deadline:
        left = [
            ns
            for ns in namespaces
            if cluster.kubectl("get", "namespace", ns, "--ignore-not-found", "-o", "name")
        ]
        if not left:
            return
        time.sleep(1)
    raise AssertionError(f"namespaces {left} still there {GONE_TIMEOUT_S:g} s after delete -k")


@pytest.fixture(scope="module")
def deployed(
    cluster: Cluster, server_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployed]:
    """The test-cluster overlay applied under fresh namespaces, both replicas Ready;
    everything applied is deleted afterwards and the namespaces waited out."""
    suffix = secrets.token_hex(4)
    overlay = _copy_with_namespaces(tmp_path_factory.mktemp("k8s") / "k8s", suffix)
    key = _run([str(overlay.parents[1] / "new-api-key"), str(overlay), "deploy-test"]).stdout
    namespaces = [f"{SYSTEM_NS}-{suffix}", f"{SANDBOX_NS}-{suffix}"]
    started = time.monotonic()
    cluster.kubectl("apply", "-k", str(overlay))
    try:
        deploy = Deployed(cluster, overlay, namespaces[0], namespaces[1], key.strip(), 0.0)
        while len(deploy.urls()) < 2:
            if time.monotonic() - started > READY_TIMEOUT_S:
                pytest.fail(
                    f"the orchestrator's 2 replicas were not Ready within {READY_TIMEOUT_S:g} s:\n"
                    + deploy.diagnostics(),
                    pytrace=False,
                )
            time.sleep(1)
        deploy = attrs.evolve(deploy, ready_seconds=time.monotonic() - started)
        print(f"apply -k → 2 replicas Ready in {deploy.ready_seconds:.1f} s")
        yield deploy
    finally:
        stopped = time.monotonic()
        cluster.kubectl("delete", "-k", str(overlay), "--ignore-not-found", "--wait=false")
        _wait_gone(cluster, namespaces)
        print(f"delete -k → namespaces gone in {time.monotonic() - stopped:.1f} s")


# -- rendering (no cluster objects) --------------------------------------------------------


def _render(kubectl: str, overlay: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The overlay's objects by (kind, namespace, name), the generated Secret's hash
    suffix dropped (kustomize versions hash differently)."""
    out = _run([kubectl, "kustomize", str(overlay)]).stdout
    objects: dict[tuple[str, str, str], dict[str, Any]] = {}
    for doc in yaml.safe_load_all(out):
        text = re.sub(r"orchard-env-api-keys-[a-z0-9]{10}", "orchard-env-api-keys", json.dumps(doc))
        obj = json.loads(text)
        meta = obj["metadata"]
        objects[(obj["kind"], meta.get("namespace", ""), meta["name"])] = obj
    return objects


def _new_kubectl(old: str) -> str:
    found = shutil.which("kubectl")
    if found is None or Path(found).resolve() == Path(old).resolve():
        pytest.skip("no current kubectl on PATH to compare kustomize v2.0.3 with")
    return found


@pytest.mark.parametrize(
    ("overlay", "pdb_api"), [("test-cluster", "policy/v1beta1"), ("kind", "policy/v1")]
)
def test_overlays_render_alike_with_old_and_new_kustomize(
    cluster: Cluster, tmp_path: Path, overlay: str, pdb_api: str
) -> None:
    """kubectl 1.20 (kustomize v2.0.3) and a current kubectl make the same objects."""
    shutil.copytree(K8S_DIR, tmp_path / "k8s", ignore=shutil.ignore_patterns("api-keys.txt"))
    path = tmp_path / "k8s" / "overlays" / overlay
    (path / "api-keys.txt").write_text("t:not-a-real-key")
    old = _render(cluster.kubectl_bin, path)
    new = _render(_new_kubectl(cluster.kubectl_bin), path)
    assert old == new
    kinds = sorted(kind for kind, _, _ in old)
    assert kinds == sorted(
        [
            "Namespace",
            "Namespace",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "Role",
            "RoleBinding",
            "Secret",
            "Deployment",
            "Service",
            "NetworkPolicy",
            "PodDisruptionBudget",
        ]
    )
    assert old[("PodDisruptionBudget", SYSTEM_NS, "orchard-env")]["apiVersion"] == pdb_api
    assert not any(k == "ClusterRole" or k == "ClusterRoleBinding" for k in kinds)
    pod = old[("Deployment", SYSTEM_NS, "orchard-env")]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == f"orchard/server:{_server_version()}"
    env = {e["name"]: e for e in container["env"]}
    assert (
        env["ORCHARD_ENV_API_KEYS"]["valueFrom"]["secretKeyRef"]["name"] == "orchard-env-api-keys"
    )
    assert env["ORCHARD_ENV_NAMESPACE"]["value"] == SANDBOX_NS
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_overlays_pin_the_server_version() -> None:
    """The overlays' image tag is the one infra/server/build gives the current server."""
    for overlay in ("test-cluster", "kind"):
        text = (K8S_DIR / "overlays" / overlay / "kustomization.yaml").read_text()
        tags = [
            i["newTag"] for i in yaml.safe_load(text)["images"] if i["name"] == "orchard/server"
        ]
        assert tags == [_server_version()], overlay


# -- the image -----------------------------------------------------------------------------


def test_server_image_runs_the_cli_as_non_root(server_image: str) -> None:
    done = _run(
        ["docker", "run", "--rm", "--network", "none", server_image, "orchard-env", "--help"]
    )
    assert "serve" in done.stdout
    uid = _run(["docker", "run", "--rm", "--network", "none", server_image, "id", "-u"]).stdout
    assert uid.strip() == "10001"


HEALTH_PROBE = """
import json, sys, time, urllib.request
for _ in range(100):
    try:
        body = json.load(urllib.request.urlopen("http://127.0.0.1:8000/health", timeout=2))
    except OSError:
        time.sleep(0.2)
        continue
    print(body["status"], body["backend"])
    sys.exit(0)
sys.exit("no answer from /health within 20 s")
"""


def test_server_image_serves_health_on_the_local_backend(server_image: str) -> None:
    """The image's default command machinery works: a local-backend server inside it
    answers /health (reached from inside the container: no port is published). The
    image has no bubblewrap and the container no user namespaces, so the local backend
    runs there only when told to run unisolated."""
    name = f"orchard-server-check-{secrets.token_hex(4)}"
    _run(
        [
            "docker",
            "run",
            "-d",
            "--name",
            name,
            "--network",
            "none",
            server_image,
            "orchard-env",
            "serve",
            "--backend",
            "local",
            "--isolation",
            "none",
        ]
    )
    try:
        done = _run(["docker", "exec", name, "python", "-c", HEALTH_PROBE], timeout=60)
        assert done.stdout.split() == ["ok", "local"]
    finally:
        _run(["docker", "rm", "-f", name], check=False)


# -- in the cluster ------------------------------------------------------------------------


# (allowed, verb, resource, namespace or None for cluster scope, extra can-i flags)
RBAC_CASES = [
    (True, "create", "pods", "sandboxes", ()),
    (True, "delete", "pods", "sandboxes", ()),
    (True, "patch", "pods", "sandboxes", ()),
    (True, "watch", "pods", "sandboxes", ()),
    (True, "create", "secrets", "sandboxes", ()),
    (True, "list", "secrets", "sandboxes", ()),
    (True, "create", "networkpolicies.networking.k8s.io", "sandboxes", ()),
    (True, "delete", "networkpolicies.networking.k8s.io", "sandboxes", ()),
    (True, "patch", "networkpolicies.networking.k8s.io", "sandboxes", ()),
    (False, "list", "networkpolicies.networking.k8s.io", "sandboxes", ()),
    (True, "get", "services/kubernetes", "default", ()),
    (True, "get", "endpoints/kubernetes", "default", ()),
    (False, "get", "services/other", "default", ()),
    (False, "list", "endpoints", "default", ()),
    (False, "update", "pods", "sandboxes", ()),
    (False, "create", "pods", "sandboxes", ("--subresource", "exec")),
    (False, "get", "pods", "sandboxes", ("--subresource", "log")),
    (False, "create", "services", "sandboxes", ()),
    (False, "create", "roles.rbac.authorization.k8s.io", "sandboxes", ()),
    (False, "create", "pods", "default", ()),
    (False, "create", "pods", "system", ()),
    (False, "get", "secrets", "system", ()),
    (False, "list", "secrets", "default", ()),
    (False, "list", "nodes", None, ()),
    (False, "get", "namespaces", None, ()),
    (False, "list", "pods", None, ("--all-namespaces",)),
]


def test_service_account_has_least_privilege(deployed: Deployed) -> None:
    """Exactly the sandbox namespace's pods, secrets and network policies, and the API
    server's Service and Endpoints in ``default``; nothing else."""
    namespaces = {"sandboxes": deployed.sandbox_ns, "system": deployed.system_ns}
    wrong = []
    for allowed, verb, resource, where, extra in RBAC_CASES:
        scope = ["-n", namespaces.get(where, where)] if where else []
        answer = deployed.cluster.can_i(deployed.service_account, verb, resource, *scope, *extra)
        if answer != allowed:
            wrong.append(
                f"{verb} {resource} in {where or 'the cluster'} {' '.join(extra)}: {answer}"
            )
    listing = "\n".join(wrong)
    assert not wrong, f"the orchestrator's rights differ from the intended ones:\n{listing}"


def test_sandbox_ingress_policy_selects_this_orchestrator(deployed: Deployed) -> None:
    """The sandbox namespace's default-deny policy lets in exactly this deployment's
    orchestrator pods (its namespace by label, its pods by label), on the agent port."""
    policy = deployed.cluster.json(
        "-n", deployed.sandbox_ns, "get", "networkpolicy", "sandbox-ingress"
    )["spec"]
    assert policy["podSelector"] == {} and policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 7000}]
    (peer,) = rule["from"]
    namespace = deployed.cluster.json("get", "namespace", deployed.system_ns)["metadata"]
    for key, value in peer["namespaceSelector"]["matchLabels"].items():
        assert namespace["labels"].get(key) == value
    for pod in deployed.orchestrator_pods():
        labels = pod["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in peer["podSelector"]["matchLabels"].items())


def test_both_replicas_ready_and_require_a_key(deployed: Deployed) -> None:
    pods = deployed.orchestrator_pods()
    assert len(pods) == 2 and all(_ready(p) for p in pods)
    for pod in pods:
        spec = pod["spec"]
        assert spec["serviceAccountName"] == SERVICE_ACCOUNT
        assert spec["containers"][0]["image"] == f"orchard/server:{_server_version()}"
    for url in deployed.urls():
        health = httpx.get(f"{url}/health", timeout=10)
        assert health.status_code == 200 and health.json()["backend"] == "kubernetes"
        assert httpx.get(f"{url}/sandboxes", timeout=10).status_code == 401


def test_sandbox_lifecycle_through_one_replica(deployed: Deployed) -> None:
    url = deployed.urls()[0]
    with deployed.client(url) as client:
        started = time.monotonic()
        sandbox = client.create_sandbox(SANDBOX_IMAGE, timeout=120)
        print(f"create → ready through {url}: {time.monotonic() - started:.2f} s")
        job = sandbox.exec("echo hi", timeout=60)
        assert (job.exit_code, job.stdout) == (0, "hi\n")
        pods = deployed.cluster.json(
            "-n", deployed.sandbox_ns, "get", "pods", "-l", "orchard.dev/role=sandbox"
        )["items"]
        (pod,) = [
            p
            for p in pods
            if p["metadata"]["labels"].get("orchard.dev/sandbox-id") == sandbox.sandbox_id
        ]
        assert pod["spec"]["automountServiceAccountToken"] is False
        sandbox.delete()
        assert sandbox.sandbox_id not in {s.sandbox_id for s in client.list_sandboxes()}


def test_any_replica_serves_any_sandbox(deployed: Deployed) -> None:
    """Created through one replica, used and deleted through the other."""
    first, second = deployed.urls()
    with deployed.client(first) as one, deployed.client(second) as other:
        sandbox = one.create_sandbox(SANDBOX_IMAGE, timeout=120)
        deadline = time.monotonic() + 30
        while sandbox.sandbox_id not in {s.sandbox_id for s in other.list_sandboxes()}:
            assert time.monotonic() < deadline, "the other replica never saw the sandbox"
            time.sleep(0.2)
        there = other.get_sandbox(sandbox.sandbox_id)
        job = there.exec("echo hi from the other replica", timeout=60)
        assert (job.exit_code, job.stdout) == (0, "hi from the other replica\n")
        there.delete()
        # To the replica that created it, the deletion happened behind its back: it reports
        # the sandbox as terminated (until it forgets it), never as usable again.
        deadline = time.monotonic() + 30
        while (status := _status(one, sandbox.sandbox_id)) not in (None, "terminated"):
            assert time.monotonic() < deadline, f"the first replica still reports {status!r}"
            time.sleep(0.2)


def _status(client: SandboxClient, sandbox_id: str) -> str | None:
    """The sandbox's status in the client's listing, None when it is not listed."""
    return {s.sandbox_id: s.status for s in client.list_sandboxes()}.get(sandbox_id)
