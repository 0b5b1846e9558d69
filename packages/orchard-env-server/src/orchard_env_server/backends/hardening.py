"""What a container sandbox keeps of root's powers, shared by the Docker and Kubernetes backends.

Every capability is dropped and this set added back: Docker's default set less ``MKNOD``
(device nodes: a sandbox never needs to make one, and refusing it closes the classic
route to a host disk), ``NET_RAW`` (raw and packet sockets allow spoofing on the node's
bridge; ``ping`` still works through ICMP datagram sockets, which Docker opens to every
group by default) and ``AUDIT_WRITE`` (the host's audit log; only login daemons write it).
What stays is what a root shell in a dev container uses: changing owners and modes of its
own files, bypassing file permissions inside its own filesystem, switching users (``su``,
package scripts), signalling its own processes, binding low ports and ``chroot``.
"""

from __future__ import annotations

from typing import Any

# Bit numbers from linux/capability.h.
_CAPABILITY_BITS = {
    "CHOWN": 0,
    "DAC_OVERRIDE": 1,
    "FOWNER": 3,
    "FSETID": 4,
    "KILL": 5,
    "SETGID": 6,
    "SETUID": 7,
    "SETPCAP": 8,
    "NET_BIND_SERVICE": 10,
    "SYS_CHROOT": 18,
    "SETFCAP": 31,
}
SANDBOX_CAPABILITIES: tuple[str, ...] = tuple(sorted(_CAPABILITY_BITS))


def capability_mask(names: tuple[str, ...] = SANDBOX_CAPABILITIES) -> int:
    """The bitmask ``CapEff`` in ``/proc/<pid>/status`` shows for a root process keeping
    exactly ``names``."""
    return sum(1 << _CAPABILITY_BITS[name] for name in names)


def docker_confinement() -> dict[str, Any]:
    """The ``HostConfig`` fields that hold a container in: every capability dropped but
    ``SANDBOX_CAPABILITIES``, no privilege gained through setuid or file capabilities, the
    engine's default seccomp profile (no ``seccomp`` option replaces it), no privileged
    mode and no port of it published on the host. Host namespaces, devices and host paths
    are never asked for: the caller adds only its own mounts."""
    return {
        "CapDrop": ["ALL"],
        "CapAdd": list(SANDBOX_CAPABILITIES),
        "SecurityOpt": ["no-new-privileges"],
        "Privileged": False,
        "PublishAllPorts": False,
    }


def engine_seccomp_warning(security_options: list[str] | None) -> str | None:
    """What is wrong with the engine's seccomp (``SecurityOptions`` of ``GET /info``), if
    anything: containers get the engine's default profile, so an engine without seccomp,
    or one whose default is ``unconfined``, leaves every system call open to sandboxes."""
    for option in security_options or []:
        fields = dict(part.partition("=")[::2] for part in option.split(","))
        if fields.get("name") == "seccomp":
            if fields.get("profile") == "unconfined":
                return "the Docker engine's default seccomp profile is 'unconfined'"
            return None
    return "the Docker engine applies no seccomp profile (kernel or engine without seccomp)"
