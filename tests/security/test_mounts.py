"""The escape suite: the filesystem and the kernel's settings. Remounting what is
read-only, mounting anything new (cgroupfs for release_agent, proc, tmpfs), writing
/proc/sys and /sys (always the value the host already has), /proc/sysrq-trigger (only
opened, never written). See test_privileges.py for the suite and how to run it."""

from __future__ import annotations

from pathlib import Path

import pytest
from security.probing import removed_if_present, run_probe, succeeded, unique

pytestmark = [pytest.mark.integration, pytest.mark.security]

MOUNTINFO = """
def mounts():
    \"\"\"(mount point, per-mount options, fs type, superblock options) of each mount.\"\"\"
    found = []
    for line in open("/proc/self/mountinfo"):
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        point = fields[4].encode().decode("unicode_escape")
        found.append((point, fields[5].split(","), tail[0], tail[2].split(",")))
    return found

def mount_of(path):
    return max((m for m in mounts() if path == m[0] or path.startswith(m[0].rstrip("/") + "/")),
               key=lambda m: len(m[0]))
"""

# For each target: the bind remount (per-mount flags, this sandbox's mount namespace only),
# by mount(2) and by mount(8) when the image has it (``mount -o remount,bind,rw``), and the
# superblock remount (``mount -o remount,rw``) by mount(2) alone: mount(8) would take the
# options of the fstab it finds. The superblock one only for a disk's (or overlay's)
# filesystem that is read-write already, keeping its other flags (sync, mand, lazytime,
# i_version), so that even a success would change nothing for the host (never cgroupfs,
# proc, sysfs..., whose remount can reset host-wide options). Then create a file in it.
REMOUNT_PROBE = (
    MOUNTINFO
    + """
import shutil, subprocess
MS_REMOUNT, MS_BIND = 32, 4096
FLAGS = {"nosuid": 2, "nodev": 4, "noexec": 8, "sync": 16, "mand": 64, "noatime": 1024,
         "nodiratime": 2048, "relatime": 1 << 21, "i_version": 1 << 23, "iversion": 1 << 23,
         "strictatime": 1 << 24, "lazytime": 1 << 25}
DISKS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "overlay", "vfat"}
def flags(options):
    return sum(FLAGS.get(o, 0) for o in set(options))
def mount8(*options):
    done = subprocess.run(["mount", "-o", ",".join(options), target], capture_output=True,
                          text=True, timeout=20)
    return "ok" if done.returncode == 0 else done.stderr.strip()[-120:]
# Each target, the mount that holds it (/etc may be a directory of /) and every read-only one.
targets = []
for target in ARGS["targets"] + [m[0] for m in mounts() if "ro" in m[1]]:
    for path in (target, mount_of(target)[0]):
        if os.path.isdir(path) and path not in targets:
            targets.append(path)
before = {target: mount_of(target) for target in targets}
out["mount(8)"] = shutil.which("mount")
out["read_only"] = [t for t in targets if "ro" in before[t][1]]
out["attempts"], out["writes"] = {}, {}
for target in targets:
    point, options, fstype, super_options = before[target]
    tried = out["attempts"][target] = {}
    tried["bind"] = call(libc.mount, None, target.encode(), None,
                         MS_REMOUNT | MS_BIND | flags(options), None)
    if out["mount(8)"]:
        tried["mount(8) bind"] = mount8("remount", "bind", "rw")
    if "rw" in super_options and fstype in DISKS:
        tried["superblock"] = call(libc.mount, None, target.encode(), None,
                                   MS_REMOUNT | flags(options + super_options), None)
    path = os.path.join(target, ARGS["name"])
    out["writes"][target] = attempt(lambda: os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)))
    if out["writes"][target] == "ok":
        os.unlink(path)
"""
)


def test_a_sandbox_cannot_remount_a_host_filesystem_writable(blocked_sandbox):
    """``mount -o remount,rw /usr`` (and ``/``), ``mount -o remount,bind,rw /etc``, and every
    read-only mount the sandbox has; then the file the remount was for cannot be made."""
    name = unique()
    host_dirs = [Path("/"), Path("/usr"), Path("/etc")]
    try:
        result = run_probe(blocked_sandbox, REMOUNT_PROBE, targets=["/", "/usr", "/etc"], name=name)
        assert result["attempts"], result
        remounted = {
            target: succeeded(tried)
            for target, tried in result["attempts"].items()
            if succeeded(tried)
        }
        assert remounted == {}, remounted
        written = [t for t in result["read_only"] if result["writes"][t] == "ok"]
        assert written == [], f"wrote into read-only mounts {written}"
    finally:
        on_host = removed_if_present([d / name for d in host_dirs])
    assert on_host == [], f"a sandbox created files on the host: {on_host}"


