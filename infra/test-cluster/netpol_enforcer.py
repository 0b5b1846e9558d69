"""NetworkPolicy enforcement for the test cluster of infra/test-cluster (not for production).

The cluster's CNI (plain ``bridge`` + ``host-local`` on cni0) enforces no NetworkPolicy.
This program does, for the subset of the API the project's policies and tests use, with
iptables in dedicated chains ``ORCHARD-NETPOL-*`` of the filter table:

- LIST+WATCH of pods, namespaces and networkpolicies (all namespaces), relisting on
  410 Gone or any error; the last rules stay in force while the API server is away;
- on every change (debounced) and every ``--resync`` seconds the whole rule set is
  computed from what was watched (``compile_rules``, pure) and written with
  ``iptables-restore --noflush``, which replaces our chains in one transaction; chains no
  longer needed are deleted in the same transaction; the jumps to our chains are kept
  first in FORWARD, INPUT and OUTPUT;
- after each apply, ``--status FILE`` (JSON: pid, syncs, the policies and pod IPs the rules
  were made from) is replaced atomically: ``up`` waits for the first one, tests wait for
  their policy's resourceVersion to appear there.

Semantics (networking.k8s.io/v1, as the API documents it):

- A pod is isolated for a direction when some policy of its namespace selects it (the
  policy's ``podSelector``) with that type in ``policyTypes`` (defaulted as the API server
  does: Ingress, plus Egress when ``egress`` has rules). An isolated pod allows only the
  union of the rules of the policies that select it; a pod no policy selects for a
  direction is unrestricted in it. A connection needs the source pod's egress and the
  destination pod's ingress to allow it.
- Peers: ``podSelector`` (pods of the policy's namespace), ``namespaceSelector`` (every
  pod of the matching namespaces), both (matching pods of matching namespaces), and
  ``ipBlock`` (``cidr`` minus ``except``). Selectors: ``matchLabels`` and
  ``matchExpressions`` with In, NotIn, Exists, DoesNotExist. An empty or missing
  ``from``/``to`` matches every peer; an empty or missing ``ports`` every port. ipBlocks
  match pod IPs too (as Calico does; the API leaves it to the plugin).
- Ports: ``protocol`` TCP (default), UDP or SCTP with a numeric ``port`` (and ``endPort``
  where the API server keeps it: 1.22+), or no port (every port of the protocol).
  **Named ports are not supported**: such an entry matches nothing (fail closed) and is
  logged.
- Replies (conntrack ESTABLISHED, RELATED) are always allowed; a connection already
  established when a policy arrives lives on (as with Calico and kube-router).
- Traffic from the node itself (a packet the host sends, with one of the host's addresses
  as source: the kubelet's probes, an orchestrator on the host) to a local pod is always
  allowed, like Calico (Felix does not police host -> workload) and kube-router
  (``--src-type LOCAL`` accepted in every pod chain), and as the Kubernetes documentation
  describes isolated pods; ``--police-node-traffic`` applies the pod's ingress policy to it
  instead, with the host's source address counting as an ipBlock address.
- Pods are known by ``status.podIP`` (IPv4, in ``--pod-cidr``); pods that ended
  (Succeeded/Failed) are ignored, their IPs may be reused. A pod whose IP has not yet
  reached the API server is not yet known: it is unrestricted until then (the kubelet
  reports the IP when the pod sandbox is up, before the pod can be Ready).

Where packets are checked (br_netfilter makes bridged pod-to-pod traffic pass FORWARD):
pod -> pod and pod -> elsewhere through another interface in FORWARD (``-i`` cni0: the
source pod's egress; ``-o`` cni0: the destination pod's ingress); pod -> the host's own
addresses (10.244.0.1, the node address 10.250.0.1, docker0, ...) in INPUT from cni0, the
source pod's egress (after the nat table's DNAT of 10.96.0.1:443, as with kube-proxy);
host -> pod in OUTPUT to cni0. Denied packets are dropped. Allowed ones go on through the
chains that follow (the cluster's own FORWARD rules still drop what they dropped before):
a policy only ever takes away. IPv6: the cluster's pods have IPv4 addresses only; IPv6 is
left as it was.

Run: ``uv run python infra/test-cluster/netpol_enforcer.py --kubeconfig K --status F``
(``up`` does). ``--once`` computes and applies once and exits; ``--print`` prints the
rules and applies nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import ipaddress
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "ORCHARD-NETPOL-"
CHAIN_FWD = PREFIX + "FWD"
CHAIN_IN = PREFIX + "IN"
CHAIN_OUT = PREFIX + "OUT"
# The builtin chain each dispatch chain is jumped to from (first rule).
HOOKS = {"FORWARD": CHAIN_FWD, "INPUT": CHAIN_IN, "OUTPUT": CHAIN_OUT}
# Our packet mark bit: "some rule allowed this packet". The kubelet uses 0x8000 and
# kube-proxy 0x4000; Docker none.
MARK = "0x200000"
PROTOCOLS = {"TCP": "tcp", "UDP": "udp", "SCTP": "sctp"}

log = logging.getLogger("netpol-enforcer")


# ---- what is watched -------------------------------------------------------------------


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    labels: Mapping[str, str]
    ip: str


@dataclass
class Config:
    bridge: str = "cni0"
    pod_cidr: str = "10.244.0.0/24"
    police_node_traffic: bool = False


@dataclass
class Ruleset:
    """What ``compile_rules`` made: the iptables-restore text (without the deletions of
    stale chains, which depend on what is installed), the chains it declares, and the
    warnings (unsupported fields) met on the way."""

    text: str
    chains: list[str]
    warnings: list[str] = field(default_factory=list)
    ingress_isolated: list[str] = field(default_factory=list)
    egress_isolated: list[str] = field(default_factory=list)


def live_pods(pods: Iterable[Mapping[str, Any]], pod_cidr: str) -> list[Pod]:
    """The pods traffic can come from or go to: with an IPv4 pod IP in ``pod_cidr``, not
    host-network, not ended. When two hold one IP (a deleted pod's reused), the one not
    being deleted, else the newer, wins."""
    network = ipaddress.ip_network(pod_cidr)
    by_ip: dict[str, tuple[tuple[bool, str], Pod]] = {}
    for obj in pods:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        ip = status.get("podIP")
        if not ip or spec.get("hostNetwork") or status.get("phase") in ("Succeeded", "Failed"):
            continue
        try:
            if ipaddress.ip_address(ip) not in network:
                continue
        except ValueError:
            continue
        rank = (meta.get("deletionTimestamp") is None, meta.get("creationTimestamp") or "")
        pod = Pod(meta.get("namespace", ""), meta.get("name", ""), meta.get("labels") or {}, ip)
        if ip not in by_ip or rank > by_ip[ip][0]:
            by_ip[ip] = (rank, pod)
    return sorted((p for _, p in by_ip.values()), key=lambda p: (p.namespace, p.name))


# ---- selectors and policies -------------------------------------------------------------


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector: every matchLabels pair and every matchExpression holds. An empty
    selector matches everything. An unknown operator matches nothing."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression.get("key"), expression.get("operator")
        values = expression.get("values") or []
        if operator == "In":
            ok = key in labels and labels[key] in values
        elif operator == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif operator == "Exists":
            ok = key in labels
        elif operator == "DoesNotExist":
            ok = key not in labels
        else:
            ok = False
        if not ok:
            return False
    return True


def policy_types(spec: Mapping[str, Any]) -> list[str]:
    """``policyTypes`` as given, else as the API server defaults it."""
    given = spec.get("policyTypes")
    if given:
        return list(given)
    return ["Ingress", *(["Egress"] if spec.get("egress") else [])]


@dataclass(frozen=True)
class Peers:
    """Who a rule's from/to names: ``everyone``, or these addresses and ipBlocks."""

    everyone: bool = False
    addresses: tuple[str, ...] = ()  # pod IPs (/32)
    blocks: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (cidr, excepts), IPv4 only


def rule_peers(
    peers: list[Mapping[str, Any]] | None,
    policy_namespace: str,
    pods: list[Pod],
    namespaces: Mapping[str, Mapping[str, str]],
    warnings: list[str],
    where: str,
) -> Peers:
    if not peers:
        return Peers(everyone=True)
    addresses: set[str] = set()
    blocks: list[tuple[str, tuple[str, ...]]] = []
    for peer in peers:
        block = peer.get("ipBlock")
        if block is not None:
            try:
                cidr = ipaddress.ip_network(block["cidr"], strict=False)
                excepts = [ipaddress.ip_network(e, strict=False) for e in block.get("except") or []]
            except (KeyError, ValueError) as exc:
                warnings.append(f"{where}: ipBlock {block} ignored: {exc}")
                continue
            if cidr.version == 4:
                blocks.append((str(cidr), tuple(str(e) for e in excepts if e.version == 4)))
            continue
        pod_selector = peer.get("podSelector")
        namespace_selector = peer.get("namespaceSelector")
        for pod in pods:
            if namespace_selector is None:
                if pod.namespace != policy_namespace:
                    continue
            elif not selector_matches(namespace_selector, namespaces.get(pod.namespace, {})):
                continue
            if pod_selector is not None and not selector_matches(pod_selector, pod.labels):
                continue
            addresses.add(pod.ip)
    return Peers(addresses=tuple(sorted(addresses, key=ipaddress.ip_address)), blocks=tuple(blocks))


def port_matches(
    ports: list[Mapping[str, Any]] | None, warnings: list[str], where: str
) -> list[str] | None:
    """iptables matches for a rule's ports; None for every port. An empty list when no
    entry can be enforced (named ports): the rule then allows nothing."""
    if not ports:
        return None
    matches = []
    for entry in ports:
        protocol = PROTOCOLS.get(str(entry.get("protocol") or "TCP").upper())
        port = entry.get("port")
        if protocol is None:
            warnings.append(f"{where}: protocol {entry.get('protocol')} not supported")
            continue
        if port is None:
            matches.append(f"-p {protocol}")
        elif isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
            end = entry.get("endPort")
            span = f"{int(port)}:{int(end)}" if end else str(int(port))
            matches.append(f"-p {protocol} -m {protocol} --dport {span}")
        else:
            warnings.append(f"{where}: named port {port!r} not supported: matches nothing")
    return matches


def _chain(kind: str, *parts: str) -> str:
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:10].upper()
    return f"{PREFIX}{kind}-{digest}"  # 15 + 1 + 1 + 10 = 27 characters: iptables allows 28


