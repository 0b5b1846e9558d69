"""Pure logic of the Kubernetes backend: object names, manifests, pod status, the watcher.

No cluster is involved: manifests are plain dicts, pod statuses are hand-written, and the
watcher runs against an in-memory fake of the two API calls it makes. Also: where the
kubeconfig's TLS files go, and when a pod is force-deleted.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import json
import os
import re
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.config import kube_config

from orchard_env_server.backends import kubernetes_api
from orchard_env_server.backends.base import BackendError
from orchard_env_server.backends.docker_injection import AGENT_MOUNT, agent_entry
from orchard_env_server.backends.hardening import SANDBOX_CAPABILITIES
from orchard_env_server.backends.kubernetes import KubernetesBackend
from orchard_env_server.backends.kubernetes_api import (
    CredentialFiles,
    KubeError,
    in_cluster_namespace,
    load_configuration,
)
from orchard_env_server.backends.kubernetes_network import (
    EGRESS_POLICY,
    INGRESS_POLICY,
    LABEL_NAMESPACE_POLICY,
    OrchestratorPlace,
    api_server_addresses,
    egress_policy_manifest,
    host_addresses,
    ingress_policy_manifest,
    local_addresses,
    replace_patch,
)
from orchard_env_server.backends.kubernetes_spec import (
    ANNOTATION_RECORD,
    INIT_CONTAINER,
    LABEL_NAME,
    LABEL_NETWORK,
    LABEL_ROLE,
    LABEL_SANDBOX,
    LABEL_TENANT,
    MAIN_CONTAINER,
    ROLE_POLICY,
    ROLE_SANDBOX,
    ROLE_TOKEN,
    SECRET_MOUNT,
    TOKEN_KEY,
    label_value,
    network_policy_manifest,
    object_name,
    pod_manifest,
    record_from_pod,
    secret_manifest,
)
from orchard_env_server.backends.kubernetes_status import (
    FORCE_DELETE_MARGIN_S,
    force_delete_reason,
    view_pod,
)
from orchard_env_server.backends.kubernetes_watch import ResourceWatcher
from orchard_env_server.records import AgentEndpoint, SandboxRecord
from orchard_env_server.settings import Settings

pytestmark = pytest.mark.fast

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
TOKEN = "tok-3f9c2b7e5d1a4c8e9b0f6a2d7c4e1b8a"
ORCH = "orch-1"

sandbox_ids = st.from_regex(r"[a-z0-9-]{1,40}", fullmatch=True)
# Ids ending (or starting) in a dash are the ones object_name has to rewrite: draw them often.
dashy_ids = st.builds(
    lambda core, lead, trail: ("-" * lead + core + "-" * trail)[:40] or "-",
    st.from_regex(r"[a-z0-9-]{0,36}", fullmatch=True),
    st.integers(0, 2),
    st.integers(0, 3),
)
any_ids = st.one_of(sandbox_ids, dashy_ids)


def is_dns_label(name: str) -> bool:
    return len(name) <= 63 and DNS_LABEL.fullmatch(name) is not None


def is_label_value(value: str) -> bool:
    return len(value) <= 63 and LABEL_VALUE.fullmatch(value) is not None


def make_record(**overrides: Any) -> SandboxRecord:
    values: dict[str, Any] = {
        "sandbox_id": "sb-1234abcd",
        "tenant": "acme",
        "image": "python:3.12-slim",
    }
    values.update(overrides)
    return SandboxRecord(**values)


def main_container(pod: dict[str, Any]) -> dict[str, Any]:
    (main,) = [c for c in pod["spec"]["containers"] if c["name"] == MAIN_CONTAINER]
    return main


# --- object_name / label_value ------------------------------------------------------------


@given(any_ids)
def test_object_name_is_a_dns_label(sandbox_id):
    assert is_dns_label(object_name(sandbox_id)), object_name(sandbox_id)


@given(st.lists(any_ids, min_size=2, max_size=20, unique=True))
def test_distinct_ids_get_distinct_names(ids):
    assert len({object_name(i) for i in ids}) == len(ids)


@given(any_ids)
def test_object_name_is_stable(sandbox_id):
    assert object_name(sandbox_id) == object_name(sandbox_id)


def test_object_name_of_plain_and_dashed_ids():
    assert object_name("abc") == "orchard-abc"
    assert object_name("-abc") == "orchard--abc"
    for sandbox_id in ("abc-", "-", "----", "-a-", "a" * 39 + "-"):
        name = object_name(sandbox_id)
        assert is_dns_label(name), name
    assert object_name("abc-") != object_name("abc--")


@given(dashy_ids.filter(lambda i: i.endswith("-")))
def test_dashed_id_does_not_collide_with_a_plain_id(dashed):
    # A dash-ending id is renamed to <prefix>-<stripped id>-<hash>; the tail after the
    # prefix is itself a valid id whose plain name must not be that same name.
    tail = object_name(dashed).split("-", 1)[1]
    if re.fullmatch(r"[a-z0-9-]{1,40}", tail):
        assert object_name(tail) != object_name(dashed)


@given(st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", fullmatch=True))
def test_valid_label_values_pass_through(value):
    assert label_value(value) == value


@pytest.mark.parametrize(
    "value",
    ["", "-lead", "trail-", "_x", "x.", "a b", "tenant:key", "ü", "x" * 64, "a/b", "A" * 200],
)
def test_invalid_label_values_are_hashed(value):
    hashed = label_value(value)
    assert hashed != value
    assert hashed.startswith("h-")
    assert is_label_value(hashed)
    assert label_value(value) == hashed  # stable: selectors can be rebuilt from the value


@given(st.text(max_size=100))
def test_label_value_is_always_valid(value):
    assert is_label_value(label_value(value))


@given(st.text(max_size=80), st.text(max_size=80))
def test_distinct_hashed_label_values_differ(a, b):
    if a != b and label_value(a).startswith("h-") and label_value(b).startswith("h-"):
        assert label_value(a) != label_value(b)


def test_label_value_with_trailing_newline_is_hashed():
    assert is_label_value(label_value("acme\n"))


# --- pod_manifest -------------------------------------------------------------------------


def test_pod_spec_hardening():
    pod = pod_manifest(make_record(), Settings(), ORCH)
    spec = pod["spec"]
    assert pod["kind"] == "Pod"
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never"
    assert "activeDeadlineSeconds" not in spec  # no ttl


def test_a_failed_container_reports_its_log_tail():
    spec = pod_manifest(make_record(), Settings(), ORCH)["spec"]
    for container in spec["initContainers"] + spec["containers"]:
        assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


@pytest.mark.parametrize("runtime_class", [None, "gvisor"])
def test_pod_and_containers_are_confined(runtime_class):
    """Runtime's default seccomp, every capability dropped but the kept set, no privilege
    escalation, nothing of the node (network, PID, IPC namespaces, paths, ports)."""
    settings = Settings(runtime_class=runtime_class)
    spec = pod_manifest(make_record(), settings, ORCH)["spec"]
    assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    containers = spec["initContainers"] + spec["containers"]
    assert len(containers) == 2
    for container in containers:
        context = container["securityContext"]
        assert context["capabilities"]["drop"] == ["ALL"]
        assert set(context["capabilities"]["add"]) == set(SANDBOX_CAPABILITIES)
        assert not {"SYS_ADMIN", "NET_ADMIN", "MKNOD", "NET_RAW"} & set(
            context["capabilities"]["add"]
        )
        assert context["allowPrivilegeEscalation"] is False
        assert context["privileged"] is False
        assert "seccompProfile" not in context  # the pod's applies
        assert all("hostPort" not in port for port in container.get("ports", []))
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(key), key
    assert all(set(v) <= {"name", "emptyDir", "secret"} for v in spec["volumes"])
    assert spec["automountServiceAccountToken"] is False
    assert spec.get("runtimeClassName") == runtime_class


@pytest.mark.parametrize(("block_network", "value"), [(True, "blocked"), (False, "open")])
def test_the_pod_says_whether_its_network_is_open(block_network, value):
    pod = pod_manifest(make_record(block_network=block_network), Settings(), ORCH)
    assert pod["metadata"]["labels"][LABEL_NETWORK] == value


def test_pod_metadata_labels():
    record = make_record()
    pod = pod_manifest(record, Settings(), ORCH)
    meta = pod["metadata"]
    assert meta["name"] == object_name(record.sandbox_id)
    assert meta["labels"][LABEL_ROLE] == ROLE_SANDBOX
    assert meta["labels"][LABEL_NAME] == meta["name"]
    assert meta["labels"][LABEL_SANDBOX] == record.sandbox_id
    assert meta["labels"][LABEL_TENANT] == "acme"
    assert all(is_label_value(v) for v in meta["labels"].values())
    assert is_dns_label(pod["spec"]["hostname"])


def test_init_container_injects_the_agent_into_the_empty_dir():
    settings = Settings(agent_image="registry.example/agent-injector:7")
    pod = pod_manifest(make_record(), settings, ORCH)
    spec = pod["spec"]
    (init,) = spec["initContainers"]
    assert init["name"] == INIT_CONTAINER
    assert init["image"] == "registry.example/agent-injector:7"
    volumes = {v["name"]: v for v in spec["volumes"]}
    (mount,) = init["volumeMounts"]
    assert volumes[mount["name"]] == {"name": mount["name"], "emptyDir": {}}
    # The sandbox container sees the same volume, read-only, where agent_entry expects it.
    main = main_container(pod)
    agent_mounts = [m for m in main["volumeMounts"] if m["name"] == mount["name"]]
    assert agent_mounts == [{"name": mount["name"], "mountPath": AGENT_MOUNT, "readOnly": True}]


def test_main_container_runs_the_agent():
    record = make_record(image="ubuntu:24.04")
    pod = pod_manifest(record, Settings(), ORCH)
    main = main_container(pod)
    assert main["image"] == "ubuntu:24.04"
    assert main["command"] == agent_entry()
    args = main["args"]
    assert args[args.index("--token-file") + 1] == f"{SECRET_MOUNT}/{TOKEN_KEY}"
    assert "workingDir" not in main


def test_token_reaches_the_pod_only_through_the_secret_volume():
    record = make_record(labels={"team": "x"})
    record.agent = AgentEndpoint(base_url="http://10.0.0.9:7000", token=TOKEN)
    secret = secret_manifest(record, ORCH, TOKEN)
    pod = pod_manifest(record, Settings(), ORCH)

    assert TOKEN not in json.dumps(pod)
    assert TOKEN not in json.dumps(pod["metadata"]["labels"])
    assert TOKEN not in json.dumps(pod["metadata"]["annotations"])
    assert TOKEN not in json.dumps(secret["metadata"])

    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    token_mounts = [
        m for m in main_container(pod)["volumeMounts"] if m["mountPath"] == SECRET_MOUNT
    ]
    (token_mount,) = token_mounts
    assert token_mount["readOnly"] is True
    assert volumes[token_mount["name"]]["secret"]["secretName"] == secret["metadata"]["name"]
    assert secret["metadata"]["name"] == pod["metadata"]["name"]


def test_secret_manifest_holds_the_token():
    record = make_record()
    secret = secret_manifest(record, ORCH, TOKEN)
    assert secret["kind"] == "Secret"
    assert secret["stringData"] == {TOKEN_KEY: TOKEN}
    assert secret["metadata"]["name"] == object_name(record.sandbox_id)
    assert secret["metadata"]["labels"][LABEL_ROLE] == ROLE_TOKEN


@pytest.mark.parametrize(
    ("cpu", "memory", "expected"),
    [
        ("2", "1Gi", {"cpu": "2000m", "memory": str(1 << 30)}),
        ("500m", "512Mi", {"cpu": "500m", "memory": str(512 << 20)}),
        ("0.25", None, {"cpu": "250m"}),
        (None, "32Mi", {"memory": str(32 << 20)}),
    ],
)
def test_resources_requests_equal_limits(cpu, memory, expected):
    pod = pod_manifest(make_record(cpu=cpu, memory=memory), Settings(), ORCH)
    for container in (main_container(pod), pod["spec"]["initContainers"][0]):
        resources = container["resources"]
        assert resources["requests"] == resources["limits"] == expected


def test_no_resources_when_none_asked():
    pod = pod_manifest(make_record(), Settings(), ORCH)
    assert main_container(pod)["resources"] == {}


@pytest.mark.parametrize("memory", ["31Mi", "16Mi", "1000", "1k"])
def test_memory_below_the_agent_minimum_is_an_error(memory):
    with pytest.raises(BackendError, match="MiB"):
        pod_manifest(make_record(memory=memory), Settings(), ORCH)


@pytest.mark.parametrize("field", ["cpu", "memory"])
def test_unparseable_quantities_are_backend_errors(field):
    with pytest.raises(BackendError):
        pod_manifest(make_record(**{field: "lots"}), Settings(), ORCH)


@pytest.mark.parametrize(("ttl", "deadline"), [(60.0, 60), (0.2, 1), (90.5, 91), (0.0, 1)])
def test_ttl_becomes_active_deadline(ttl, deadline):
    pod = pod_manifest(make_record(ttl_seconds=ttl), Settings(), ORCH)
    assert pod["spec"]["activeDeadlineSeconds"] == deadline


def test_env_and_workdir_are_passed():
    record = make_record(env={"FOO": "bar", "EMPTY": ""}, workdir="/srv/app")
    main = main_container(pod_manifest(record, Settings(), ORCH))
    env = {e["name"]: e["value"] for e in main["env"]}
    assert env["FOO"] == "bar"
    assert env["EMPTY"] == ""
    assert env["ORCHARD_SANDBOX_ID"] == record.sandbox_id
    assert main["workingDir"] == "/srv/app"


def test_record_annotation_leaves_out_env():
    record = make_record(env={"SECRETISH": "value-in-env-only"})
    pod = pod_manifest(record, Settings(), ORCH)
    assert "value-in-env-only" not in pod["metadata"]["annotations"][ANNOTATION_RECORD]


# --- network_policy_manifest --------------------------------------------------------------


def test_network_policy_denies_the_pods_egress():
    record = make_record(sandbox_id="sb-net-")
    pod = pod_manifest(record, Settings(), ORCH)
    policy = network_policy_manifest(record, ORCH)
    assert policy["kind"] == "NetworkPolicy"
    assert policy["metadata"]["labels"][LABEL_ROLE] == ROLE_POLICY
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector == {LABEL_NAME: pod["metadata"]["labels"][LABEL_NAME]}
    assert policy["spec"]["policyTypes"] == ["Egress"]
    assert policy["spec"]["egress"] == []
    assert "ingress" not in policy["spec"]


# --- the namespace's policies (kubernetes_network) ---------------------------------------


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector's verdict on ``labels`` (matchLabels; In/NotIn as the API has it)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for term in selector.get("matchExpressions", []):
        value = labels.get(term["key"])
        inside = value is not None and value in term["values"]
        if (term["operator"] == "In") != inside:
            return False
    return True


IN_CLUSTER = OrchestratorPlace(namespace="orchard-system")
ON_A_HOST = OrchestratorPlace(addresses=("10.250.0.1", "10.244.0.1", "fd00::2"))


def pod_labels(**fields: Any) -> dict[str, str]:
    return pod_manifest(make_record(**fields), Settings(), ORCH)["metadata"]["labels"]


@pytest.mark.parametrize("place", [IN_CLUSTER, ON_A_HOST])
def test_the_ingress_policy_selects_every_sandbox_and_admits_only_the_orchestrator(place):
    policy = ingress_policy_manifest(place)
    assert policy["metadata"]["name"] == INGRESS_POLICY
    labels = policy["metadata"]["labels"]
    assert labels[LABEL_NAMESPACE_POLICY] == "ingress" and LABEL_ROLE not in labels
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    for fields in ({"block_network": True}, {"block_network": False}):
        assert selects(spec["podSelector"], pod_labels(**fields))
    assert not selects(spec["podSelector"], {"app": "something-else"})
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 7000}]
    sandbox = pod_labels()
    for peer in rule["from"]:
        # No peer may admit a sandbox pod: by pod labels, or by "any pod in any namespace".
        assert "podSelector" not in peer
        assert peer.get("namespaceSelector", {"x": 1}) != {}
        assert not selects(peer.get("podSelector", {"matchLabels": {"x": "y"}}), sandbox)
    if place is IN_CLUSTER:
        namespaces = [p["namespaceSelector"]["matchLabels"] for p in rule["from"]]
        assert namespaces == [
            {"kubernetes.io/metadata.name": "orchard-system"},
            {"orchard.dev/namespace": "orchard-system"},
        ]
    else:
        assert [p["ipBlock"]["cidr"] for p in rule["from"]] == [
            "10.250.0.1/32",
            "10.244.0.1/32",
            "fd00::2/128",
        ]


def test_with_no_orchestrator_address_the_ingress_policy_admits_no_one():
    # An ingress rule with no peers would admit everyone.
    assert ingress_policy_manifest(OrchestratorPlace())["spec"]["ingress"] == []


def test_the_egress_policy_selects_only_open_sandboxes():
    spec = egress_policy_manifest(ON_A_HOST, ["10.96.0.1"])["spec"]
    assert spec["policyTypes"] == ["Egress"]
    assert selects(spec["podSelector"], pod_labels(block_network=False))
    # A blocked sandbox must not be selected: policies add up, and this one allows.
    assert not selects(spec["podSelector"], pod_labels(block_network=True))
    assert not selects(spec["podSelector"], {LABEL_NETWORK: "open"})  # not a sandbox


def test_the_egress_policy_excepts_the_api_server_and_the_orchestrators_host():
    policy = egress_policy_manifest(ON_A_HOST, ["10.96.0.1", "10.250.0.1", "2001:db8::1"])
    assert policy["metadata"]["name"] == EGRESS_POLICY
    assert LABEL_ROLE not in policy["metadata"]["labels"]
    (rule,) = policy["spec"]["egress"]
    v4, v6, pods = rule["to"]
    assert v4["ipBlock"] == {
        "cidr": "0.0.0.0/0",
        "except": ["10.96.0.1/32", "10.244.0.1/32", "10.250.0.1/32"],
    }
    assert v6["ipBlock"] == {"cidr": "::/0", "except": ["2001:db8::1/128", "fd00::2/128"]}
    assert pods == {"namespaceSelector": {}, "podSelector": {}}
    assert "ports" not in rule


def test_in_the_cluster_egress_leaves_out_the_orchestrators_namespace():
    (rule,) = egress_policy_manifest(IN_CLUSTER, [])["spec"]["egress"]
    v4, v6, pods = rule["to"]
    assert v4["ipBlock"] == {"cidr": "0.0.0.0/0"} and v6["ipBlock"] == {"cidr": "::/0"}
    namespaces = pods["namespaceSelector"]
    assert not selects(namespaces, {"kubernetes.io/metadata.name": "orchard-system"})
    assert not selects(namespaces, {"orchard.dev/namespace": "orchard-system"})
    assert selects(namespaces, {"kubernetes.io/metadata.name": "kube-system"})
    assert selects(namespaces, {})  # a 1.20 namespace without labels


def test_the_patch_replaces_the_whole_spec():
    manifest = egress_policy_manifest(IN_CLUSTER, ["10.96.0.1"])
    patch = replace_patch(manifest)
    assert patch["spec"].pop("$patch") == "replace"
    assert patch["spec"] == manifest["spec"]
    assert patch["metadata"] == {"labels": manifest["metadata"]["labels"]}


def test_api_server_addresses_come_from_the_service_its_endpoints_and_the_url():
    service = {"spec": {"clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1", "fd00:96::1"]}}
    endpoints = {
        "subsets": [
            {"addresses": [{"ip": "10.250.0.1"}, {"ip": "10.250.0.2"}], "ports": [{"port": 6443}]}
        ]
    }
    assert api_server_addresses(service, endpoints, "https://10.250.0.1:6443") == [
        "10.96.0.1",
        "fd00:96::1",
        "10.250.0.1",
        "10.250.0.2",
    ]
    assert api_server_addresses({"spec": {"clusterIP": "10.0.0.1"}}, None, "https://k8s:443") == [
        "10.0.0.1"
    ]
    # Neither a host name nor loopback (a kind cluster's URL) can be excepted.
    assert api_server_addresses(None, None, "https://127.0.0.1:39211") == []
    assert api_server_addresses(None, None, "https://[2001:db8::5]:6443") == ["2001:db8::5"]


FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 4
     +-- 10.244.0.0/24 2 0 2
        |-- 10.244.0.0
           /24 link UNICAST
        |-- 10.244.0.1
           /32 host LOCAL
        |-- 10.244.0.255
           /32 link BROADCAST
     |-- 10.250.0.1
        /32 host LOCAL
     +-- 127.0.0.0/8 2 0 2
        |-- 127.0.0.1
           /32 host LOCAL
Local:
  +-- 0.0.0.0/0 3 0 4
     |-- 10.250.0.1
        /32 host LOCAL
"""
IF_INET6 = """00000000000000000000000000000001 01 80 10 80       lo
fe8000000000000080aa6afffe8d4b7f 08 40 20 80 orchard-node0
fd000000000000000000000000000002 04 40 00 82     eth0
"""


