"""The escape suite (issue 15): each test is an honest attempt, from inside a sandbox through
the SDK, at something a sandbox must not do; it must be refused on every backend. The suite
never harms the host it runs on: it rewrites only the values the host already has, uses
unique names, cleans up, and never writes to a device or to /proc/sysrq-trigger.

Run just the suite with ``uv run pytest tests/security`` or, from anywhere in the tree,
``uv run pytest -m security``; ``ORCHARD_TEST_BACKENDS=docker`` narrows it to one backend.

This module: privileges. What a sandbox's commands hold (capabilities, no_new_privs, a
seccomp filter) and the kernel interfaces those must keep them from.
"""

from __future__ import annotations

import os
import secrets
import stat
import time

import pytest
from security.probing import run_probe, succeeded, unique

from orchard_testing import only_backend

pytestmark = [pytest.mark.integration, pytest.mark.security]

# Capability bits (<linux/capability.h>) no sandbox may hold: each one alone is a way out.
DANGEROUS_CAPABILITIES = {
    "CAP_DAC_READ_SEARCH": 2,  # open_by_handle_at: any inode of a host filesystem
    "CAP_NET_ADMIN": 12,
    "CAP_SYS_MODULE": 16,
    "CAP_SYS_RAWIO": 17,
    "CAP_SYS_PTRACE": 19,
    "CAP_SYS_ADMIN": 21,
    "CAP_SYS_BOOT": 22,
    "CAP_SYS_TIME": 25,
    "CAP_MAC_ADMIN": 33,
    "CAP_PERFMON": 38,
    "CAP_BPF": 39,
}

STATUS_PROBE = """
def status(pid):
    fields = {}
    for line in open(f"/proc/{pid}/status"):
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields

out["self"] = status("self")
out["all"] = {}
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            out["all"][pid] = status(pid)
        except OSError:
            pass
"""


def _dangerous(mask: str) -> list[str]:
    value = int(mask, 16)
    return [name for name, bit in DANGEROUS_CAPABILITIES.items() if value >> bit & 1]


@pytest.fixture(scope="module")
def statuses(blocked_sandbox):
    """/proc/<pid>/status of the probe itself and of every process the sandbox can see."""
    return run_probe(blocked_sandbox, STATUS_PROBE)


def test_a_sandboxs_commands_hold_no_dangerous_capability(statuses):
    own = statuses["self"]
    held = {kind: _dangerous(own[kind]) for kind in ("CapEff", "CapPrm", "CapAmb")}
    assert held == {"CapEff": [], "CapPrm": [], "CapAmb": []}, own


def test_no_process_in_a_sandbox_holds_a_dangerous_capability(statuses):
    assert len(statuses["all"]) >= 2, "the probe saw neither itself nor the sandbox's init"
    held = {
        f"{pid} {fields['Name']}": _dangerous(fields["CapPrm"])
        for pid, fields in statuses["all"].items()
        if _dangerous(fields["CapPrm"])
    }
    assert held == {}


def test_a_sandboxs_commands_cannot_gain_privileges(statuses):
    assert statuses["self"]["NoNewPrivs"] == "1"


def test_a_sandboxs_commands_run_under_a_seccomp_filter(statuses):
    assert statuses["self"]["Seccomp"] == "2", "2 is SECCOMP_MODE_FILTER"