def _rule_chain(
    chains: dict[str, list[str]],
    key: tuple[str, str, str, str],
    peers: Peers,
    ports: list[str] | None,
    addr_flag: str,
    mark: str,
) -> str:
    """Add the chain of one policy rule (and its ipBlock-except sub-chains) to ``chains``;
    ``key`` is (namespace, policy, direction, rule index). Returns the chain's name."""
    chain = _chain("R", *key)
    body = chains.setdefault(chain, [])
    for port in [""] if ports is None else ports:
        port = f"{port} " if port else ""
        if peers.everyone:
            body.append(f"{port}{mark}")
            continue
        for address in peers.addresses:
            body.append(f"{addr_flag} {address}/32 {port}{mark}")
        for block_index, (cidr, excepts) in enumerate(peers.blocks):
            if not excepts:
                body.append(f"{addr_flag} {cidr} {port}{mark}")
                continue
            sub = _chain("B", *key, str(block_index))
            if sub not in chains:
                chains[sub] = [f"{addr_flag} {e} -j RETURN" for e in excepts]
                chains[sub].append(f"{addr_flag} {cidr} {mark}")
            body.append(f"{port}-j {sub}")
    return chain


def compile_rules(
    pods_raw: Iterable[Mapping[str, Any]],
    namespaces_raw: Iterable[Mapping[str, Any]],
    policies_raw: Iterable[Mapping[str, Any]],
    config: Config,
) -> Ruleset:
    """The whole rule set for iptables-restore --noflush (filter table)."""
    pods = live_pods(pods_raw, config.pod_cidr)
    namespaces = {
        (n.get("metadata") or {}).get("name", ""): (n.get("metadata") or {}).get("labels") or {}
        for n in namespaces_raw
    }
    policies = sorted(
        policies_raw,
        key=lambda p: (p["metadata"].get("namespace", ""), p["metadata"].get("name", "")),
    )
    warnings: list[str] = []
    chains: dict[str, list[str]] = {CHAIN_FWD: [], CHAIN_IN: [], CHAIN_OUT: []}
    # pod IP -> the rule chains of the policies that isolate it, per direction
    isolating: dict[str, dict[str, list[str]]] = {"Ingress": {}, "Egress": {}}
    mark = f"-j MARK --set-xmark {MARK}/{MARK}"

    for policy in policies:
        meta, spec = policy["metadata"], policy.get("spec") or {}
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        selected = [
            p
            for p in pods
            if p.namespace == ns and selector_matches(spec.get("podSelector"), p.labels)
        ]
        if not selected:
            continue  # its rules would be jumped to by no pod's chain
        for direction in policy_types(spec):
            if direction not in isolating:
                warnings.append(f"{ns}/{name}: policy type {direction} not supported")
                continue
            rules = spec.get("ingress" if direction == "Ingress" else "egress") or []
            peer_key, addr_flag = ("from", "-s") if direction == "Ingress" else ("to", "-d")
            rule_chains = []
            for index, rule in enumerate(rules):
                where = f"{ns}/{name} {direction.lower()}[{index}]"
                peers = rule_peers(rule.get(peer_key), ns, pods, namespaces, warnings, where)
                ports = port_matches(rule.get("ports"), warnings, where)
                key = (ns, name, direction, str(index))
                rule_chains.append(_rule_chain(chains, key, peers, ports, addr_flag, mark))
            for pod in selected:
                isolating[direction].setdefault(pod.ip, []).extend(rule_chains)

    bridge = config.bridge
    by_ip = {p.ip: p for p in pods}
    for direction, kind in (("Egress", "E"), ("Ingress", "I")):
        for ip, rule_chains in sorted(
            isolating[direction].items(), key=lambda item: ipaddress.ip_address(item[0])
        ):
            pod = by_ip[ip]
            chain = _chain(kind, pod.namespace, pod.name, ip)
            body = [f"-j MARK --set-xmark 0x0/{MARK}"]
            body += [f"-j {c}" for c in rule_chains]
            body += [f"-m mark --mark {MARK}/{MARK} -j RETURN", "-j DROP"]
            chains[chain] = body
            comment = f'-m comment --comment "{pod.namespace}/{pod.name} {direction.lower()}"'
            if direction == "Egress":
                chains[CHAIN_FWD].append(f"-i {bridge} -s {ip}/32 {comment} -j {chain}")
                chains[CHAIN_IN].append(f"-i {bridge} -s {ip}/32 {comment} -j {chain}")
            else:
                chains[CHAIN_FWD].append(f"-o {bridge} -d {ip}/32 {comment} -j {chain}")
                chains[CHAIN_OUT].append(f"-o {bridge} -d {ip}/32 {comment} -j {chain}")

    established = "-m conntrack --ctstate RELATED,ESTABLISHED -j RETURN"
    node = "-m addrtype --src-type LOCAL -j RETURN"
    chains[CHAIN_FWD].insert(0, established)
    chains[CHAIN_IN].insert(0, established)
    chains[CHAIN_OUT][:0] = [established] if config.police_node_traffic else [established, node]

    lines = ["*filter"]
    lines += [f":{name} - [0:0]" for name in chains]
    for name, body in chains.items():
        lines += [f"-A {name} {rule}" for rule in body]
    return Ruleset(
        text="\n".join(lines) + "\n",
        chains=list(chains),
        warnings=warnings,
        ingress_isolated=[f"{by_ip[ip].namespace}/{by_ip[ip].name}" for ip in isolating["Ingress"]],
        egress_isolated=[f"{by_ip[ip].namespace}/{by_ip[ip].name}" for ip in isolating["Egress"]],
    )


