"""Where the dashboard sends people: a ``next=`` taken from a request, and links it gives out.

A redirect target that comes from a request is followed only when it is a path on this
site. Browsers forgive a great deal in a URL (a tab or newline dropped, a backslash read
as a slash, ``%2F`` decoded by a proxy on the way), so the target is judged after every
layer of percent-encoding is taken off, and refused at the first doubt.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from flask import current_app, url_for

# Decoding layers looked through; a target still changing after them is refused.
_DECODE_ROUNDS = 4


def safe_next(raw: str | None, default: str) -> str:
    """Return ``raw`` if it is a path on this site, else ``default``."""
    return raw if raw is not None and is_local_path(raw) else default


def is_local_path(target: str) -> bool:
    """Whether ``target``, however it is percent-encoded, names a path on this site only.

    It must start with one ``/`` (not ``//``), and hold no backslash, no control
    character, no whitespace and nothing beyond ASCII (look-alikes of ``/`` and ``.``),
    in any of its decodings; and it must parse with no scheme and no host.
    """
    decoded = target
    for _ in range(_DECODE_ROUNDS):
        if not _plain_path(decoded):
            return False
        try:
            undone = unquote(decoded, errors="strict")
        except UnicodeDecodeError:
            return False
        if undone == decoded:
            return True
        decoded = undone
    return False


def _plain_path(text: str) -> bool:
    if not text.startswith("/") or text.startswith("//"):
        return False
    if any(not " " < char < "\x7f" or char == "\\" for char in text):
        return False
    parts = urlsplit(text)
    return not parts.scheme and not parts.netloc


def public_link(endpoint: str, **values: object) -> str:
    """Return the absolute URL of ``endpoint`` as its users reach the dashboard.

    Under PUBLIC_URL when it is set (a link mailed out must not follow the Host header
    of whoever asked for it); else under this request's own address.
    """
    base = current_app.config.get("PUBLIC_URL")
    if base:
        return base.rstrip("/") + url_for(endpoint, **values)
    return url_for(endpoint, _external=True, **values)
