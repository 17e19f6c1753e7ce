"""Webhooks go to public addresses, and to the private networks the operator allows."""

from __future__ import annotations

import ipaddress
import socket
from decimal import Decimal

import pytest

from app.alerts.delivery import deliver_alerts
from app.alerts.endpoints import (
    InvalidAlertSetting,
    add_webhook,
    delivery_log,
    set_balance_threshold,
)
from app.alerts.models import DELIVERED, PENDING
from app.alerts.networks import allowed_networks, is_allowed
from config.settings import ConfigurationError, settings_from_environment
from tests.alert_receiver import webhook_receiver
from tests.factories import AccountFactory


@pytest.fixture
def public_only(app_context, monkeypatch):
    """The default of a deployment: no private network allowed."""
    monkeypatch.setitem(app_context.config, "ALERT_WEBHOOK_NETWORKS", "")
    return app_context


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.9",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "::1",
        "fd00::1",
        "fe80::1",
        "::ffff:127.0.0.1",
        "224.0.0.1",
    ],
)
def test_private_addresses_are_refused_unless_allowed(address):
    assert not is_allowed(ipaddress.ip_address(address), ())
    allowed = allowed_networks("0.0.0.0/0, ::/0")
    assert is_allowed(ipaddress.ip_address(address), allowed) or address == "224.0.0.1"


def test_public_addresses_are_allowed():
    for address in ("93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946", "8.8.8.8"):
        assert is_allowed(ipaddress.ip_address(address), ())


def test_a_webhook_at_a_private_address_is_refused_when_added(public_only):
    account_id = AccountFactory.create().id
    for url in ("http://169.254.169.254/latest", "http://[::1]:8080/x", "http://10.0.0.5/"):
        with pytest.raises(InvalidAlertSetting, match="private address"):
            add_webhook(account_id, url)
    with pytest.raises(InvalidAlertSetting, match="port"):
        add_webhook(account_id, "http://hooks.example:99999/")


def test_a_name_resolving_to_a_private_address_is_not_sent_to(public_only):
    account = AccountFactory.create(credits=Decimal("10"))
    public_only.config["ALERT_WEBHOOK_NETWORKS"] = "127.0.0.0/8"
    with webhook_receiver() as receiver:
        # Added while allowed; by its first try the operator allows it no more.
        add_webhook(account.id, receiver.url.replace("127.0.0.1", "localhost"))
        public_only.config["ALERT_WEBHOOK_NETWORKS"] = ""
        set_balance_threshold(account.id, Decimal("100"))
        deliver_alerts()
    assert receiver.posts == 0
    [line] = delivery_log(account.id)
    assert line.delivery.status == PENDING and line.delivery.attempts == 1
    assert "localhost is a private address" in line.delivery.last_error


def test_the_setting_is_checked_when_read_from_the_environment():
    assert settings_from_environment({"ALERT_WEBHOOK_NETWORKS": "10.0.0.0/8, fd00::/8"}) == {
        "ALERT_WEBHOOK_NETWORKS": "10.0.0.0/8, fd00::/8"
    }
    with pytest.raises(ConfigurationError, match="ALERT_WEBHOOK_NETWORKS"):
        settings_from_environment({"ALERT_WEBHOOK_NETWORKS": "10.0.0.0/33"})


def test_a_name_that_resolves_elsewhere_after_its_check_is_not_followed(public_only, monkeypatch):
    """DNS rebinding: the name's first answer is allowed, its next points inside.

    The try connects to the address it checked (nothing listens there), never to the
    receiver at the address the name resolves to afterwards.
    """
    account = AccountFactory.create(credits=Decimal("10"))
    public_only.config["ALERT_WEBHOOK_NETWORKS"] = "127.0.0.2/32"
    resolve = socket.getaddrinfo
    answers: list[str] = []

    def rebinding(host, port, *args, **kwargs):
        if host != "rebinding.example":
            return resolve(host, port, *args, **kwargs)
        answers.append("127.0.0.2" if not answers else "127.0.0.1")
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (answers[-1], port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    with webhook_receiver() as receiver:
        add_webhook(account.id, receiver.url.replace("127.0.0.1", "rebinding.example"))
        set_balance_threshold(account.id, Decimal("100"))
        deliver_alerts()
    assert receiver.posts == 0
    [line] = delivery_log(account.id)
    assert line.delivery.status == PENDING and line.delivery.attempts == 1
    assert answers[0] == "127.0.0.2" and "refused" not in line.delivery.last_error


def test_a_names_addresses_are_tried_in_turn_until_one_answers(public_only, monkeypatch):
    """The first address takes no connection (an IPv6 address, on a host without IPv6)."""
    account = AccountFactory.create(credits=Decimal("10"))
    public_only.config["ALERT_WEBHOOK_NETWORKS"] = "127.0.0.0/8"
    resolve = socket.getaddrinfo

    def two_addresses(host, port, *args, **kwargs):
        if host != "two.example":
            return resolve(host, port, *args, **kwargs)
        return [
            (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))
            for address in ("127.0.0.2", "127.0.0.1")
        ]

    monkeypatch.setattr(socket, "getaddrinfo", two_addresses)
    with webhook_receiver() as receiver:
        url = receiver.url.replace("127.0.0.1", "two.example")
        _, receiver.secret = add_webhook(account.id, url)
        set_balance_threshold(account.id, Decimal("100"))
        deliver_alerts()
    assert receiver.posts == 1 and receiver.bad_signatures == 0
    [line] = delivery_log(account.id)
    assert line.delivery.status == DELIVERED


