"""Deliver alert events from the outbox: signed webhooks and e-mail, retried with backoff.

Runs in each worker's background greenlet (app.sweeper), never in a request's. Each
pass fans new events out into one delivery per endpoint of their organisation, then
tries the deliveries that are due. Every worker may run a pass at once: an event is
fanned out by the worker whose conditional UPDATE takes it, and a delivery is tried by
the worker whose conditional UPDATE pushes its next try out by DELIVERY_LEASE from the
moment of the try (so that another worker does not try it meanwhile). A failed try (not
2xx, a timeout, a refused connection or mail) is tried again after a delay that doubles
from RETRY_FIRST_DELAY up to RETRY_LONGEST_DELAY, for RETRY_FOR; after that the delivery
is marked failed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import unquote, urlsplit, urlunsplit

import gevent
import requests.certs
import urllib3
from cryptography.fernet import InvalidToken
from sqlalchemy import select, update
from urllib3.util import make_headers

from app.alerts.events import SIGNATURE_HEADER, event_body, event_text, signature
from app.alerts.models import (
    DELIVERED,
    EMAIL,
    FAILED,
    PENDING,
    WEBHOOK,
    AlertDelivery,
    AlertEndpoint,
    AlertEvent,
)
from app.alerts.networks import AddressRefused, checked_addresses
from app.alerts.secrets import unseal
from app.database import utcnow
from app.extensions import db
from app.mail import send_mail

log = logging.getLogger(__name__)

RETRY_FIRST_DELAY = timedelta(seconds=10)
RETRY_LONGEST_DELAY = timedelta(hours=1)
RETRY_FOR = timedelta(hours=24)
# Longer than a try can take (a webhook's deadline, or SMTP's timeouts), so no two overlap.
DELIVERY_LEASE = timedelta(minutes=2)
WEBHOOK_TIMEOUT = (3.05, 10)  # seconds to connect, and to wait for each read
# A receiver that trickles its answer resets the read timeout with each byte: a try ends
# after this many seconds in all, so that no receiver holds the worker's deliveries.
WEBHOOK_DEADLINE_SECONDS = 30
# A receiver's answer is read no further: its status is what counts.
RESPONSE_READ_CAP = 1024
BATCH = 50


class DeliveryFailed(Exception):
    """A try did not deliver: its HTTP status (if any) and why."""

    def __init__(self, reason: str, status: int | None = None) -> None:
        """Keep the reason (at most 200 characters) and the status."""
        super().__init__(reason)
        self.reason = reason[:200]
        self.status = status


def fan_out(now: datetime | None = None) -> int:
    """Make a delivery, due ``now``, per active endpoint of each new event; return how many."""
    now = now or utcnow()
    waiting = db.session.scalars(
        select(AlertEvent)
        .where(AlertEvent.fanned_out.is_(False))
        .order_by(AlertEvent.id)
        .limit(BATCH)
    ).all()
    taken = 0
    for event in waiting:
        claimed = db.session.execute(
            update(AlertEvent)
            .where(AlertEvent.id == event.id, AlertEvent.fanned_out.is_(False))
            .values(fanned_out=True)
        ).rowcount
        if claimed == 1:
            taken += 1
            for endpoint_id in _active_endpoints(event.account_id):
                db.session.add(
                    AlertDelivery(
                        event_id=event.id,
                        endpoint_id=endpoint_id,
                        status=PENDING,
                        next_attempt_at=now,
                        created_at=now,
                    )
                )
        db.session.commit()
    return taken


def _active_endpoints(account_id: int) -> list[int]:
    return list(
        db.session.scalars(
            select(AlertEndpoint.id).where(
                AlertEndpoint.account_id == account_id, AlertEndpoint.removed_at.is_(None)
            )
        )
    )


def deliver_due(now: datetime | None = None) -> int:
    """Try each delivery that is due (at ``now``, default the time); return how many delivered.

    A pass with slow receivers lasts minutes: each try's lease, signature time and
    delivery time are the moment it is made, so that a delivery taken late in the pass
    is not leased from its start (already expired: another worker would send it too).
    ``now`` fixes one moment for every try, to replay a schedule.
    """
    clock = utcnow if now is None else (lambda: now)
    due = db.session.execute(
        select(AlertDelivery.id, AlertDelivery.next_attempt_at)
        .where(AlertDelivery.status == PENDING, AlertDelivery.next_attempt_at <= clock())
        .order_by(AlertDelivery.next_attempt_at)
        .limit(BATCH)
    ).all()
    db.session.commit()
    return sum(_try_once(delivery_id, due_at, clock) for delivery_id, due_at in due)


def _try_once(delivery_id: int, due_at: datetime, clock: Callable[[], datetime]) -> bool:
    """Claim the delivery, try it, record the outcome; return whether it was delivered."""
    taken_at = clock()
    claimed = db.session.execute(
        update(AlertDelivery)
        .where(AlertDelivery.id == delivery_id, AlertDelivery.next_attempt_at == due_at)
        .values(next_attempt_at=taken_at + DELIVERY_LEASE)
    ).rowcount
    db.session.commit()
    if claimed != 1:
        return False
    delivery = db.session.get(AlertDelivery, delivery_id)
    event = db.session.get(AlertEvent, delivery.event_id)
    endpoint = db.session.get(AlertEndpoint, delivery.endpoint_id)
    try:
        status = _send(endpoint, event, taken_at)
    except DeliveryFailed as failure:
        _record_failure(delivery, failure, clock())
        return False
    delivery.attempts += 1
    delivery.status, delivery.last_status, delivery.last_error = DELIVERED, status, None
    delivery.delivered_at, delivery.next_attempt_at = clock(), None
    db.session.commit()
    return True


def _send(endpoint: AlertEndpoint, event: AlertEvent, now: datetime) -> int | None:
    """Deliver ``event`` to ``endpoint`` once; return the HTTP status (None for mail)."""
    if endpoint.removed_at is not None:
        raise DeliveryFailed("the endpoint was removed")
    if endpoint.kind == WEBHOOK:
        try:
            secret = unseal(endpoint.sealed_secret)
            userinfo = unseal(endpoint.sealed_userinfo) if endpoint.sealed_userinfo else None
        except InvalidToken as error:
            raise DeliveryFailed("the secret is unreadable: SECRET_KEY changed") from error
        return post_webhook(endpoint.target, secret, event, now, userinfo=userinfo)
    if endpoint.kind == EMAIL:
        subject, body = event_text(event)
        try:
            send_mail(endpoint.target, subject, body)
        except Exception as error:  # noqa: BLE001 - any failure of the mail is retried
            raise DeliveryFailed(f"mail: {type(error).__name__}: {error}") from error
        return None
    raise DeliveryFailed(f"unknown endpoint kind {endpoint.kind!r}")


def post_webhook(
    url: str, secret: str, event: AlertEvent, now: datetime, *, userinfo: str | None = None
) -> int:
    """POST the signed event to ``url``; return its 2xx status. :raise DeliveryFailed.

    The connection goes to an address checked (networks.checked_addresses), under the
    URL's name: its Host header, and for HTTPS the name its certificate must carry. The
    URL's ``user:password`` (kept sealed apart, ``userinfo``) goes as Basic auth.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    body = event_body(event)
    headers = {
        "Host": parts.netloc.rpartition("@")[2],
        "Content-Type": "application/json",
        SIGNATURE_HEADER: signature(secret, int(now.timestamp()), body),
    }
    if userinfo:
        user, _, password = userinfo.partition(":")
        headers.update(make_headers(basic_auth=f"{unquote(user)}:{unquote(password)}"))
    target = urlunsplit(("", "", parts.path or "/", parts.query, ""))
    post = _WebhookPost(parts.scheme, host, port, target, body, headers)
    try:
        with _within_deadline():
            status = post.to_first_answering(checked_addresses(host, port))
    except AddressRefused as refused:
        raise DeliveryFailed(f"refused: {refused}") from None
    except urllib3.exceptions.HTTPError as error:
        raise DeliveryFailed(f"{type(error).__name__}") from error
    if not 200 <= status < 300:
        raise DeliveryFailed(f"HTTP {status}", status)
    return status