# ---- iptables ----------------------------------------------------------------------------


def installed_chains(save: str) -> list[str]:
    """Our chains in the output of ``iptables-save -t filter``."""
    return [line[1:].split()[0] for line in save.splitlines() if line.startswith(f":{PREFIX}")]


def restore_text(ruleset: Ruleset, installed: list[str]) -> str:
    """The transaction: our chains declared (so flushed) and filled, then the chains no
    longer wanted flushed (declared too) and deleted: nothing references them any more."""
    stale = [c for c in installed if c not in ruleset.chains]
    body = ruleset.text.removeprefix("*filter\n")
    head = "*filter\n" + "".join(f":{c} - [0:0]\n" for c in stale)
    return head + body + "".join(f"-X {c}\n" for c in stale) + "COMMIT\n"


def _run(argv: list[str], stdin: str | None = None) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def apply(ruleset: Ruleset) -> None:
    installed = installed_chains(_run(["iptables-save", "-t", "filter"]))
    _run(["iptables-restore", "--noflush"], restore_text(ruleset, installed))
    ensure_jumps()


def ensure_jumps() -> None:
    """Our jump first in FORWARD, INPUT and OUTPUT (moved back there when another program,
    dockerd at its start, put its own rules before it)."""
    for builtin, chain in HOOKS.items():
        rules = [r for r in _run(["iptables", "-S", builtin]).splitlines() if r.startswith("-A")]
        ours = f"-A {builtin} -j {chain}"
        if rules and rules[0] == ours and rules.count(ours) == 1:
            continue
        for _ in range(rules.count(ours)):
            _run(["iptables", "-D", builtin, "-j", chain])
        _run(["iptables", "-I", builtin, "1", "-j", chain])