NEW_MOUNT_PROBE = """
MNT_DETACH = 2
target = f"/tmp/{ARGS['name']}"
os.mkdir(target)
fstype, source, data = ARGS["mount"]
out["mount"] = call(libc.mount, source.encode(), target.encode(), fstype.encode(), 0,
                    data.encode() if data else None)
if out["mount"] == "ok":  # never use it (no release_agent is written): say what it was
    out["mount"] += ": " + ", ".join(sorted(os.listdir(target))[:8])
    libc.umount2(target.encode(), MNT_DETACH)
os.rmdir(target)
"""

NEW_MOUNTS = {
    "cgroup-v1-memory": ("cgroup", "cgroup", "memory"),  # the release_agent escape
    "cgroup2": ("cgroup2", "cgroup2", ""),
    "proc": ("proc", "proc", ""),
    "tmpfs": ("tmpfs", "tmpfs", "size=1m"),
    "sysfs": ("sysfs", "sysfs", ""),
}


@pytest.mark.parametrize("kind", list(NEW_MOUNTS))
def test_a_sandbox_cannot_mount_a_filesystem(blocked_sandbox, kind):
    result = run_probe(
        blocked_sandbox, NEW_MOUNT_PROBE, mount=NEW_MOUNTS[kind], name=unique("orchard-mnt")
    )
    assert not result["mount"].startswith("ok"), result


# Each value written is the one the host has (read by the test, on the host).
PROC_SYS_PROBE = """
for path, value in ARGS["values"].items():
    def write():
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)
    out[path] = attempt(write)
"""

GLOBAL_SYSCTLS = [
    "/proc/sys/kernel/core_pattern",  # a host program run as root on the next crash
    "/proc/sys/kernel/modprobe",  # the same, on the next unknown module request
    "/proc/sys/kernel/randomize_va_space",
    "/proc/sys/fs/suid_dumpable",
    "/proc/sys/vm/overcommit_memory",
]


def test_a_sandbox_cannot_write_kernel_settings_under_proc_sys(blocked_sandbox):
    values = {p: Path(p).read_text() for p in GLOBAL_SYSCTLS if Path(p).exists()}
    assert "/proc/sys/kernel/core_pattern" in values
    before = dict(values)
    result = run_probe(blocked_sandbox, PROC_SYS_PROBE, values=values)
    assert succeeded(result) == {}, result
    assert {p: Path(p).read_text() for p in values} == before


SYSRQ_PROBE = """
path = "/proc/sysrq-trigger"
out["exists"] = os.path.exists(path)
out["access"] = "ok" if os.access(path, os.W_OK) else "not writable"
# Opened for writing and closed at once: nothing is ever written to it.
out["open"] = attempt(lambda: os.close(os.open(path, os.O_WRONLY)))
"""


def test_a_sandbox_cannot_open_the_sysrq_trigger_for_writing(blocked_sandbox):
    result = run_probe(blocked_sandbox, SYSRQ_PROBE)
    assert result["open"] != "ok", result


# Candidates: the cgroup files of the probe's own cgroups (its own pid into cgroup.procs,
# its limits), release_agent and notify_on_release, a few kernel and block-device knobs.
# Each gets back exactly what it holds.
SYS_PROBE = """
import glob
me = str(os.getpid())
values = {}
def read(path):
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None
visited = 0
for root, dirs, files in os.walk("/sys/fs/cgroup"):
    visited += 1
    if visited > 3000 or root.count("/") > 12:
        dirs[:] = []
        continue
    if "cgroup.procs" in files and me in (read(os.path.join(root, "cgroup.procs")) or "").split():
        values[os.path.join(root, "cgroup.procs")] = me
        for knob in ("pids.max", "memory.max", "memory.limit_in_bytes", "cpu.max",
                     "cpu.cfs_quota_us", "memory.memsw.limit_in_bytes"):
            if knob in files:
                values[os.path.join(root, knob)] = read(os.path.join(root, knob))
    for knob in ("release_agent", "notify_on_release"):
        if knob in files:
            values[os.path.join(root, knob)] = read(os.path.join(root, knob))
for path in (["/sys/kernel/uevent_helper", "/sys/kernel/mm/ksm/run"]
             + sorted(glob.glob("/sys/block/*/queue/read_ahead_kb"))[:2]):
    values[path] = read(path)
out["sys_present"] = sorted(os.listdir("/sys"))[:20] if os.path.isdir("/sys") else []
out["writes"] = {}
for path, value in values.items():
    if value is None:
        continue
    def write():
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, (value if value.strip() else "\\n").encode())
        finally:
            os.close(fd)
    out["writes"][path] = attempt(write)
"""


def test_a_sandbox_cannot_write_under_sys(blocked_sandbox):
    result = run_probe(blocked_sandbox, SYS_PROBE, timeout=120)
    if result["sys_present"]:
        assert result["writes"], f"nothing under /sys was tried: {result}"
    assert succeeded(result["writes"]) == {}, result
