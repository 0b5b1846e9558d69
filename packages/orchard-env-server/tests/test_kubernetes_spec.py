"""Unit tests of orchard_env_server.backends.kubernetes.spec: names, labels, manifests, records."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes_units_support import ORCH, make_record

from orchard_env_server.backends.base import BackendError
from orchard_env_server.backends.docker.injection import AGENT_MOUNT, agent_entry
from orchard_env_server.backends.hardening import SANDBOX_CAPABILITIES
from orchard_env_server.backends.kubernetes.spec import (
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
from orchard_env_server.records import AgentEndpoint
from orchard_env_server.settings import KubernetesSettings, Settings

pytestmark = pytest.mark.fast

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
TOKEN = "tok-3f9c2b7e5d1a4c8e9b0f6a2d7c4e1b8a"


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
    settings = Settings(kubernetes=KubernetesSettings(runtime_class=runtime_class))
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