# Each IPv6 form that embeds an IPv4 address, spelled around a private one (10.0.0.5) and
# around a public one (8.8.8.8); Teredo's client is its last 32 bits inverted.
EMBEDDING = {
    "NAT64 well-known": ("64:ff9b::a00:5", "64:ff9b::808:808"),
    "IPv4-compatible": ("::a00:5", "::808:808"),
    "NAT64 local-use": ("64:ff9b:1::a00:5", "64:ff9b:1::808:808"),
    "IPv4-mapped": ("::ffff:a00:5", "::ffff:808:808"),
    "6to4": ("2002:a00:5::1", "2002:808:808::1"),
    "Teredo": ("2001:0:4136:e378:8000:63bf:f5ff:fffa", "2001:0:4136:e378:8000:63bf:f7f7:f7f7"),
}
# Teredo's own prefix is not global: an operator reaching such hosts allows it.
TEREDO = "2001::/32"


@pytest.mark.parametrize("form", EMBEDDING)
def test_an_ipv6_address_is_judged_by_the_ipv4_address_it_embeds(form):
    private, public = (ipaddress.ip_address(text) for text in EMBEDDING[form])
    networks = allowed_networks(TEREDO if form == "Teredo" else "")

    assert not is_allowed(private, networks)
    assert is_allowed(public, networks)
    # Allowing an internal network allows its embedded spellings; the IPv6 block alone
    # does not allow the private address inside it.
    assert is_allowed(private, allowed_networks(f"{TEREDO},10.0.0.0/8"))
    assert not is_allowed(private, allowed_networks(f"{TEREDO},{private}/128,64:ff9b::/32"))


@pytest.mark.parametrize("form", EMBEDDING)
def test_a_webhook_embedding_a_private_address_is_refused_when_added(public_only, form):
    private, public = EMBEDDING[form]
    account_id = AccountFactory.create().id
    public_only.config["ALERT_WEBHOOK_NETWORKS"] = TEREDO if form == "Teredo" else ""

    with pytest.raises(InvalidAlertSetting, match="private address"):
        add_webhook(account_id, f"http://[{private}]/hooks")
    endpoint, _ = add_webhook(account_id, f"http://[{public}]/hooks")
    assert endpoint.target == f"http://[{public}]/hooks"


@pytest.mark.parametrize("form", EMBEDDING)
def test_a_name_resolving_to_an_embedded_private_address_is_not_connected_to(
    public_only, monkeypatch, form
):
    account = AccountFactory.create(credits=Decimal("10"))
    private, _ = EMBEDDING[form]
    public_only.config["ALERT_WEBHOOK_NETWORKS"] = TEREDO if form == "Teredo" else ""
    resolve = socket.getaddrinfo

    def embedding(host, port, *args, **kwargs):
        if host != "nat64.example":
            return resolve(host, port, *args, **kwargs)
        return [(socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (private, port))]

    monkeypatch.setattr(socket, "getaddrinfo", embedding)
    add_webhook(account.id, "http://nat64.example/hooks")
    set_balance_threshold(account.id, Decimal("100"))
    deliver_alerts()

    [line] = delivery_log(account.id)
    assert line.delivery.status == PENDING and line.delivery.attempts == 1
    assert "nat64.example is a private address" in line.delivery.last_error