def test_local_addresses_are_the_hosts_own_without_loopback_or_link_local():
    assert local_addresses(FIB_TRIE, IF_INET6) == ["10.244.0.1", "10.250.0.1", "fd00::2"]
    assert local_addresses("", "") == []


def test_host_addresses_read_the_kernels_tables(tmp_path):
    (tmp_path / "fib_trie").write_text(FIB_TRIE)
    assert host_addresses(tmp_path) == ("10.244.0.1", "10.250.0.1")  # no IPv6 table
    assert "127.0.0.1" not in host_addresses()  # this machine's


def test_the_pods_namespace_is_read_only_in_the_cluster(tmp_path, monkeypatch):
    (tmp_path / "namespace").write_text("orchard-system\n")
    monkeypatch.setattr(kubernetes_api, "_SERVICE_ACCOUNT", tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    assert in_cluster_namespace(None) == "orchard-system"
    assert in_cluster_namespace(tmp_path / "kubeconfig") is None  # a kubeconfig wins
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    assert in_cluster_namespace(None) is None


class PolicyApi:
    """The calls ``_ensure_network_policies`` makes; ``existing`` policies answer 409."""

    namespace = "sandboxes"
    server = "https://10.250.0.1:6443"

    def __init__(self, existing: tuple[str, ...] = (), refuse: int | None = None) -> None:
        self.existing, self.refuse = set(existing), refuse
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    async def read_api_server_object(self, kind: str) -> dict[str, Any] | None:
        return {"spec": {"clusterIP": "10.96.0.1"}} if kind == "services" else None

    async def create(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        self.calls.append(("create", name, body))
        if self.refuse:
            raise KubeError(self.refuse, f"{self.refuse} no")
        if name in self.existing:
            raise KubeError(409, "409 AlreadyExists")
        self.existing.add(name)
        return body

    async def patch(self, kind: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("patch", name, body))
        return body


def test_the_backend_creates_the_policies_or_patches_existing_ones(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    backend = KubernetesBackend(Settings(backend="kubernetes", state_dir=tmp_path))
    api = PolicyApi(existing=(EGRESS_POLICY,))
    backend._api = api  # type: ignore[assignment]
    asyncio.run(backend._ensure_network_policies())
    assert [(verb, name) for verb, name, _ in api.calls] == [
        ("create", INGRESS_POLICY),
        ("create", EGRESS_POLICY),
        ("patch", EGRESS_POLICY),
    ]
    egress = api.calls[-1][2]["spec"]["egress"][0]["to"][0]["ipBlock"]["except"]
    assert {"10.96.0.1/32", "10.250.0.1/32"} <= set(egress)


def test_a_cluster_that_refuses_the_policies_stops_the_start(tmp_path):
    backend = KubernetesBackend(Settings(backend="kubernetes", state_dir=tmp_path))
    backend._api = PolicyApi(refuse=403)  # type: ignore[assignment]
    with pytest.raises(BackendError, match="network policies"):
        asyncio.run(backend._ensure_network_policies())


def test_a_runtime_class_the_cluster_lacks_is_named_as_such(tmp_path):
    backend = KubernetesBackend(
        Settings(backend="kubernetes", state_dir=tmp_path, runtime_class="gvisor")
    )
    rejected = KubeError(
        403, '403 pods "orchard-x" is forbidden: pod rejected: RuntimeClass "gvisor" not found'
    )
    assert "runtime class 'gvisor' is not in the cluster" in str(backend._create_error(rejected))
    assert "may not create" in str(backend._create_error(KubeError(403, "403 forbidden")))


# --- record_from_pod ----------------------------------------------------------------------


def test_record_round_trips_through_the_pod():
    record = make_record(
        sandbox_id="sb-round-trip",
        tenant="tenant:with:colons",
        image="ghcr.io/acme/img:1",
        block_network=False,
        cpu="1500m",
        memory="256Mi",
        timeout=42.0,
        env={"A": "1", "B": "two words"},
        workdir="/work",
        labels={"team": "core", "run": "7"},
        ttl_seconds=600.0,
        idle_timeout_seconds=120.0,
        created_at=1_700_000_000.25,
    )
    pod = pod_manifest(record, Settings(), ORCH)
    pod["metadata"]["uid"] = "uid-1"
    back = record_from_pod(json.loads(json.dumps(pod)))  # as it comes back from the API
    assert back is not None
    for field in (
        "sandbox_id",
        "tenant",
        "image",
        "block_network",
        "cpu",
        "memory",
        "timeout",
        "env",
        "workdir",
        "labels",
        "ttl_seconds",
        "idle_timeout_seconds",
        "created_at",
    ):
        assert getattr(back, field) == getattr(record, field), field
    assert back.backend_state == {"pod": pod["metadata"]["name"]}


def test_record_defaults_round_trip():
    record = make_record()
    back = record_from_pod(pod_manifest(record, Settings(), ORCH))
    assert back is not None
    assert (back.cpu, back.memory, back.ttl_seconds, back.workdir) == (None, None, None, None)
    assert back.env == {}
    assert back.block_network is True


@pytest.mark.parametrize(
    "pod",
    [
        {},
        {"metadata": {"name": "x"}},
        {"metadata": {"annotations": {ANNOTATION_RECORD: "not json"}}},
        {"metadata": {"annotations": {ANNOTATION_RECORD: json.dumps({"tenant": "t"})}}},
        {"metadata": {"annotations": {ANNOTATION_RECORD: "[1, 2]"}}},
    ],
)
def test_unreadable_pods_give_no_record(pod):
    assert record_from_pod(pod) is None


# --- view_pod -----------------------------------------------------------------------------


def pod_with(status: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "orchard-sb", "uid": "u-1", **meta}, "status": status}


def waiting_on(name: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"name": name, "state": {"waiting": {"reason": reason, "message": message}}}


def test_ready_pod():
    view = view_pod(
        pod_with(
            {
                "phase": "Running",
                "podIP": "10.1.2.3",
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Ready", "status": "True"},
                ],
                "containerStatuses": [{"name": MAIN_CONTAINER, "state": {"running": {}}}],
            }
        )
    )
    assert view.ready is True
    assert view.ip == "10.1.2.3"
    assert (view.name, view.uid) == ("orchard-sb", "u-1")
    assert view.failure is None and view.waiting is None
    assert view.deleting is False


def test_running_but_not_ready_pod_is_waiting():
    view = view_pod(
        pod_with(
            {
                "phase": "Running",
                "podIP": "10.1.2.3",
                "conditions": [{"type": "Ready", "status": "False"}],
                "containerStatuses": [{"name": MAIN_CONTAINER, "state": {"running": {}}}],
            }
        )
    )
    assert view.ready is False
    assert view.failure is None
    assert view.waiting == "Running"


def test_empty_pod_status():
    view = view_pod({})
    assert view.ready is False and view.ip is None and view.failure is None
    assert view.deleting is False


@pytest.mark.parametrize("reason", ["ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff"])
@pytest.mark.parametrize(
    ("container", "key", "who"),
    [
        (MAIN_CONTAINER, "containerStatuses", "sandbox container"),
        (INIT_CONTAINER, "initContainerStatuses", "agent injector"),
    ],
)
def test_image_trouble_is_a_failure(reason, container, key, who):
    message = f'image "nope:1" for {container}'
    status = {
        "phase": "Pending",
        "conditions": [{"type": "Ready", "status": "False"}],
        key: [waiting_on(container, reason, message)],
    }
    view = view_pod(pod_with(status))
    assert view.ready is False
    assert view.failure is not None
    assert reason in view.failure
    assert who in view.failure
    assert message in view.failure
    assert reason in (view.waiting or "")


def test_failure_without_a_message_has_no_dangling_colon():
    status = {"phase": "Pending", "containerStatuses": [waiting_on(MAIN_CONTAINER, "ErrImagePull")]}
    failure = view_pod(pod_with(status)).failure
    assert failure is not None and failure.endswith(")")


def test_ordinary_waiting_is_not_a_failure():
    status = {
        "phase": "Pending",
        "initContainerStatuses": [waiting_on(INIT_CONTAINER, "PodInitializing")],
        "containerStatuses": [waiting_on(MAIN_CONTAINER, "ContainerCreating")],
    }
    view = view_pod(pod_with(status))
    assert view.failure is None
    assert view.waiting is not None and "PodInitializing" in view.waiting


def test_deadline_exceeded():
    status = {
        "phase": "Failed",
        "reason": "DeadlineExceeded",
        "message": "Pod was active on the node longer than the specified deadline",
    }
    view = view_pod(pod_with(status))
    assert view.failure is not None
    assert "Failed" in view.failure
    assert "DeadlineExceeded" in view.failure
    assert "deadline" in view.failure


def test_oom_killed_sandbox_container():
    status = {
        "phase": "Failed",
        "initContainerStatuses": [
            {
                "name": INIT_CONTAINER,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
            }
        ],
        "containerStatuses": [
            {
                "name": MAIN_CONTAINER,
                "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
            }
        ],
    }
    failure = view_pod(pod_with(status)).failure
    assert failure is not None
    assert "OOM" in failure
    assert "137" in failure
    assert INIT_CONTAINER not in failure  # its clean exit is not news


def test_failed_init_container_is_reported():
    status = {
        "phase": "Failed",
        "initContainerStatuses": [
            {
                "name": INIT_CONTAINER,
                "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "no space"}},
            }
        ],
    }
    failure = view_pod(pod_with(status)).failure
    assert failure is not None
    assert INIT_CONTAINER in failure and "no space" in failure


def test_unschedulable_pod_is_waiting_not_failed():
    message = "0/3 nodes are available: 3 Insufficient memory."
    status = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
            }
        ],
    }
    view = view_pod(pod_with(status))
    assert view.failure is None
    assert view.ready is False
    assert view.waiting is not None
    assert "not scheduled" in view.waiting
    assert message in view.waiting


