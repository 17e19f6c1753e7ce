"""Sending e-mail through the SMTP server of SMTP_URL, with the standard library's smtplib.

``smtp://host:25`` sends in clear, ``smtp+starttls://host:587`` upgrades the connection
with STARTTLS, ``smtps://host:465`` speaks TLS from the start; a user and password in the
URL log in. One connection per message: mail is rare (invites, alerts).
"""

from __future__ import annotations

import smtplib
import ssl
from email.message import EmailMessage
from urllib.parse import unquote, urlsplit

from flask import current_app

SMTP_TIMEOUT_SECONDS = 10
_PORTS = {"smtp": 25, "smtp+starttls": 587, "smtps": 465}


class MailNotConfigured(RuntimeError):
    """SMTP_URL is not set: there is no server to send through."""


def mail_configured() -> bool:
    """Return whether SMTP_URL names a server to send through."""
    return bool(current_app.config.get("SMTP_URL"))


def send_mail(to: str, subject: str, body: str) -> None:
    """Send a plain-text message to ``to``.

    :raise MailNotConfigured: SMTP_URL is unset. :raise smtplib.SMTPException, OSError:
        the server refused or could not be reached.
    """
    url = current_app.config.get("SMTP_URL")
    if not url:
        raise MailNotConfigured("SMTP_URL is not set")
    message = EmailMessage()
    message["From"] = current_app.config["MAIL_FROM"]
    message["To"] = to
    message["Subject"] = subject
    message.set_content(body)
    with _connect(url) as server:
        server.send_message(message)


def _connect(url: str) -> smtplib.SMTP:
    parts = urlsplit(url)
    if parts.scheme not in _PORTS:
        raise ValueError(f"SMTP_URL must start with one of {', '.join(_PORTS)}")
    host, port = parts.hostname or "localhost", parts.port or _PORTS[parts.scheme]
    if parts.scheme == "smtps":
        server: smtplib.SMTP = smtplib.SMTP_SSL(
            host, port, timeout=SMTP_TIMEOUT_SECONDS, context=ssl.create_default_context()
        )
    else:
        server = smtplib.SMTP(host, port, timeout=SMTP_TIMEOUT_SECONDS)
    try:
        if parts.scheme == "smtp+starttls":
            server.starttls(context=ssl.create_default_context())
        if parts.username:
            server.login(unquote(parts.username), unquote(parts.password or ""))
    except BaseException:
        server.close()
        raise
    return server
