"""Password links and pending sign-ups are kept no longer than they can serve."""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import func, select, update

from app.accounts.links import issue_password_link, start_sign_up, token_digest
from app.accounts.models import PasswordLink, PendingSignUp
from app.accounts.passwords import register_account
from app.database import utcnow
from app.extensions import db
from app.sweeper import prune_password_links

PASSWORD = "a long enough password"


def new_email() -> str:
    return f"links-{uuid.uuid4().hex[:12]}@example.com"


def expire(model, tokens: list[str]) -> None:
    digests = [token_digest(token) for token in tokens]
    db.session.execute(
        update(model)
        .where(model.token_digest.in_(digests))
        .values(expires_at=utcnow() - timedelta(seconds=1))
    )
    db.session.commit()


def left(model, tokens: list[str]) -> int:
    digests = [token_digest(token) for token in tokens]
    return db.session.scalar(select(func.count()).where(model.token_digest.in_(digests)))


def test_the_sweeper_deletes_expired_links_and_sign_ups_in_batches(app):
    with app.app_context():
        email = new_email()
        register_account(email=email, password=PASSWORD)
        links = [issue_password_link(email, lifetime=timedelta(hours=1)) for _ in range(3)]
        sign_ups = [start_sign_up(new_email(), PASSWORD)[0] for _ in range(3)]
        expire(PasswordLink, links[:2])
        expire(PendingSignUp, sign_ups[:2])

    assert prune_password_links(app, batch_size=1) >= 4

    with app.app_context():
        assert left(PasswordLink, links[:2]) == left(PendingSignUp, sign_ups[:2]) == 0
        assert left(PasswordLink, links[2:]) == left(PendingSignUp, sign_ups[2:]) == 1