def test_deleting_pod():
    view = view_pod(pod_with({"phase": "Running"}, deletionTimestamp="2024-01-01T00:00:00Z"))
    assert view.deleting is True


# --- ResourceWatcher ----------------------------------------------------------------------


def obj(name: str, rv: str, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}, **extra}


def event(kind: str, name: str, rv: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "object": obj(name, rv, **extra)}


class FakeApi:
    """Scripted answers to list_objects and watch; when the script ends, watches hang."""

    def __init__(
        self,
        lists: list[tuple[list[dict[str, Any]], str]],
        watches: list[list[dict[str, Any] | BaseException]],
    ) -> None:
        self._lists = list(lists)
        self._watches = list(watches)
        self.list_calls: list[tuple[str, str]] = []
        self.watch_calls: list[tuple[str, str, str, int]] = []
        self.exhausted = asyncio.Event()

    async def list_objects(self, kind: str, selector: str) -> tuple[list[dict[str, Any]], str]:
        self.list_calls.append((kind, selector))
        if not self._lists:
            raise AssertionError("unexpected LIST")
        items, rv = self._lists.pop(0)
        return [json.loads(json.dumps(i)) for i in items], rv

    async def watch(self, kind: str, selector: str, resource_version: str, timeout_s: int):
        self.watch_calls.append((kind, selector, resource_version, timeout_s))
        if not self._watches:
            self.exhausted.set()
            await asyncio.Event().wait()  # hang until cancelled
        for item in self._watches.pop(0):
            await asyncio.sleep(0)
            if isinstance(item, BaseException):
                raise item
            yield item

    @property
    def watched_versions(self) -> list[str]:
        return [call[2] for call in self.watch_calls]