# ---- watching --------------------------------------------------------------------------


class Store:
    """The last listed-and-watched objects of each kind; ``changed`` is set on any change."""

    def __init__(self, kinds: Iterable[str]) -> None:
        self.lock = threading.Lock()
        self.objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {k: {} for k in kinds}
        self.listed: set[str] = set()
        self.changed = threading.Event()

    def replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        with self.lock:
            self.objects[kind] = {_key(o): o for o in items}
            self.listed.add(kind)
        self.changed.set()

    def event(self, kind: str, kind_of_event: str, obj: dict[str, Any]) -> None:
        with self.lock:
            if kind_of_event == "DELETED":
                self.objects[kind].pop(_key(obj), None)
            else:
                self.objects[kind][_key(obj)] = obj
        self.changed.set()

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        with self.lock:
            return {k: list(v.values()) for k, v in self.objects.items()}


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")


def reflect(
    kind: str,
    list_call: Callable[..., Any],
    store: Store,
    stop: threading.Event,
) -> None:
    """LIST, then WATCH from the list's resourceVersion; on 410 Gone, an ERROR event or
    any failure, list again (after a capped backoff on failures). Bounded by ``stop``."""
    from kubernetes import watch  # type: ignore[import-untyped]
    from kubernetes.client.rest import ApiException  # type: ignore[import-untyped]

    backoff = 0.5
    while not stop.is_set():
        try:
            response = list_call(_preload_content=False, _request_timeout=30)
            listed = json.loads(response.data)
            store.replace(kind, listed.get("items") or [])
            version = listed["metadata"]["resourceVersion"]
            backoff = 0.5
            while not stop.is_set():
                w = watch.Watch()
                for event in w.stream(
                    list_call,
                    resource_version=version,
                    timeout_seconds=50,
                    allow_watch_bookmarks=True,
                    _request_timeout=60,
                ):
                    kind_of_event, obj = event["type"], event["raw_object"]
                    if kind_of_event == "ERROR":
                        raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                    version = obj["metadata"]["resourceVersion"]
                    if kind_of_event != "BOOKMARK":
                        store.event(kind, kind_of_event, obj)
                    if stop.is_set():
                        w.stop()
        except ApiException as exc:
            if exc.status == 410:
                log.info("%s: watch expired (410 Gone): listing again", kind)
                continue
            log.warning("%s: %s %s: listing again in %.1f s", kind, exc.status, exc.reason, backoff)
        except Exception as exc:  # connection refused while the API server restarts, ...
            log.warning("%s: %s: listing again in %.1f s", kind, exc, backoff)
        stop.wait(backoff)
        backoff = min(backoff * 2, 5.0)