@dataclass(frozen=True)
class _WebhookPost:
    """A webhook's POST: the name it is for, and what it sends."""

    scheme: str
    host: str
    port: int
    target: str
    body: bytes
    headers: dict[str, str]

    def to_first_answering(self, addresses: list[str]) -> int:
        """POST to the first of ``addresses`` that takes the connection; return the status.

        The addresses are tried in turn, as a client tries a name's: one the service
        cannot reach (an IPv6 address, on a host without IPv6) does not fail the try.
        """
        for address in addresses[:-1]:
            try:
                return self.to(address)
            except (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError):
                continue
        return self.to(addresses[-1])

    def to(self, address: str) -> int:
        """POST to ``address``; read the answer's start; return its status."""
        timeout = urllib3.Timeout(connect=WEBHOOK_TIMEOUT[0], read=WEBHOOK_TIMEOUT[1])
        if self.scheme == "https":
            pool: urllib3.HTTPConnectionPool = urllib3.HTTPSConnectionPool(
                address,
                self.port,
                timeout=timeout,
                retries=False,
                cert_reqs="CERT_REQUIRED",
                ca_certs=requests.certs.where(),
                server_hostname=self.host,
                assert_hostname=self.host,
            )
        else:
            pool = urllib3.HTTPConnectionPool(address, self.port, timeout=timeout, retries=False)
        with pool:
            response = pool.urlopen(
                "POST",
                self.target,
                body=self.body,
                headers=self.headers,
                redirect=False,
                preload_content=False,
            )
            try:
                response.read(RESPONSE_READ_CAP)
            finally:
                response.release_conn()
            return response.status