class Recorder:
    def __init__(self) -> None:
        self.log: list[tuple[str, str, str]] = []

    def upsert(self, o: dict[str, Any]) -> None:
        self.log.append(("upsert", o["metadata"]["name"], o["metadata"]["resourceVersion"]))

    def delete(self, o: dict[str, Any]) -> None:
        self.log.append(("delete", o["metadata"]["name"], o["metadata"]["resourceVersion"]))


def run_watcher(api: FakeApi, timeout_s: float = 5.0) -> tuple[ResourceWatcher, Recorder]:
    """Run a watcher until the fake's script is used up, then cancel it."""
    recorder = Recorder()

    async def main() -> ResourceWatcher:
        watcher = ResourceWatcher(
            api,  # type: ignore[arg-type]
            "pods",
            "orchard.dev/role=sandbox",
            recorder.upsert,
            recorder.delete,
            watch_timeout_s=100,
        )
        task = asyncio.create_task(watcher.run_forever())
        try:
            done, _ = await asyncio.wait(
                [task, asyncio.create_task(api.exhausted.wait())],
                timeout=timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if task in done:
                task.result()  # re-raise what ended the watcher
                raise AssertionError("the watcher returned")
            assert api.exhausted.is_set(), "the watcher did not use up its script in time"
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        return watcher

    return asyncio.run(main()), recorder


def test_initial_list_reports_every_object_and_syncs():
    api = FakeApi(lists=[([obj("a", "5"), obj("b", "6")], "10")], watches=[])
    watcher, rec = run_watcher(api)
    assert watcher.synced.is_set()
    assert set(watcher.objects) == {"a", "b"}
    assert sorted(rec.log) == [("upsert", "a", "5"), ("upsert", "b", "6")]
    assert api.list_calls == [("pods", "orchard.dev/role=sandbox")]
    assert api.watched_versions == ["10"]
    kind, selector, _, timeout = api.watch_calls[0]
    assert (kind, selector) == ("pods", "orchard.dev/role=sandbox")
    assert 80 <= timeout <= 120  # the jittered server-side timeout
    assert watcher.stats()["lists"] == 1 and watcher.stats()["objects"] == 2


def test_events_update_objects_and_call_handlers():
    api = FakeApi(
        lists=[([obj("a", "5")], "10")],
        watches=[
            [
                event("ADDED", "b", "11"),
                event("MODIFIED", "a", "12", status={"phase": "Running"}),
                event("DELETED", "b", "13"),
                event("ADDED", "c", "14"),
            ]
        ],
    )
    watcher, rec = run_watcher(api)
    assert rec.log == [
        ("upsert", "a", "5"),
        ("upsert", "b", "11"),
        ("upsert", "a", "12"),
        ("delete", "b", "13"),
        ("upsert", "c", "14"),
    ]
    assert set(watcher.objects) == {"a", "c"}
    assert watcher.objects["a"]["status"] == {"phase": "Running"}
    # The server ended the watch; it was re-opened from the last version seen.
    assert api.watched_versions == ["10", "14"]
    assert watcher.reconnects == 1
    assert watcher.lists == 1 and watcher.gone == 0


def test_deleting_an_unknown_object_is_harmless():
    api = FakeApi(lists=[([], "1")], watches=[[event("DELETED", "ghost", "2")]])
    watcher, rec = run_watcher(api)
    assert watcher.objects == {}
    assert rec.log == [("delete", "ghost", "2")]
    assert api.watched_versions == ["1", "2"]


def test_bookmark_only_advances_the_version():
    api = FakeApi(
        lists=[([obj("a", "5")], "10")],
        watches=[[{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "50"}}}]],
    )
    watcher, rec = run_watcher(api)
    assert rec.log == [("upsert", "a", "5")]
    assert set(watcher.objects) == {"a"}
    assert api.watched_versions == ["10", "50"]


