"""The test cluster's NetworkPolicy enforcer (infra/test-cluster/netpol_enforcer.py).

Pure logic first: the rules compiled from pods, namespaces and policies are run through a
small evaluator of the iptables rules we generate (the matches and targets the compiler
uses, nothing more), packet by packet: pod -> pod (FORWARD on cni0), pod -> the host's own
addresses (INPUT), host -> pod (OUTPUT), outside -> pod (FORWARD from another interface).
Then the real cluster: pods with labels in two scratch namespaces, policies applied, and
connections tried from inside the pods (allowed ones connect, denied ones time out).
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchard_testing import BUSYBOX_IMAGE, CLUSTER_DIR, cluster_env, kubectl, only_backend

_PATH = Path(__file__).resolve().parents[1] / "infra" / "test-cluster" / "netpol_enforcer.py"
_spec = importlib.util.spec_from_file_location("netpol_enforcer", _PATH)
assert _spec and _spec.loader
npe = importlib.util.module_from_spec(_spec)
sys.modules["netpol_enforcer"] = npe
_spec.loader.exec_module(npe)

HOST = {"10.244.0.1", "10.250.0.1", "172.17.0.1", "192.0.2.2"}  # the node's own addresses


# ---- an evaluator of the generated rules -------------------------------------------------


def _chains(text: str) -> dict[str, list[list[str]]]:
    chains: dict[str, list[list[str]]] = {}
    for line in text.splitlines():
        if line.startswith(":"):
            chains[line[1:].split()[0]] = []
        elif line.startswith("-A "):
            tokens = shlex.split(line)
            chains[tokens[1]].append(tokens[2:])
    return chains


def _match_one(flag: str, value: str, packet: dict[str, Any]) -> bool:
    """Whether the packet passes one iptables match (unknown flags pass)."""
    if flag in ("-i", "-o"):
        return packet["in" if flag == "-i" else "out"] == value
    if flag in ("-s", "-d"):
        address = ipaddress.ip_address(packet["src" if flag == "-s" else "dst"])
        return address in ipaddress.ip_network(value)
    if flag == "-p":
        return packet["proto"] == value
    if flag == "--dport":
        low, _, high = value.partition(":")
        return int(low) <= packet["port"] <= int(high or low)
    if flag == "--ctstate":
        return packet["state"] in value.split(",")
    if flag == "--src-type":
        return value == "LOCAL" and packet["src"] in HOST
    if flag == "--mark":
        bits, mask = (int(v, 16) for v in value.split("/"))
        return packet["mark"] & mask == bits
    return True


def _matches(tokens: list[str], packet: dict[str, Any]) -> bool:
    for i in range(0, len(tokens), 2):
        flag, value = tokens[i], tokens[i + 1] if i + 1 < len(tokens) else ""
        if flag == "-j":
            return True
        if flag not in ("-m", "--comment") and not _match_one(flag, value, packet):
            return False
    return True


def _run(chains: dict[str, list[list[str]]], chain: str, packet: dict[str, Any]) -> bool:
    """False when the packet is dropped in ``chain`` (or a chain it jumps to)."""
    for tokens in chains[chain]:
        if not _matches(tokens, packet):
            continue
        target = tokens[tokens.index("-j") + 1]
        if target == "RETURN":
            return True
        if target == "DROP":
            return False
        if target == "MARK":
            bits, mask = (int(v, 16) for v in tokens[tokens.index("--set-xmark") + 1].split("/"))
            packet["mark"] = packet["mark"] & ~mask | bits
        elif not _run(chains, target, packet):
            return False
    return True


def allowed(
    ruleset,
    src: str,
    dst: str,
    port: int = 80,
    proto: str = "tcp",
    state: str = "NEW",
    source_iface: str = "eth0",
) -> bool:
    """Whether a packet from src to dst passes our chains, through the hook the kernel would
    take for it: pods are 10.244.0.0/24 on cni0, HOST are the node's own addresses."""
    pods = ipaddress.ip_network("10.244.0.0/24")

    def is_pod(address: str) -> bool:
        return ipaddress.ip_address(address) in pods and address not in HOST

    packet = {"src": src, "dst": dst, "port": port, "proto": proto, "state": state, "mark": 0}
    packet["in"] = "cni0" if is_pod(src) else (None if src in HOST else source_iface)
    if src in HOST:
        hook, packet["out"] = "OUTPUT", "cni0"
    elif dst in HOST:
        hook, packet["out"] = "INPUT", None
    else:
        hook, packet["out"] = "FORWARD", "cni0" if is_pod(dst) else "eth0"
    return _run(_chains(ruleset.text), npe.HOOKS[hook], packet)


