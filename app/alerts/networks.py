"""Where a webhook may be sent: public addresses, and the private networks the operator allows.

A webhook's URL is typed by an organisation's admin, not the operator: without this
check the service would POST to whatever its own network reaches (a cloud's metadata
address, a database's port, an internal admin page) and show the answer's status in the
delivery log. A hostname is resolved when each try is made, and every address it
resolves to must be allowed; ALERT_WEBHOOK_NETWORKS names the private networks (CIDRs)
that are, for receivers inside the operator's own network. The try then connects to an
address that was checked, never to the name again: a name that resolves elsewhere
between the check and the connection (DNS rebinding) cannot lead it past the check.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from functools import lru_cache

from flask import current_app

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@lru_cache(maxsize=8)
def allowed_networks(setting: str) -> tuple[IPNetwork, ...]:
    """Parse ALERT_WEBHOOK_NETWORKS: comma-separated CIDRs. :raise ValueError."""
    return tuple(
        ipaddress.ip_network(part.strip(), strict=False)
        for part in setting.split(",")
        if part.strip()
    )


def is_allowed(address: IPAddress, networks: Iterable[IPNetwork]) -> bool:
    """Return whether a webhook may be sent to ``address``.

    An IPv6 address that only spells an IPv4 one (IPv4-mapped, IPv4-compatible, NAT64's
    well-known prefix) is judged as that IPv4 address. One that reaches an IPv4 host
    through a tunnel or a translator of its own (6to4, Teredo, a local-use NAT64 prefix)
    must be allowed itself, and so must every IPv4 address it may carry: otherwise
    ``[64:ff9b::a00:5]`` would reach 10.0.0.5 past the check.
    """
    if isinstance(address, ipaddress.IPv6Address):
        spelled = spelled_ipv4(address)
        if spelled is not None:
            return _allowed_as_is(spelled, networks)
        carried = carried_ipv4s(address)
        return _allowed_as_is(address, networks) and all(
            _allowed_as_is(inner, networks) for inner in carried
        )
    return _allowed_as_is(address, networks)


def _allowed_as_is(address: IPAddress, networks: Iterable[IPNetwork]) -> bool:
    if address.is_global and not address.is_multicast:
        return True
    return any(address in network for network in networks)


# IPv6 forms that stand for an IPv4 address (RFC 4291 2.5.5, RFC 6052 2.1); ``::`` and
# ``::1`` lie in the IPv4-compatible block but are IPv6's own unspecified and loopback.
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
_OWN_IPV6 = ipaddress.IPv6Network("::/127")
_NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")
# RFC 8215's local-use prefix: an operator's translator may use any RFC 6052 length in it.
_NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")
_LOCAL_USE_LENGTHS = (48, 56, 64)
_LOW_32 = 0xFFFFFFFF


def spelled_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """Return the IPv4 address ``address`` is another spelling of, if it is one."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64_WELL_KNOWN or (address in _IPV4_COMPATIBLE and address not in _OWN_IPV6):
        return ipaddress.IPv4Address(int(address) & _LOW_32)
    return None


def carried_ipv4s(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """Return the IPv4 addresses that packets to ``address`` may reach (6to4, Teredo, NAT64).

    Teredo's are its server and its client (the last 32 bits, inverted). A local-use
    NAT64 address is read at each prefix length it is well formed for, since the length
    is the operator's choice: every reading must be allowed.
    """
    if address.sixtofour is not None:
        return [address.sixtofour]
    if address.teredo is not None:
        return list(address.teredo)
    if address in _NAT64_LOCAL_USE:
        return _local_use_readings(int(address))
    return []


def _local_use_readings(value: int) -> list[ipaddress.IPv4Address]:
    """Read the IPv4 address at each RFC 6052 length of a local-use NAT64 address.

    Below /96 the address skips bits 64-71 (which must be zero), and what follows it
    must be zero: a reading that breaks either is not one a translator makes.
    """
    readings = [ipaddress.IPv4Address(value & _LOW_32)]
    if (value >> 56) & 0xFF:
        return readings
    joined = (value >> 64) << 56 | value & ((1 << 56) - 1)
    for length in _LOCAL_USE_LENGTHS:
        suffix_bits = 120 - length - 32
        if joined & ((1 << suffix_bits) - 1) == 0:
            readings.append(ipaddress.IPv4Address(joined >> suffix_bits & _LOW_32))
    return readings


class AddressRefused(Exception):
    """A webhook's host may not be sent to; the message says why."""


def checked_addresses(host: str, port: int) -> list[str]:
    """Resolve ``host`` once; return the addresses its webhook may connect to, in order.

    Every address the name resolves to must be allowed.
    :raise AddressRefused: the name does not resolve, or to an address not allowed.
    """
    networks = allowed_networks(current_app.config["ALERT_WEBHOOK_NETWORKS"])
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise AddressRefused(f"{host} does not resolve") from None
    addresses = list(dict.fromkeys(sockaddr[0] for *_, sockaddr in found))
    if not addresses:
        raise AddressRefused(f"{host} does not resolve")
    for text in addresses:
        address = ipaddress.ip_address(text.split("%")[0])
        if not is_allowed(address, networks):
            raise AddressRefused(
                f"{host} is a private address ({address}), not in ALERT_WEBHOOK_NETWORKS"
            )
    return addresses


def literal_refusal(host: str) -> str | None:
    """Return why ``host``, if it is an IP address, may not be sent a webhook; else None.

    Names are resolved only when a try is made: they may point elsewhere by then.
    """
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    networks = allowed_networks(current_app.config["ALERT_WEBHOOK_NETWORKS"])
    if is_allowed(address, networks):
        return None
    return f"{host} is a private address, not in ALERT_WEBHOOK_NETWORKS"
