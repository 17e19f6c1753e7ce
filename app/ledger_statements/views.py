"""GET /v1/statements and /v1/statements/{period}: the caller's signed statements.

GET /.well-known/ledger-key serves the public key that signs them, without a key.
"""

from __future__ import annotations

from flask import Blueprint, Response, g

from app.auth.decorators import require_api_key
from app.database import utcnow
from app.encoding import dumps
from app.ledger_statements.periods import parse_period
from app.ledger_statements.signing import current_signing_key, key_id, public_pem
from app.ledger_statements.statement import organisation, signed_statement, statement_periods

bp = Blueprint("statements", __name__)
well_known = Blueprint("ledger_key", __name__)


def _json(body: object) -> Response:
    return Response(dumps(body), mimetype="application/json")


@bp.get("/statements")
@require_api_key
def list_statements() -> Response:
    """List the months the caller's organisation has statements for, newest first."""
    account = organisation(g.caller.account_id)
    return _json({"object": "list", "data": statement_periods(account, utcnow())})


@bp.get("/statements/<period>")
@require_api_key
def read_statement(period: str) -> Response:
    """Answer the organisation's signed statement of ``period`` (a month, or days)."""
    now = utcnow()
    account = organisation(g.caller.account_id)
    statement = signed_statement(account=account, period=parse_period(period, now=now), now=now)
    return _json(statement)


@well_known.get("/.well-known/ledger-key")
def ledger_key() -> Response:
    """Serve the statements' public key in PEM; its id in the ``Ledger-Key-Id`` header."""
    key = current_signing_key()
    return Response(
        public_pem(key), mimetype="application/x-pem-file", headers={"Ledger-Key-Id": key_id(key)}
    )