# Each call is safe even when it is let through: a bogus module image the loader rejects,
# reboot(2) with a wrong magic number (the capability check comes first, then the magic),
# a map or a counter or a key of the probing process only, a handle opened read-only.
KERNEL_INTERFACE_PROBE = """
NR = {
    "x86_64": {"bpf": 321, "perf_event_open": 298, "add_key": 248, "keyctl": 250,
               "init_module": 175, "finit_module": 313, "open_by_handle_at": 304,
               "name_to_handle_at": 303, "reboot": 169},
    "aarch64": {"bpf": 280, "perf_event_open": 241, "add_key": 217, "keyctl": 219,
                "init_module": 105, "finit_module": 273, "open_by_handle_at": 265,
                "name_to_handle_at": 264, "reboot": 142},
}[os.uname().machine]
what = ARGS["call"]

def sys_call(name, *args):
    args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(NR[name]), *args)
    if result >= 0:
        return "ok", result
    return errname(ctypes.get_errno()), result

if what == "bpf":  # BPF_MAP_CREATE of a one-entry array
    attr = ctypes.create_string_buffer(128)
    ctypes.memmove(attr, (2).to_bytes(4, "little") + (4).to_bytes(4, "little")
                   + (4).to_bytes(4, "little") + (1).to_bytes(4, "little"), 16)
    outcome, fd = sys_call("bpf", 0, attr, 128)
elif what == "perf_event_open":  # a disabled software task-clock counter on itself
    attr = ctypes.create_string_buffer(128)
    ctypes.memmove(attr, (1).to_bytes(4, "little") + (128).to_bytes(4, "little")
                   + (1).to_bytes(8, "little"), 16)
    ctypes.memmove(ctypes.byref(attr, 40), (1 | 1 << 5 | 1 << 6).to_bytes(8, "little"), 8)
    outcome, fd = sys_call("perf_event_open", attr, 0, -1, -1, 0)
elif what == "add_key":  # a user key in this process's own keyring
    outcome, fd = sys_call("add_key", b"user", ARGS["name"].encode(), b"x", 1, -2)
    fd = -1
elif what == "keyctl":  # KEYCTL_GET_KEYRING_ID of the session keyring
    outcome, fd = sys_call("keyctl", 0, -3, 0)
    fd = -1
elif what == "init_module":  # 64 zero bytes: no ELF, the loader would refuse them
    image = ctypes.create_string_buffer(64)
    outcome, fd = sys_call("init_module", image, 64, b"")
    fd = -1
elif what == "finit_module":  # the same zero bytes, from a file
    path = "/tmp/" + ARGS["name"]
    with open(path, "wb") as fh:
        fh.write(bytes(64))
    module = os.open(path, os.O_RDONLY)
    os.unlink(path)
    outcome, fd = sys_call("finit_module", module, b"", 0)
    os.close(module)
    fd = -1
elif what == "open_by_handle_at":  # the handle of / (or a made-up one), opened read-only
    handle = ctypes.create_string_buffer(8 + 128)
    ctypes.memmove(handle, (128).to_bytes(4, "little"), 4)
    mount_id = ctypes.c_int()
    named, _ = sys_call("name_to_handle_at", -100, b"/", handle, ctypes.byref(mount_id), 0)
    if named != "ok":
        ctypes.memmove(handle, (8).to_bytes(4, "little") + (1).to_bytes(4, "little"), 8)
    out["name_to_handle_at"] = named
    root = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    outcome, fd = sys_call("open_by_handle_at", root, handle, os.O_RDONLY)
    os.close(root)
elif what == "reboot":  # wrong magic: EINVAL when the call is let through, never a reboot
    outcome, fd = sys_call("reboot", 0, 0, 0, 0)
    fd = -1
if outcome == "ok" and fd > 2:
    os.close(fd)
out["outcome"] = outcome
"""

# Let through, these calls fail with the error their bogus arguments earn (EINVAL,
# ENOEXEC, ESTALE...); refused, with EPERM (a seccomp filter's answer, or a missing
# capability's), EACCES or ENOSYS.
REFUSALS = {"EPERM", "EACCES", "ENOSYS"}


@pytest.mark.parametrize(
    "call",
    [
        "bpf",
        "perf_event_open",
        "add_key",
        "keyctl",
        "init_module",
        "finit_module",
        "open_by_handle_at",
        "reboot",
    ],
)
def test_a_sandbox_cannot_reach_the_kernels_privileged_interfaces(blocked_sandbox, call):
    result = run_probe(blocked_sandbox, KERNEL_INTERFACE_PROBE, call=call, name=unique())
    assert result["outcome"] in REFUSALS, result


NAMESPACE_PROBE = """
import signal
flag = ARGS["flag"]

def in_child(action):
    \"\"\"Run action() in a forked child (a namespace made stays there) and return its result.\"\"\"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write, action().encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as fh:
        return fh.read()

def by_clone():
    ctypes.set_errno(0)
    clone = {"x86_64": 56, "aarch64": 220}[os.uname().machine]
    child = libc.syscall(ctypes.c_long(clone), ctypes.c_ulong(flag | signal.SIGCHLD),
                         None, None, None, None)
    if child == 0:
        os._exit(0)
    if child < 0:
        return errname(ctypes.get_errno())
    os.waitpid(child, 0)
    return "ok"

out["unshare"] = in_child(lambda: call(libc.unshare, flag))
out["clone"] = in_child(by_clone)
"""

NAMESPACES = {
    "user": 0x10000000,
    "mount": 0x00020000,
    "network": 0x40000000,
    "pid": 0x20000000,
    "uts": 0x04000000,
    "ipc": 0x08000000,
    "cgroup": 0x02000000,
}