# ---- objects -----------------------------------------------------------------------------


def pod(ns: str, name: str, ip: str | None, phase: str = "Running", **labels: str) -> dict:
    return {
        "metadata": {
            "namespace": ns,
            "name": name,
            "labels": labels,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {},
        "status": {"phase": phase, **({"podIP": ip} if ip else {})},
    }


def namespace(name: str, **labels: str) -> dict:
    return {"metadata": {"name": name, "labels": labels}}


def policy(ns: str, name: str, selector: dict, **spec: Any) -> dict:
    return {"metadata": {"namespace": ns, "name": name}, "spec": {"podSelector": selector, **spec}}


NAMESPACES = [namespace("a", team="a"), namespace("b", team="b"), namespace("c")]
PODS = [
    pod("a", "server", "10.244.0.10", role="server"),
    pod("a", "client", "10.244.0.11", role="client"),
    pod("a", "other", "10.244.0.12", role="other"),
    pod("b", "client", "10.244.0.21", role="client"),
    pod("c", "client", "10.244.0.31", role="client", tier="x"),
]
SERVER, A_CLIENT, A_OTHER, B_CLIENT, C_CLIENT = (p["status"]["podIP"] for p in PODS)
ROLE = lambda value: {"matchLabels": {"role": value}}  # noqa: E731


def compile_(*policies: dict, police_node_traffic: bool = False, pods: list | None = None):
    config = npe.Config(police_node_traffic=police_node_traffic)
    return npe.compile_rules(PODS if pods is None else pods, NAMESPACES, list(policies), config)


# ---- pure logic ----------------------------------------------------------------------------


@pytest.mark.fast
def test_selectors_match_labels_and_expressions():
    labels = {"role": "client", "tier": "x"}
    assert npe.selector_matches({}, labels) and npe.selector_matches(None, {})
    assert npe.selector_matches({"matchLabels": {"role": "client"}}, labels)
    assert not npe.selector_matches({"matchLabels": {"role": "client", "tier": "y"}}, labels)
    cases = [
        ({"key": "role", "operator": "In", "values": ["client", "server"]}, True),
        ({"key": "role", "operator": "In", "values": ["server"]}, False),
        ({"key": "missing", "operator": "In", "values": [""]}, False),
        ({"key": "role", "operator": "NotIn", "values": ["server"]}, True),
        ({"key": "role", "operator": "NotIn", "values": ["client"]}, False),
        ({"key": "missing", "operator": "NotIn", "values": ["x"]}, True),
        ({"key": "tier", "operator": "Exists"}, True),
        ({"key": "missing", "operator": "Exists"}, False),
        ({"key": "missing", "operator": "DoesNotExist"}, True),
        ({"key": "tier", "operator": "DoesNotExist"}, False),
        ({"key": "tier", "operator": "Gt", "values": ["1"]}, False),
    ]
    for expression, expected in cases:
        got = npe.selector_matches({"matchExpressions": [expression]}, labels)
        assert got is expected, expression
    both = {
        "matchLabels": {"role": "client"},
        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["y"]}],
    }
    assert not npe.selector_matches(both, labels)


@pytest.mark.fast
def test_policy_types_default_as_the_api_server_does():
    assert npe.policy_types({}) == ["Ingress"]
    assert npe.policy_types({"egress": []}) == ["Ingress"]
    assert npe.policy_types({"egress": [{}]}) == ["Ingress", "Egress"]
    assert npe.policy_types({"policyTypes": ["Egress"], "ingress": [{}]}) == ["Egress"]


