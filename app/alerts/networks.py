"""Where a webhook may be sent: public addresses, and the private networks the operator allows.

A webhook's URL is typed by an organisation's admin, not the operator: without this
check the service would POST to whatever its own network reaches (a cloud's metadata
address, a database's port, an internal admin page) and show the answer's status in the
delivery log. A hostname is resolved when each try is made, and every address it
resolves to must be allowed; ALERT_WEBHOOK_NETWORKS names the private networks (CIDRs)
that are, for receivers inside the operator's own network. The addresses are checked
before connecting, so a name that resolves anew between the check and the connection
(DNS rebinding) is not caught.
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


def refusal(host: str, port: int) -> str | None:
    """Return why ``host`` may not be sent a webhook (resolving it), or None if it may."""
    networks = allowed_networks(current_app.config["ALERT_WEBHOOK_NETWORKS"])
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return f"{host} does not resolve"
    for *_, sockaddr in found:
        address = ipaddress.ip_address(sockaddr[0].split("%")[0])
        if not is_allowed(address, networks):
            return f"{host} is a private address ({address}), not in ALERT_WEBHOOK_NETWORKS"
    return None


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