def _within_deadline() -> gevent.Timeout:
    """Return a timeout that ends a webhook's try after WEBHOOK_DEADLINE_SECONDS in all.

    The name's resolution is part of the try: a slow resolver counts against it too.

    Deliveries run in a gevent worker's greenlet (app.sweeper), whose sockets wait
    through gevent's hub: the timeout interrupts a wait. Elsewhere (a process whose
    sockets gevent has not patched) a wait does not yield, and only WEBHOOK_TIMEOUT's
    bounds on each read apply.
    """
    seconds = WEBHOOK_DEADLINE_SECONDS
    return gevent.Timeout(seconds, DeliveryFailed(f"no answer within {seconds} s"))


def _record_failure(delivery: AlertDelivery, failure: DeliveryFailed, now: datetime) -> None:
    """Note the failed try; schedule the next one, or give up after RETRY_FOR."""
    delivery.attempts += 1
    delivery.last_status, delivery.last_error = failure.status, failure.reason
    retry_at = now + retry_delay(delivery.attempts)
    if retry_at - delivery.created_at > RETRY_FOR:
        delivery.status, delivery.next_attempt_at = FAILED, None
    else:
        delivery.next_attempt_at = retry_at
    db.session.commit()
    log.warning(
        "alert delivery %d failed (try %d): %s", delivery.id, delivery.attempts, failure.reason
    )


def retry_delay(attempts: int) -> timedelta:
    """Return the wait after the ``attempts``-th failed try: doubling, at most an hour."""
    return min(RETRY_FIRST_DELAY * 2 ** min(attempts - 1, 20), RETRY_LONGEST_DELAY)


def deliver_alerts(now: datetime | None = None) -> int:
    """Fan out new events, then try the due deliveries; return how many were delivered."""
    fan_out(now)
    return deliver_due(now)
