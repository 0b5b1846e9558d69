"""Unit tests of orchard_env_server.backends.kubernetes.network: the namespace's policies."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes_units_support import ORCH, make_record

from orchard_env_server.backends.base import BackendError
from orchard_env_server.backends.kubernetes import api as kubernetes_api
from orchard_env_server.backends.kubernetes.api import KubeError, in_cluster_namespace
from orchard_env_server.backends.kubernetes.backend import KubernetesBackend
from orchard_env_server.backends.kubernetes.network import (
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
from orchard_env_server.backends.kubernetes.spec import LABEL_NETWORK, LABEL_ROLE, pod_manifest
from orchard_env_server.settings import KubernetesSettings, Settings

pytestmark = pytest.mark.fast


# --- the namespace's policies (kubernetes.network) ---------------------------------------


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
        Settings(
            backend="kubernetes",
            state_dir=tmp_path,
            kubernetes=KubernetesSettings(runtime_class="gvisor"),
        )
    )
    rejected = KubeError(
        403, '403 pods "orchard-x" is forbidden: pod rejected: RuntimeClass "gvisor" not found'
    )
    assert "runtime class 'gvisor' is not in the cluster" in str(backend._create_error(rejected))
    assert "may not create" in str(backend._create_error(KubeError(403, "403 forbidden")))