@pytest.mark.parametrize(
    "gone",
    [
        {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}},
        KubeError(410, "410 Gone: too old resource version"),
    ],
    ids=["error-event", "kube-error"],
)
def test_gone_relists_and_reports_what_vanished(gone):
    api = FakeApi(
        lists=[
            ([obj("a", "5"), obj("b", "6")], "10"),
            ([obj("b", "30"), obj("c", "31")], "40"),  # a vanished meanwhile, c appeared
        ],
        watches=[[event("MODIFIED", "a", "11"), gone]],
    )
    watcher, rec = run_watcher(api)
    assert watcher.gone == 1
    assert watcher.lists == 2
    assert len(api.list_calls) == 2
    assert set(watcher.objects) == {"b", "c"}
    assert watcher.objects["b"]["metadata"]["resourceVersion"] == "30"
    after_relist = rec.log[3:]
    assert ("delete", "a", "11") in after_relist  # the last known copy of a
    assert ("upsert", "b", "30") in after_relist
    assert ("upsert", "c", "31") in after_relist
    assert [e for e in after_relist if e[0] == "delete"] == [("delete", "a", "11")]
    # The new watch starts from the new list's version, not the stale one.
    assert api.watched_versions == ["10", "40"]
    assert watcher.error is None


def test_other_errors_are_retried_from_the_same_version():
    api = FakeApi(
        lists=[([obj("a", "5")], "10")],
        watches=[[KubeError(0, "the API server is unreachable: refused")], []],
    )
    watcher, _ = run_watcher(api)
    assert watcher.gone == 0 and watcher.lists == 1
    assert api.watched_versions == ["10", "10", "10"]
    assert watcher.reconnects >= 2