@pytest.mark.fast
def test_live_pods_skip_ended_host_network_and_foreign_addresses_and_prefer_the_live_holder():
    old = pod("a", "old", "10.244.0.50", role="x")
    old["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    new = pod("a", "new", "10.244.0.50", role="y")
    host_net = pod("a", "hostnet", "10.244.0.51")
    host_net["spec"]["hostNetwork"] = True
    pods = [
        old,
        new,
        host_net,
        pod("a", "done", "10.244.0.52", phase="Succeeded"),
        pod("a", "failed", "10.244.0.53", phase="Failed"),
        pod("a", "pending", None),
        pod("a", "outside", "10.1.0.5"),
    ]
    live = npe.live_pods(pods, "10.244.0.0/24")
    assert [(p.name, p.ip) for p in live] == [("new", "10.244.0.50")]


@pytest.mark.fast
def test_no_policy_restricts_nothing():
    rules = compile_()
    for src, dst in [
        (A_CLIENT, SERVER),
        (SERVER, "10.250.0.1"),
        ("10.244.0.1", SERVER),
        (A_CLIENT, "8.8.8.8"),
        ("192.0.2.9", SERVER),
    ]:
        assert allowed(rules, src, dst), (src, dst)


@pytest.mark.fast
def test_an_ingress_policy_admits_only_its_rules_union_and_leaves_other_pods_open():
    only_clients = policy(
        "a",
        "clients",
        ROLE("server"),
        ingress=[
            {"from": [{"podSelector": ROLE("client")}], "ports": [{"protocol": "TCP", "port": 80}]}
        ],
    )
    rules = compile_(only_clients)
    assert allowed(rules, A_CLIENT, SERVER, 80)
    assert not allowed(rules, A_CLIENT, SERVER, 81)  # port
    assert not allowed(rules, A_CLIENT, SERVER, 80, proto="udp")  # protocol
    assert not allowed(rules, A_OTHER, SERVER, 80)  # label
    assert not allowed(rules, B_CLIENT, SERVER, 80)  # a podSelector alone: own namespace only
    assert allowed(rules, SERVER, A_OTHER, 81) and allowed(rules, B_CLIENT, A_OTHER)  # not selected
    assert allowed(rules, SERVER, "10.250.0.1", 6443)  # egress not isolated
    # replies always pass
    assert allowed(rules, A_OTHER, SERVER, 80, state="ESTABLISHED")
    # a second policy adds up: pods labelled client in namespaces labelled team=b, any port
    from_b = policy(
        "a",
        "from-b",
        ROLE("server"),
        ingress=[
            {
                "from": [
                    {
                        "namespaceSelector": {
                            "matchExpressions": [{"key": "team", "operator": "In", "values": ["b"]}]
                        },
                        "podSelector": ROLE("client"),
                    }
                ]
            }
        ],
    )
    rules = compile_(only_clients, from_b)
    assert allowed(rules, B_CLIENT, SERVER, 81) and allowed(rules, A_CLIENT, SERVER, 80)
    assert not allowed(rules, C_CLIENT, SERVER, 80)  # namespace c is not team=b
    assert not allowed(rules, A_OTHER, SERVER, 80)


@pytest.mark.fast
def test_namespace_selectors_alone_and_empty_ones():
    any_ns = policy("a", "p", ROLE("server"), ingress=[{"from": [{"namespaceSelector": {}}]}])
    rules = compile_(any_ns)
    assert allowed(rules, C_CLIENT, SERVER) and allowed(rules, A_OTHER, SERVER)
    assert not allowed(rules, "192.0.2.9", SERVER)  # not a pod: only ipBlocks name those
    no_team = policy(
        "a",
        "p",
        ROLE("server"),
        ingress=[
            {
                "from": [
                    {
                        "namespaceSelector": {
                            "matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]
                        }
                    }
                ]
            }
        ],
    )
    rules = compile_(no_team)
    assert allowed(rules, C_CLIENT, SERVER)
    assert not allowed(rules, B_CLIENT, SERVER) and not allowed(rules, A_CLIENT, SERVER)


@pytest.mark.fast
def test_empty_rule_lists_deny_and_an_empty_rule_allows_everything():
    deny_in = policy("a", "deny", {}, policyTypes=["Ingress"], ingress=[])
    rules = compile_(deny_in)
    assert not allowed(rules, A_CLIENT, SERVER) and not allowed(rules, B_CLIENT, A_OTHER)
    assert allowed(rules, SERVER, B_CLIENT)  # b is not isolated, a's egress is not
    allow_all = policy("a", "all", {}, ingress=[{}])
    rules = compile_(deny_in, allow_all)
    assert allowed(rules, B_CLIENT, SERVER, 12345, proto="udp")
    deny_out = policy("a", "deny-out", ROLE("client"), policyTypes=["Egress"], egress=[])
    rules = compile_(deny_out)
    for dst, port in [
        (SERVER, 80),
        ("10.244.0.1", 7000),
        ("10.250.0.1", 6443),
        ("172.17.0.1", 2375),
        ("192.0.2.2", 22),
        ("8.8.8.8", 53),
    ]:
        assert not allowed(rules, A_CLIENT, dst, port), dst
    assert allowed(rules, A_OTHER, "10.250.0.1", 6443)
    assert allowed(rules, "10.244.0.1", A_CLIENT, 7000)  # the node: the kubelet's probes
    assert allowed(rules, A_CLIENT, SERVER, 80, state="ESTABLISHED")


@pytest.mark.fast
def test_ip_blocks_with_excepts_and_ports():
    egress = policy(
        "a",
        "out",
        ROLE("client"),
        policyTypes=["Egress"],
        egress=[
            {"to": [{"ipBlock": {"cidr": "10.244.0.0/24", "except": [f"{SERVER}/32"]}}]},
            {
                "to": [{"ipBlock": {"cidr": "10.250.0.1/32"}}],
                "ports": [
                    {"protocol": "TCP", "port": 6443},
                    {"protocol": "UDP"},
                    {"protocol": "SCTP", "port": 9},
                ],
            },
            {"to": [{"ipBlock": {"cidr": "fd00::/8"}}]},  # IPv6: not a pod's business here
        ],
    )
    rules = compile_(egress)
    assert allowed(rules, A_CLIENT, A_OTHER, 80)  # a pod IP inside the block
    assert not allowed(rules, A_CLIENT, SERVER, 80)  # excepted
    assert allowed(rules, A_CLIENT, "10.244.0.1", 7000)  # the gateway is in the /24
    assert allowed(rules, A_CLIENT, "10.250.0.1", 6443)
    assert not allowed(rules, A_CLIENT, "10.250.0.1", 10250)
    assert allowed(rules, A_CLIENT, "10.250.0.1", 53, proto="udp")
    assert allowed(rules, A_CLIENT, "10.250.0.1", 9, proto="sctp")
    assert not allowed(rules, A_CLIENT, "10.250.0.1", 10, proto="sctp")
    assert not allowed(rules, A_CLIENT, "172.17.0.1", 80)
    ingress = policy(
        "a",
        "in",
        ROLE("server"),
        ingress=[{"from": [{"ipBlock": {"cidr": "192.0.2.0/24", "except": ["192.0.2.128/25"]}}]}],
    )
    rules = compile_(ingress)
    assert allowed(rules, "192.0.2.9", SERVER) and not allowed(rules, "192.0.2.200", SERVER)
    assert not allowed(rules, A_CLIENT, SERVER)


@pytest.mark.fast
def test_a_connection_needs_both_the_sources_egress_and_the_destinations_ingress():
    out = policy(
        "a",
        "out",
        ROLE("client"),
        egress=[{"to": [{"podSelector": ROLE("server")}]}],
        policyTypes=["Egress"],
    )
    into = policy("a", "in", ROLE("server"), ingress=[{"from": [{"podSelector": ROLE("other")}]}])
    rules = compile_(out, into)
    assert not allowed(rules, A_CLIENT, SERVER)  # egress yes, ingress no
    assert allowed(rules, A_OTHER, SERVER)
    assert not allowed(rules, A_CLIENT, A_OTHER)  # ingress open, egress no


@pytest.mark.fast
def test_traffic_from_the_node_passes_unless_node_traffic_is_policed():
    deny_in = policy("a", "deny", ROLE("server"), ingress=[])
    assert allowed(compile_(deny_in), "10.244.0.1", SERVER, 7000)
    assert allowed(compile_(deny_in), "10.250.0.1", SERVER, 7000)
    assert not allowed(compile_(deny_in), "192.0.2.9", SERVER, 7000)  # through eth0: not the node
    policed = compile_(deny_in, police_node_traffic=True)
    assert not allowed(policed, "10.244.0.1", SERVER, 7000)
    host_only = policy(
        "a",
        "host",
        ROLE("server"),
        ingress=[{"from": [{"ipBlock": {"cidr": "10.244.0.1/32"}}], "ports": [{"port": 7000}]}],
    )
    policed = compile_(host_only, police_node_traffic=True)
    assert allowed(policed, "10.244.0.1", SERVER, 7000)
    assert not allowed(policed, "10.250.0.1", SERVER, 7000)


@pytest.mark.fast
def test_named_ports_are_not_supported_and_allow_nothing():
    named = policy("a", "named", ROLE("server"), ingress=[{"ports": [{"port": "http"}]}])
    rules = compile_(named)
    assert not allowed(rules, A_CLIENT, SERVER, 80)
    assert any("named port 'http'" in w for w in rules.warnings)


@pytest.mark.fast
def test_the_orchestrators_own_policies_confine_sandboxes():
    """The namespace policies of backends/kubernetes/network.py and a blocked sandbox's
    deny-all, as the orchestrator on this host writes them."""
    from orchard_env_server.backends.kubernetes import network as kn
    from orchard_env_server.backends.kubernetes.spec import LABEL_NAME

    place = kn.OrchestratorPlace(addresses=tuple(sorted(HOST)))
    ns = "sbx"
    policies = [
        kn.ingress_policy_manifest(place),
        kn.egress_policy_manifest(place, ["10.96.0.1", "10.250.0.1"]),
    ]
    for p in policies:
        p["metadata"]["namespace"] = ns
    policies.append(
        policy(
            ns,
            "deny-blocked",
            {"matchLabels": {LABEL_NAME: "blocked"}},
            policyTypes=["Egress"],
            egress=[],
        )
    )
    sandbox = {"orchard.dev/role": "sandbox"}
    pods = [
        pod(ns, "open", "10.244.0.40", **sandbox, **{"orchard.dev/network": "open"}),
        pod(
            ns,
            "blocked",
            "10.244.0.41",
            **sandbox,
            **{"orchard.dev/network": "blocked", LABEL_NAME: "blocked"},
        ),
        pod("a", "client", A_CLIENT, role="client"),
    ]
    rules = compile_(*policies, pods=pods)
    opened, blocked = "10.244.0.40", "10.244.0.41"
    for address in sorted(HOST):
        assert not allowed(rules, blocked, address, 7000), address
        assert not allowed(rules, opened, address, 8000), address  # the orchestrator's host
    assert not allowed(rules, opened, "10.96.0.1", 443)
    assert allowed(rules, opened, "8.8.8.8", 443) and allowed(rules, opened, A_CLIENT, 80)
    assert not allowed(rules, blocked, "8.8.8.8", 443)
    assert not allowed(rules, opened, blocked, 7000) and not allowed(rules, blocked, opened, 7000)
    assert not allowed(rules, A_CLIENT, opened, 7000)
    assert allowed(rules, "10.244.0.1", blocked, 7000)  # the orchestrator and the kubelet


@pytest.mark.fast
def test_the_restore_text_replaces_our_chains_and_deletes_stale_ones():
    rules = compile_(policy("a", "deny", ROLE("server"), ingress=[]))
    stale = "ORCHARD-NETPOL-I-0000000000"
    text = npe.restore_text(rules, [*rules.chains, stale])
    assert text.startswith("*filter\n") and text.endswith(f"-X {stale}\nCOMMIT\n")
    assert f":{stale} - [0:0]" in text
    assert all(len(c) <= 28 for c in rules.chains)
    save = "*filter\n:INPUT ACCEPT [0:0]\n:ORCHARD-NETPOL-FWD - [0:0]\n:DOCKER - [0:0]\n"
    assert npe.installed_chains(save) == ["ORCHARD-NETPOL-FWD"]


# ---- the real cluster -------------------------------------------------------------------

SERVE = "trap 'exit 0' TERM; httpd -f -p 8080 & httpd -f -p 8081 & wait"


def _status() -> dict[str, Any]:
    return json.loads((CLUSTER_DIR / "run" / "netpol-enforcer.status.json").read_text())


def _apply(manifest: dict) -> None:
    subprocess.run(
        [
            f"{cluster_env()['K8S_BIN']}/kubectl",
            "--kubeconfig",
            cluster_env()["KUBECONFIG"],
            "apply",
            "-f",
            "-",
        ],
        input=json.dumps(manifest),
        text=True,
        check=True,
        capture_output=True,
        timeout=60,
    )


def _enforced(namespaces: list[str]) -> None:
    """Until the enforcer's last apply was made from the current version of every policy and
    every pod of ``namespaces`` (30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        wanted_policies, wanted_pods = {}, {}
        for ns in namespaces:
            listed = json.loads(kubectl("-n", ns, "get", "networkpolicies,pods", "-o", "json"))
            for item in listed["items"]:
                key = f"{ns}/{item['metadata']['name']}"
                if item["kind"] == "NetworkPolicy":
                    wanted_policies[key] = item["metadata"]["resourceVersion"]
                else:
                    wanted_pods[key] = item["status"].get("podIP")
        status = _status()
        ours = lambda seen: {k: v for k, v in seen.items() if k.split("/")[0] in namespaces}  # noqa: E731
        seen_policies, seen_pods = ours(status["policies"]), ours(status["pods"])
        if seen_policies == wanted_policies and seen_pods == wanted_pods:
            return
        assert time.monotonic() < deadline, (status, wanted_policies, wanted_pods)
        time.sleep(0.2)


def _connects(ns: str, name: str, ip: str, port: int) -> bool:
    """A TCP connection from the pod's container (nc, 2 s timeout)."""
    done = subprocess.run(
        [
            f"{cluster_env()['K8S_BIN']}/kubectl",
            "--kubeconfig",
            cluster_env()["KUBECONFIG"],
            "-n",
            ns,
            "exec",
            name,
            "--",
            "timeout",
            "5",
            "nc",
            "-w",
            "2",
            ip,
            str(port),
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
    )
    return done.returncode == 0


@pytest.fixture
def scratch() -> Iterator[tuple[str, str, dict[str, str]]]:
    """Namespaces a (team=a) and b (team=b), each with pods serving 8080 and 8081:
    a/server (role=server), a/client (role=client), a/other (role=other), b/client."""
    suffix = uuid.uuid4().hex[:8]
    a, b = f"netpol-a-{suffix}", f"netpol-b-{suffix}"
    try:
        for ns, team in ((a, "a"), (b, "b")):
            _apply(
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": ns, "labels": {"team": team}},
                }
            )
        for ns in (a, b):
            for _ in range(150):  # pods are refused until the default service account exists
                if kubectl(
                    "-n",
                    ns,
                    "get",
                    "serviceaccount",
                    "default",
                    "-o",
                    "jsonpath={.secrets[0].name}",
                    check=False,
                ):
                    break
                time.sleep(0.2)
        for ns, name, role in (
            (a, "server", "server"),
            (a, "client", "client"),
            (a, "other", "other"),
            (b, "client", "client"),
        ):
            _apply(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name, "namespace": ns, "labels": {"role": role}},
                    "spec": {
                        "automountServiceAccountToken": False,
                        "enableServiceLinks": False,
                        "dnsPolicy": "Default",
                        "terminationGracePeriodSeconds": 1,
                        "containers": [
                            {
                                "name": "c",
                                "image": BUSYBOX_IMAGE,
                                "imagePullPolicy": "Never",
                                "command": ["/bin/sh", "-c", SERVE],
                            }
                        ],
                    },
                }
            )
        for ns in (a, b):
            kubectl("-n", ns, "wait", "--for=condition=Ready", "pod", "--all", "--timeout=90s")
        ips = {}
        for ns in (a, b):
            for item in json.loads(kubectl("-n", ns, "get", "pods", "-o", "json"))["items"]:
                ips[f"{ns}/{item['metadata']['name']}"] = item["status"]["podIP"]
        yield a, b, ips
    finally:
        for ns in (a, b):
            kubectl("delete", "namespace", ns, "--wait=false", check=False)