@pytest.mark.parametrize("namespace", list(NAMESPACES))
def test_a_sandbox_cannot_create_namespaces(blocked_sandbox, namespace):
    """``unshare -U -r``, ``unshare -m`` and friends, as unshare(2) and as clone(2)."""
    result = run_probe(blocked_sandbox, NAMESPACE_PROBE, flag=NAMESPACES[namespace])
    assert succeeded(result) == {}, result


MKNOD_PROBE = """
import stat
made = {}
for kind, (mode, major, minor) in ARGS["nodes"].items():
    path = f"/tmp/{ARGS['name']}-{kind}"
    made[kind] = attempt(os.mknod, path, 0o600 | mode, os.makedev(major, minor))
    if made[kind] == "ok":  # say whether the node would open (read-only, nothing read)
        opened = attempt(lambda: os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK)))
        made[kind] += f" (opens read-only: {opened})"
        os.unlink(path)
fifo = f"/tmp/{ARGS['name']}-fifo"
out["fifo"] = attempt(os.mkfifo, fifo, 0o600)
if out["fifo"] == "ok":
    out["fifo"] = "ok" if stat.S_ISFIFO(os.stat(fifo).st_mode) else "not a fifo"
    os.unlink(fifo)
out["devices"] = made
"""


def test_a_sandbox_cannot_make_device_nodes_but_can_make_fifos(blocked_sandbox):
    nodes = {"block-sda": (stat.S_IFBLK, 8, 0), "char-mem": (stat.S_IFCHR, 1, 1)}
    root = os.stat("/").st_dev
    if os.major(root):  # the host's root disk: the node a sandbox would most want
        nodes["block-host-root"] = (stat.S_IFBLK, os.major(root), os.minor(root))
    result = run_probe(blocked_sandbox, MKNOD_PROBE, nodes=nodes, name=unique("orchard-node"))
    assert result["fifo"] == "ok", "mkfifo must still work: the refusal is of devices only"
    made = {kind: outcome for kind, outcome in result["devices"].items() if outcome[:2] == "ok"}
    assert made == {}, result["devices"]


def _host_process(argv: list[str], timeout: float = 30) -> int:
    """The host pid of the one process whose command line is ``argv``."""
    wanted = "\0".join(argv) + "\0"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline") as fh:
                    if fh.read() == wanted:
                        return int(pid)
            except OSError:
                continue
        time.sleep(0.1)
    raise AssertionError(f"no host process {argv}")


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as fh:
        items = fh.read().decode(errors="replace").split("\0")
    return dict(item.partition("=")[::2] for item in items if item)


@only_backend("local")
@pytest.mark.parametrize("start", ["spawner", "one-shot"])
def test_the_command_env_never_reaches_the_host_side_helper(backend, client, image, start):
    """orchard-enter runs as host root until it is inside the sandbox: a request's or an
    image's ``LD_PRELOAD``/``GLIBC_TUNABLES`` in its own environment would run code as
    host root through its loader or libc. The sandbox's spawner gets no environment at
    all (each command's comes in its request); a one-shot start (a request too big for
    the spawner, 256 KiB) gets it prefixed. The command gets it plain."""
    marker = str(7_000_000 + secrets.randbelow(1_000_000))
    env = {"LD_PRELOAD": "/nonexistent.so", "GLIBC_TUNABLES": "glibc.malloc.check=3"}
    if start == "one-shot":
        env |= {f"PAD{i}": "x" * 100_000 for i in range(3)}
    with client.create_sandbox(image) as sandbox:
        job = sandbox.start(f"exec sleep {marker}", env=env)
        try:
            command = _host_process(["sleep", marker])
            with open(f"/proc/{command}/status") as fh:
                helper = int(next(x for x in fh if x.startswith("PPid:")).split()[1])
            helper_env, command_env = _environ(helper), _environ(command)
        finally:
            job.cancel()
    assert all(name.startswith("ORCHARD_ENTER_ENV_") for name in helper_env)
    if start == "spawner":
        assert helper_env == {}
    else:
        assert helper_env["ORCHARD_ENTER_ENV_LD_PRELOAD"] == "/nonexistent.so"
    assert command_env["LD_PRELOAD"] == "/nonexistent.so"
    assert command_env["GLIBC_TUNABLES"] == "glibc.malloc.check=3"
    assert not any(name.startswith("ORCHARD_ENTER_ENV_") for name in command_env)