def test_error_event_with_another_code_is_retried():
    api = FakeApi(
        lists=[([], "10")],
        watches=[[{"type": "ERROR", "object": {"code": 500, "message": "internal"}}]],
    )
    watcher, _ = run_watcher(api)
    assert watcher.gone == 0 and watcher.lists == 1
    assert api.watched_versions == ["10", "10"]
    assert watcher.error is not None and "internal" in watcher.error


def test_watch_resumes_after_a_dropped_connection_from_the_last_version_seen():
    api = FakeApi(
        lists=[([], "10")],
        watches=[[event("ADDED", "a", "11"), KubeError(0, "connection reset")]],
    )
    run_watcher(api)
    assert api.watched_versions == ["10", "11"]


# --- force_delete_reason --------------------------------------------------------------------


RUNNING = {"running": {"startedAt": "2024-01-01T00:00:00Z"}}
TERMINATED = {"terminated": {"exitCode": 137, "reason": "Error"}}
DELETING = {"deletionTimestamp": "2024-01-01T00:00:01Z", "deletionGracePeriodSeconds": 1}


def pod_state(
    phase: str, main: dict[str, Any] | None = None, reason: str | None = None, **meta: Any
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if reason:
        status["reason"] = reason
    if main is not None:
        status["initContainerStatuses"] = [
            {"name": INIT_CONTAINER, "state": {"terminated": {"exitCode": 0}}}
        ]
        status["containerStatuses"] = [{"name": MAIN_CONTAINER, "state": main}]
    pod = pod_with(status, **meta)
    pod["spec"] = {"terminationGracePeriodSeconds": 1}
    return pod


# kubernetes/kubernetes#88613: failed at its deadline, yet the container "still runs".
DEADLINE_POD = pod_state("Failed", RUNNING, "DeadlineExceeded")


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        (pod_state("Running", RUNNING), None),
        (pod_state("Pending"), None),
        (pod_state("Pending", {"waiting": {"reason": "ContainerCreating"}}), None),
        (DEADLINE_POD, "DeadlineExceeded"),
        (pod_state("Running", RUNNING, "DeadlineExceeded"), "DeadlineExceeded"),
        (pod_state("Failed", TERMINATED), "phase Failed"),
        (pod_state("Succeeded", {"terminated": {"exitCode": 0}}), "phase Succeeded"),
        (pod_state("Failed", None, "Evicted"), "phase Failed"),
        (pod_state("Running", TERMINATED), "exited"),  # the phase lags behind
    ],
)
def test_what_to_force_delete_before_deleting(pod, why):
    reason = force_delete_reason(pod)
    assert (reason is None) if why is None else (why in (reason or ""))


def test_a_pod_stuck_by_its_deadline_is_forced_at_once_while_deleting():
    pod = json.loads(json.dumps(DEADLINE_POD))
    pod["metadata"].update(DELETING)
    assert "DeadlineExceeded" in (force_delete_reason(pod, deleting_for_s=0.0) or "")
    ended = pod_state("Failed", RUNNING, **DELETING)  # ended, yet a container "runs"
    assert force_delete_reason(ended, deleting_for_s=0.0) is not None


@pytest.mark.parametrize(
    "pod",
    [
        pod_state("Running", RUNNING, **DELETING),
        pod_state("Running", TERMINATED, **DELETING),
        pod_state("Failed", TERMINATED, **DELETING),  # the way out of a graceful delete
        pod_state("Succeeded", {"terminated": {"exitCode": 0}}, **DELETING),
    ],
)
def test_an_ordinary_graceful_deletion_is_left_to_the_kubelet_until_overdue(pod):
    grace = pod["metadata"]["deletionGracePeriodSeconds"]
    assert force_delete_reason(pod, deleting_for_s=0.0) is None
    assert force_delete_reason(pod, deleting_for_s=grace + FORCE_DELETE_MARGIN_S - 0.1) is None
    why = force_delete_reason(pod, deleting_for_s=grace + FORCE_DELETE_MARGIN_S + 0.1)
    assert why is not None and "still there" in why


