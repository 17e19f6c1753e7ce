"""GET /v1/openapi.json: the OpenAPI 3.1 document of the public API, served without a key."""

from __future__ import annotations

import functools
from pathlib import Path

from flask import Blueprint, Response

DOCUMENT_PATH = Path(__file__).with_name("openapi.json")

bp = Blueprint("openapi", __name__)


@functools.cache
def openapi_document() -> bytes:
    """Return the document as tracked in the repository, read once per process."""
    return DOCUMENT_PATH.read_bytes()


@bp.get("/openapi.json")
def serve_openapi_document() -> Response:
    """Serve the OpenAPI document; clients and generators need no key to read it."""
    return Response(openapi_document(), mimetype="application/json")