@only_backend("kubernetes")
@pytest.mark.kubernetes
@pytest.mark.integration
def test_the_test_cluster_enforces_network_policies(backend, scratch):
    a, b, ips = scratch
    node = cluster_env()["NODE_IP"]
    server = ips[f"{a}/server"]
    _enforced([a, b])
    # no policy: everyone reaches everyone, and the host
    assert _connects(a, "client", server, 8080) and _connects(b, "client", server, 8081)
    assert _connects(a, "client", node, 6443)

    # ingress: only role=client pods of a, on 8080; then a second policy adds b's clients
    _apply(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "clients-8080", "namespace": a},
            "spec": {
                "podSelector": {"matchLabels": {"role": "server"}},
                "ingress": [
                    {
                        "from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                        "ports": [{"protocol": "TCP", "port": 8080}],
                    }
                ],
            },
        }
    )
    _enforced([a, b])
    assert _connects(a, "client", server, 8080)
    assert not _connects(a, "client", server, 8081)  # port
    assert not _connects(a, "other", server, 8080)  # label
    assert not _connects(b, "client", server, 8080)  # podSelector alone: a's pods only
    assert _connects(a, "server", ips[f"{a}/other"], 8081)  # other pods: unrestricted
    _apply(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "team-b-clients", "namespace": a},
            "spec": {
                "podSelector": {"matchLabels": {"role": "server"}},
                "ingress": [
                    {
                        "from": [
                            {
                                "namespaceSelector": {
                                    "matchExpressions": [
                                        {"key": "team", "operator": "In", "values": ["b"]}
                                    ]
                                },
                                "podSelector": {"matchLabels": {"role": "client"}},
                            }
                        ]
                    }
                ],
            },
        }
    )
    _enforced([a, b])
    assert _connects(b, "client", server, 8081)  # any port from b's clients
    assert not _connects(a, "other", server, 8080)

    # egress: a's client reaches only the pod network but the server, and the API server
    _apply(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "client-out", "namespace": a},
            "spec": {
                "podSelector": {"matchLabels": {"role": "client"}},
                "policyTypes": ["Egress"],
                "egress": [
                    {"to": [{"ipBlock": {"cidr": "10.244.0.0/24", "except": [f"{server}/32"]}}]},
                    {
                        "to": [{"ipBlock": {"cidr": f"{node}/32"}}],
                        "ports": [{"protocol": "TCP", "port": 6443}],
                    },
                ],
            },
        }
    )
    _enforced([a, b])
    assert not _connects(a, "client", server, 8080)  # the server admits it; its egress does not
    assert _connects(a, "client", ips[f"{a}/other"], 8080)
    assert _connects(a, "client", ips[f"{b}/client"], 8081)
    assert _connects(a, "client", node, 6443)
    assert not _connects(a, "client", node, 10250)  # the kubelet's port: not allowed
    assert _connects(b, "client", node, 10250)  # b's client is not isolated for egress

    # deleting the policies restores everything
    kubectl("-n", a, "delete", "networkpolicy", "--all")
    _enforced([a, b])
    assert _connects(a, "other", server, 8081) and _connects(a, "client", node, 10250)
