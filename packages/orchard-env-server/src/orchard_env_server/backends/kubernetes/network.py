"""The sandbox namespace's own network policies, and the addresses they are made of.

Two NetworkPolicies per namespace, ensured by every orchestrator at start (create, or patch
to the current content) and left in place when it stops: replicas share them, and running
sandboxes outlive any orchestrator.

- ``orchard-sandbox-ingress`` selects every sandbox pod and admits, on the agent port
  only, the orchestrator: its namespace when it runs in a pod, its host's addresses when
  it runs outside the cluster. Nothing else, other sandboxes included. (Traffic from a
  pod's own node, the kubelet's probes for one, is always allowed by NetworkPolicy.)
- ``orchard-sandbox-egress`` selects the sandbox pods created with ``block_network:
  false`` (label ``orchard.dev/network: open``) and lets them reach anything but the
  cluster's API server (its Service IP and endpoint addresses) and the orchestrator.
  Sandboxes with ``block_network`` keep their own deny-all egress policy and are not
  selected here: policies add up, and this one would open them.

Both carry ``orchard.dev/namespace-policy`` and no ``orchard.dev/role``: they are not part
of any one sandbox, and nothing cleans them up with sandboxes.

NetworkPolicies are enforced only by a network plugin that implements them.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from pathlib import Path
from typing import Any

import attrs

from .spec import (
    AGENT_PORT,
    GROUP,
    LABEL_NETWORK,
    LABEL_ROLE,
    NETWORK_OPEN,
    ROLE_SANDBOX,
)

LABEL_NAMESPACE_POLICY = f"{GROUP}/namespace-policy"
INGRESS_POLICY = "orchard-sandbox-ingress"
EGRESS_POLICY = "orchard-sandbox-egress"
# The label 1.21+ gives every namespace, and the one infra/k8s gives the orchestrator's
# (for 1.20, which sets none).
NAMESPACE_NAME_LABELS = ("kubernetes.io/metadata.name", f"{GROUP}/namespace")


@attrs.frozen
class OrchestratorPlace:
    """Where the orchestrator's traffic to sandboxes comes from.

    ``namespace`` when it runs in a pod (its replicas' pod IPs change with every rollout,
    so they are selected by namespace); ``addresses`` of its host when it runs outside
    the cluster.
    """

    namespace: str | None = None
    addresses: tuple[str, ...] = ()


def _host_cidr(address: str) -> str:
    ip = ipaddress.ip_address(address)
    return f"{ip}/{ip.max_prefixlen}"


def _policy(name: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": name,
            "labels": {LABEL_NAMESPACE_POLICY: kind, "app.kubernetes.io/part-of": "orchard-env"},
        },
        "spec": spec,
    }


def ingress_policy_manifest(orchestrator: OrchestratorPlace) -> dict[str, Any]:
    """Sandbox pods admit the orchestrator on the agent port, and no one else."""
    peers: list[dict[str, Any]]
    if orchestrator.namespace is not None:
        peers = [
            {"namespaceSelector": {"matchLabels": {label: orchestrator.namespace}}}
            for label in NAMESPACE_NAME_LABELS
        ]
    else:
        peers = [{"ipBlock": {"cidr": _host_cidr(a)}} for a in orchestrator.addresses]
    # A rule without peers would admit everyone: with none to name, admit no one.
    rules = [{"from": peers, "ports": [{"protocol": "TCP", "port": AGENT_PORT}]}] if peers else []
    return _policy(
        INGRESS_POLICY,
        "ingress",
        {
            "podSelector": {"matchLabels": {LABEL_ROLE: ROLE_SANDBOX}},
            "policyTypes": ["Ingress"],
            "ingress": rules,
        },
    )


def egress_policy_manifest(
    orchestrator: OrchestratorPlace, api_server: list[str]
) -> dict[str, Any]:
    """Open sandboxes reach everything but the API server's and the orchestrator's
    addresses (and, in the cluster, no pod of the orchestrator's namespace)."""
    blocked = {ipaddress.ip_address(a) for a in (*api_server, *orchestrator.addresses)}
    to: list[dict[str, Any]] = []
    for everything, version in (("0.0.0.0/0", 4), ("::/0", 6)):
        block: dict[str, Any] = {"cidr": everything}
        excepted = sorted(ip for ip in blocked if ip.version == version)
        if excepted:
            block["except"] = [_host_cidr(str(ip)) for ip in excepted]
        to.append({"ipBlock": block})
    # Some plugins (Cilium) do not count pods as part of an ipBlock: name them too, or
    # cluster DNS and services would be out of reach.
    namespaces: dict[str, Any] = {}
    if orchestrator.namespace is not None:
        namespaces = {
            "matchExpressions": [
                {"key": label, "operator": "NotIn", "values": [orchestrator.namespace]}
                for label in NAMESPACE_NAME_LABELS
            ]
        }
    to.append({"namespaceSelector": namespaces, "podSelector": {}})
    return _policy(
        EGRESS_POLICY,
        "egress",
        {
            "podSelector": {"matchLabels": {LABEL_ROLE: ROLE_SANDBOX, LABEL_NETWORK: NETWORK_OPEN}},
            "policyTypes": ["Egress"],
            "egress": [{"to": to}],
        },
    )


def replace_patch(manifest: dict[str, Any]) -> dict[str, Any]:
    """A strategic merge patch that makes an existing policy ``manifest``: labels merged,
    the spec replaced whole (a merged selector would keep keys the new one dropped)."""
    return {
        "metadata": {"labels": manifest["metadata"]["labels"]},
        "spec": {"$patch": "replace", **manifest["spec"]},
    }


def api_server_addresses(
    service: dict[str, Any] | None, endpoints: dict[str, Any] | None, server_url: str
) -> list[str]:
    """The API server's addresses: the ``kubernetes`` Service's cluster IPs, its Endpoints'
    addresses, and the host of the URL the orchestrator uses when that is an IP address.
    Loopback addresses are left out: a pod's loopback is its own."""
    found: list[str] = []
    spec = (service or {}).get("spec") or {}
    found += spec.get("clusterIPs") or ([spec["clusterIP"]] if spec.get("clusterIP") else [])
    for subset in (endpoints or {}).get("subsets") or []:
        found += [a["ip"] for a in subset.get("addresses") or [] if a.get("ip")]
    host = urllib.parse.urlsplit(server_url).hostname
    if host:
        found.append(host)
    return _addresses(found)


def local_addresses(fib_trie: str, if_inet6: str) -> list[str]:
    """This host's own addresses, from ``/proc/net/fib_trie`` and ``/proc/net/if_inet6``:
    IPv4 ones the kernel marks ``host LOCAL``, global-scope IPv6 ones; no loopback."""
    found: list[str] = []
    last = ""
    for line in fib_trie.splitlines():
        text = line.strip()
        if text.startswith("|--"):
            last = text[3:].strip()
        elif text.startswith("/32 host LOCAL") and last:
            found.append(last)
    for line in if_inet6.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[3] == "00":  # scope global
            found.append(":".join(fields[0][i : i + 4] for i in range(0, 32, 4)))
    return _addresses(found)


def _addresses(candidates: list[str]) -> list[str]:
    """The IP addresses among ``candidates`` (not host names, not "None"), loopback left
    out, each once, in order."""
    addresses: list[str] = []
    for candidate in candidates:
        try:
            ip = ipaddress.ip_address(candidate)
        except ValueError:
            continue
        if not ip.is_loopback and str(ip) not in addresses:
            addresses.append(str(ip))
    return addresses


def host_addresses(proc_net: Path = Path("/proc/net")) -> tuple[str, ...]:
    """This host's addresses (``local_addresses`` of the running kernel's tables)."""
    texts = []
    for name in ("fib_trie", "if_inet6"):
        try:
            texts.append((proc_net / name).read_text())
        except OSError:
            texts.append("")  # a kernel without IPv6
    return tuple(local_addresses(*texts))
