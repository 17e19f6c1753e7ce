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
    """Return whether a webhook may be sent to ``address``."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_global and not address.is_multicast:
        return True
    return any(address in network for network in networks)


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