def test_overdue_counts_the_deletion_grace_then_the_spec_then_the_default():
    pod = pod_state("Running", RUNNING, deletionTimestamp="t", deletionGracePeriodSeconds=60)
    assert force_delete_reason(pod, deleting_for_s=40, margin_s=10) is None
    assert force_delete_reason(pod, deleting_for_s=71, margin_s=10) is not None
    pod = pod_state("Running", RUNNING, deletionTimestamp="t")
    assert force_delete_reason(pod, deleting_for_s=12, margin_s=10) is not None  # spec: 1 s
    del pod["spec"]
    assert force_delete_reason(pod, deleting_for_s=39, margin_s=10) is None  # default 30 s
    assert force_delete_reason(pod, deleting_for_s=41, margin_s=10) is not None


def test_a_pod_not_being_deleted_is_never_overdue():
    pod = pod_state("Running", RUNNING)
    assert force_delete_reason(pod, deleting_for_s=10_000.0) is None


@given(
    phase=st.sampled_from(["Pending", "Running", "Failed", "Succeeded", "Unknown"]),
    main=st.sampled_from([None, RUNNING, TERMINATED, {"waiting": {"reason": "x"}}]),
    reason=st.sampled_from([None, "DeadlineExceeded", "Evicted"]),
    grace=st.integers(0, 120),
    t1=st.floats(0, 1000),
    t2=st.floats(0, 1000),
)
def test_once_due_a_force_delete_stays_due(phase, main, reason, grace, t1, t2):
    pod = pod_state(phase, main, reason, deletionTimestamp="t", deletionGracePeriodSeconds=grace)
    early, late = sorted((t1, t2))
    if force_delete_reason(pod, deleting_for_s=early) is not None:
        assert force_delete_reason(pod, deleting_for_s=late) is not None
    if force_delete_reason(pod, deleting_for_s=early) is not None:
        # Whatever is due while deleting was due before deleting, or is overdue by now.
        assert force_delete_reason(pod) is not None or early > grace + FORCE_DELETE_MARGIN_S


# --- the backend's deletions ------------------------------------------------------------------


class DeleteApi:
    """Records the backend's delete calls; ``missing`` names answer 404."""

    def __init__(self) -> None:
        self.deletes: list[tuple[str, str, int | None, str | None]] = []
        self.missing: set[str] = set()

    async def delete(
        self, kind: str, name: str, *, grace_period_s: int | None = None, uid: str | None = None
    ) -> bool:
        self.deletes.append((kind, name, grace_period_s, uid))
        return name not in self.missing

    async def patch(self, kind: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return body


class Pods:
    def __init__(self, *pods: dict[str, Any]) -> None:
        self.objects = {p["metadata"]["name"]: p for p in pods}


class Registry:
    def __init__(self) -> None:
        self.lost_ids: list[tuple[str, str]] = []
        self.expired_ids: list[str] = []
        self.found: list[SandboxRecord] = []

    def discovered(self, record: SandboxRecord) -> None:
        self.found.append(record)

    def lost(self, sandbox_id: str, reason: str) -> None:
        self.lost_ids.append((sandbox_id, reason))

    def expired(self, sandbox_id: str) -> None:
        self.expired_ids.append(sandbox_id)


def make_backend(tmp_path: Path, *pods: dict[str, Any]) -> tuple[KubernetesBackend, DeleteApi]:
    backend = KubernetesBackend(Settings(backend="kubernetes", state_dir=tmp_path))
    api = DeleteApi()
    backend._api = api  # type: ignore[assignment]
    backend._pods = Pods(*pods)  # type: ignore[assignment]
    backend._secrets = Pods()  # type: ignore[assignment]
    return backend, api


def pod_deletes(api: DeleteApi) -> list[tuple[str, int | None, str | None]]:
    return [(name, grace, uid) for kind, name, grace, uid in api.deletes if kind == "pods"]


@pytest.mark.parametrize(
    ("pod", "forced"),
    [
        (DEADLINE_POD, True),
        (pod_state("Failed", TERMINATED), True),
        (pod_state("Running", RUNNING), False),
    ],
)
def test_deleting_an_ended_pod_forces_it_with_its_uid(tmp_path, pod, forced):
    backend, api = make_backend(tmp_path, pod)
    assert asyncio.run(backend._delete_objects("orchard-sb")) is True
    expected = [("orchard-sb", 0, "u-1")] if forced else [("orchard-sb", None, None)]
    assert pod_deletes(api) == expected
    kinds = [kind for kind, *_ in api.deletes]
    assert kinds == ["pods", "secrets", "networkpolicies"]


def test_a_pod_forced_on_delete_is_not_forced_again_when_seen_deleting(tmp_path):
    async def main() -> list[tuple[str, int | None, str | None]]:
        backend, api = make_backend(tmp_path, DEADLINE_POD)
        await backend._delete_objects("orchard-sb")
        deleting = json.loads(json.dumps(DEADLINE_POD))
        deleting["metadata"].update(DELETING)
        backend._on_pod(deleting)
        await asyncio.sleep(0)
        backend._pods.objects.clear()  # then gone: what was kept about it goes
        await backend._maintain_once()
        assert backend._states == {}  # nothing kept once the pod is gone
        return pod_deletes(api)

    assert asyncio.run(main()) == [("orchard-sb", 0, "u-1")]


def test_a_forced_delete_that_misses_the_watched_pod_deletes_gently(tmp_path):
    backend, api = make_backend(tmp_path, DEADLINE_POD)
    api.missing.add("orchard-sb")  # gone already, or another uid
    asyncio.run(backend._delete_objects("orchard-sb"))
    assert pod_deletes(api) == [("orchard-sb", 0, "u-1"), ("orchard-sb", None, None)]


def test_an_unwatched_pod_is_deleted_gently(tmp_path):
    backend, api = make_backend(tmp_path)
    asyncio.run(backend._delete_objects("orchard-sb"))
    assert pod_deletes(api) == [("orchard-sb", None, None)]


def test_a_pod_stuck_terminating_is_force_deleted_once_overdue(tmp_path):
    pod = pod_state("Running", RUNNING, **DELETING)

    async def main() -> list[tuple[str, int | None, str | None]]:
        backend, api = make_backend(tmp_path, pod)
        backend._on_pod(pod)  # first seen being deleted: the kubelet's turn
        await asyncio.sleep(0)
        assert pod_deletes(api) == []
        await backend._maintain_once()
        assert pod_deletes(api) == []
        state = backend._states["orchard-sb"]
        assert state.deleting_since is not None
        state.deleting_since -= FORCE_DELETE_MARGIN_S + 2  # time passes
        await backend._maintain_once()
        await asyncio.sleep(0)
        await backend._maintain_once()  # no second force for the same pod
        await asyncio.sleep(0)
        backend._on_pod_gone(pod)
        assert "orchard-sb" not in backend._states
        return pod_deletes(api)

    assert asyncio.run(main()) == [("orchard-sb", 0, "u-1")]


def test_a_deadline_pod_being_deleted_is_forced_at_once(tmp_path):
    pod = json.loads(json.dumps(DEADLINE_POD))
    pod["metadata"].update(DELETING)

    async def main() -> list[tuple[str, int | None, str | None]]:
        backend, api = make_backend(tmp_path, pod)
        backend._on_pod(pod)
        backend._on_pod(pod)  # a second event: still one force delete
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return pod_deletes(api)

    assert asyncio.run(main()) == [("orchard-sb", 0, "u-1")]


@pytest.mark.parametrize(
    ("age_s", "ttl_reached"),
    [(10.0, True), (4.0, True), (-100.0, False)],  # the last: a node clock far ahead
)
def test_a_pod_ended_at_its_deadline_is_force_deleted_and_terminated_by_its_ttl(
    tmp_path, age_s, ttl_reached
):
    """Not a failure: the pod goes at once, and once it is gone the sandbox is reaped for
    its ttl (``expired``: terminated, then forgotten), or, if the orchestrator's clock
    says the ttl is far off, reported ``lost`` to the pod's deadline."""
    record = make_record(ttl_seconds=5)
    record.created_at = time.time() - age_s
    pod = pod_manifest(record, Settings(backend="kubernetes"), ORCH)
    pod["metadata"]["uid"] = "u-9"
    pod["status"] = DEADLINE_POD["status"]
    name = pod["metadata"]["name"]

    async def main() -> tuple[Registry, DeleteApi, KubernetesBackend]:
        backend, api = make_backend(tmp_path, pod)
        registry = Registry()
        backend.attach(registry)
        backend._on_pod(pod)  # found (as after a restart), already ended by the kubelet
        backend._on_pod(pod)  # acted upon once
        for _ in range(5):
            await asyncio.sleep(0)
        assert registry.lost_ids == []  # no failure, no "deleted out of band"
        assert all(state.dead is None for state in backend._states.values())
        backend._on_pod_gone(pod)
        return registry, api, backend

    registry, api, backend = asyncio.run(main())
    assert [r.sandbox_id for r in registry.found] == [record.sandbox_id]
    assert pod_deletes(api) == [(name, 0, "u-9")]  # deleted by force, once
    if ttl_reached:
        assert (registry.expired_ids, registry.lost_ids) == ([record.sandbox_id], [])
    else:
        [(sandbox_id, why)] = registry.lost_ids
        assert sandbox_id == record.sandbox_id and "deadline" in why, why
        assert registry.expired_ids == []
    assert backend._states == {}


# --- CredentialFiles: the kubeconfig's TLS material -------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write_kubeconfig(path: Path) -> Path:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": {
                    "server": "https://127.0.0.1:1",
                    "certificate-authority-data": b64(b"CA-PEM"),
                },
            }
        ],
        "users": [
            {
                "name": "u",
                "user": {
                    "client-certificate-data": b64(b"CERT-PEM"),
                    "client-key-data": b64(b"SECRET-KEY-PEM"),
                },
            }
        ],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


