"""Which network addresses count as public: where a tenant's pull may connect."""

from __future__ import annotations

import ipaddress

_IP = ipaddress.IPv4Address | ipaddress.IPv6Address
# Not public, though ``ipaddress`` may call them global: IETF protocol assignments,
# NAT64 (its embedded IPv4 address is checked too) and local-use NAT64.
_NOT_PUBLIC = (
    ipaddress.ip_network("192.0.0.0/24"),
    ipaddress.ip_network("64:ff9b:1::/48"),
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def is_public_address(address: str | _IP) -> bool:
    """Whether ``address`` is a public unicast address. Loopback, private, link-local,
    multicast, unspecified, reserved and shared (100.64/10) addresses are not, nor an IPv6
    address embedding one of those (IPv4-mapped, 6to4, NAT64: those are judged by the
    IPv4 address they carry)."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address):
        ip = ip if ip.scope_id is None else ipaddress.IPv6Address(str(ip).split("%", 1)[0])
        if ip.ipv4_mapped is not None:  # the IPv4 address itself
            return is_public_address(ip.ipv4_mapped)
        if ip in _NAT64:  # DNS64 on an IPv6-only network: an IPv4 address through NAT64
            return is_public_address(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        if ip.sixtofour is not None and not is_public_address(ip.sixtofour):
            return False
    return (
        ip.is_global
        and not ip.is_private
        and not ip.is_loopback
        and not ip.is_link_local
        and not ip.is_multicast
        and not ip.is_unspecified
        and not ip.is_reserved
        and not any(ip in net for net in _NOT_PUBLIC if net.version == ip.version)
    )