# ---- the loop ----------------------------------------------------------------------------


def write_status(path: Path, status: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(status, indent=1, sort_keys=True))
    os.replace(tmp, path)


def status_of(
    snapshot: Mapping[str, list[dict[str, Any]]], ruleset: Ruleset, syncs: int, config: Config
) -> dict[str, Any]:
    cidr = config.pod_cidr
    return {
        "pid": os.getpid(),
        "syncs": syncs,
        "synced_at": time.time(),
        "policies": {
            "/".join(_key(p)): p["metadata"].get("resourceVersion")
            for p in snapshot["networkpolicies"]
        },
        "pods": {f"{p.namespace}/{p.name}": p.ip for p in live_pods(snapshot["pods"], cidr)},
        "ingress_isolated": ruleset.ingress_isolated,
        "egress_isolated": ruleset.egress_isolated,
        "warnings": ruleset.warnings,
    }


def run(args: argparse.Namespace) -> int:
    from kubernetes import client  # type: ignore[import-untyped]
    from kubernetes import config as kube_config

    kube_config.load_kube_config(config_file=args.kubeconfig)
    core, networking = client.CoreV1Api(), client.NetworkingV1Api()
    kinds = {
        "pods": core.list_pod_for_all_namespaces,
        "namespaces": core.list_namespace,
        "networkpolicies": networking.list_network_policy_for_all_namespaces,
    }
    config = Config(
        bridge=args.bridge, pod_cidr=args.pod_cidr, police_node_traffic=args.police_node_traffic
    )
    store = Store(kinds)
    stop = threading.Event()

    def stopping(*_: object) -> None:
        stop.set()
        store.changed.set()  # wakes the loop

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stopping)
    threads = [
        threading.Thread(target=reflect, args=(k, call, store, stop), name=k, daemon=True)
        for k, call in kinds.items()
    ]
    for t in threads:
        t.start()

    syncs, last_text, last_apply, warned = 0, "", 0.0, set[str]()
    status_path = Path(args.status) if args.status else None
    while not stop.is_set():
        store.changed.wait(timeout=args.resync)
        if stop.is_set():
            break
        time.sleep(0.05)  # debounce: a burst of events becomes one apply
        store.changed.clear()
        if store.listed != set(kinds):
            continue
        snapshot = store.snapshot()
        ruleset = compile_rules(
            snapshot["pods"], snapshot["namespaces"], snapshot["networkpolicies"], config
        )
        periodic = time.monotonic() - last_apply >= args.resync
        if ruleset.text == last_text and not periodic:
            continue
        for warning in ruleset.warnings:
            if warning not in warned:
                warned.add(warning)
                log.warning("%s", warning)
        try:
            started = time.monotonic()
            apply(ruleset)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            log.error("applying the rules failed (trying again): %s", exc)
            store.changed.set()
            stop.wait(1)
            continue
        syncs += 1
        last_apply = time.monotonic()
        if ruleset.text != last_text or syncs == 1:
            log.info(
                "sync %d: %d chains, %d pods isolated for ingress, %d for egress (%.0f ms)",
                syncs,
                len(ruleset.chains),
                len(ruleset.ingress_isolated),
                len(ruleset.egress_isolated),
                (last_apply - started) * 1000,
            )
        last_text = ruleset.text
        if status_path:
            write_status(status_path, status_of(snapshot, ruleset, syncs, config))
        if args.once:
            break
    log.info("stopping; the rules stay in force (infra/test-cluster/down removes them)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--status", help="a JSON file replaced after every apply")
    parser.add_argument("--bridge", default="cni0")
    parser.add_argument("--pod-cidr", default="10.244.0.0/24")
    parser.add_argument("--resync", type=float, default=15.0, help="seconds between full applies")
    parser.add_argument(
        "--police-node-traffic",
        action="store_true",
        help="apply pods' ingress policy to traffic from the node itself too",
    )
    parser.add_argument("--once", action="store_true", help="apply once and exit")
    parser.add_argument("--print", action="store_true", help="print the rules, apply nothing")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stdout,
        format="%(asctime)s %(levelname)s %(threadName)s: %(message)s",
    )
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # its retries: we log our own
    if args.print:
        from kubernetes import client
        from kubernetes import config as kube_config

        kube_config.load_kube_config(config_file=args.kubeconfig)
        core, networking = client.CoreV1Api(), client.NetworkingV1Api()
        raw = [
            json.loads(call(_preload_content=False).data)["items"]
            for call in (
                core.list_pod_for_all_namespaces,
                core.list_namespace,
                networking.list_network_policy_for_all_namespaces,
            )
        ]
        config = Config(args.bridge, args.pod_cidr, args.police_node_traffic)
        ruleset = compile_rules(*raw, config)
        sys.stdout.write(ruleset.text + "COMMIT\n")
        for warning in ruleset.warnings:
            print(f"# warning: {warning}")
        return 0
    with contextlib.suppress(KeyboardInterrupt):
        return run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