@pytest.fixture
def private_tmpdir(tmp_path, monkeypatch):
    """$TMPDIR of the test: where the client would put its files."""
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_tls_material_goes_to_a_private_directory_and_is_removed(tmp_path, private_tmpdir):
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig")
    files = CredentialFiles(tmp_path / "state" / "credentials")
    cfg = load_configuration(kubeconfig, files)
    assert files.path is not None
    assert mode(files.root) == 0o700 and mode(files.path) == 0o700
    paths = {Path(p) for p in (cfg.ssl_ca_cert, cfg.cert_file, cfg.key_file)}
    assert {p.parent for p in paths} == {files.path}
    assert sorted(p.read_bytes() for p in paths) == [b"CA-PEM", b"CERT-PEM", b"SECRET-KEY-PEM"]
    assert all(mode(p) == 0o600 for p in paths)
    assert list(private_tmpdir.iterdir()) == []
    registry = kube_config._temp_files.values()
    assert not any(Path(p).parent == files.path for p in registry)
    # Another load of the same kubeconfig gets files of its own, not a cached path.
    other = CredentialFiles(tmp_path / "state" / "credentials")
    cfg2 = load_configuration(kubeconfig, other)
    assert Path(cfg2.key_file).parent == other.path != files.path
    files.remove()
    assert not any(p.exists() for p in paths)
    assert Path(cfg2.key_file).read_bytes() == b"SECRET-KEY-PEM"  # the other's is intact
    other.remove()
    assert list(files.root.iterdir()) == []
    assert list(private_tmpdir.iterdir()) == []


def test_without_a_private_directory_the_client_leaves_its_files_in_tmpdir(
    tmp_path, private_tmpdir
):
    """The bug CredentialFiles fixes: the key lands in $TMPDIR, removed only at exit."""
    cfg = load_configuration(write_kubeconfig(tmp_path / "kubeconfig"))
    try:
        assert Path(cfg.key_file).parent == private_tmpdir
    finally:
        for path in private_tmpdir.iterdir():
            path.unlink()
        registry = kube_config._temp_files
        for key, name in list(registry.items()):
            if Path(name).parent == private_tmpdir:
                del registry[key]


def test_an_unusable_kubeconfig_leaves_no_directory(tmp_path, private_tmpdir):
    bad = tmp_path / "kubeconfig"
    bad.write_text("{}")
    files = CredentialFiles(tmp_path / "credentials")
    with pytest.raises(BackendError, match="no usable Kubernetes configuration"):
        load_configuration(bad, files)
    assert files.path is None and list(files.root.iterdir()) == []


def test_directories_of_dead_processes_are_swept_and_living_ones_kept(tmp_path):
    root = tmp_path / "credentials"
    alive = CredentialFiles(root)
    alive.create()
    dead = root / "p-dead"  # its process died: the lock file is there, unlocked
    dead.mkdir()
    (dead / ".lock").touch()
    (dead / "tmpkey").write_text("SECRET-KEY-PEM")
    young = root / "p-young"  # being made right now: no lock file yet
    young.mkdir()
    old = root / "p-old"
    old.mkdir()
    os.utime(old, (0, 0))
    mine = CredentialFiles(root)
    path = mine.create()
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [alive.path.name, path.name, "p-young"]  # type: ignore[union-attr]
    )
    # A directory in use stays locked against anyone else.
    fd = os.open(path / ".lock", os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    mine.remove()
    mine.remove()  # idempotent
    alive.remove()
    assert [p.name for p in root.iterdir()] == ["p-young"]


def test_closing_a_backend_that_never_started_is_harmless(tmp_path):
    backend = KubernetesBackend(Settings(backend="kubernetes", state_dir=tmp_path))
    asyncio.run(backend.close(delete_sandboxes=False))
