"""Stored responses: found by their own account before they expire; chains read whole or not."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update

from app.database import utcnow
from app.extensions import db
from app.responses import store
from app.responses.errors import ConversationTooLong, PreviousResponseNotFound
from app.responses.models import StoredResponse
from app.responses.store import Chain, find_chain, find_stored, save_response
from app.sweeper import prune_stored_responses
from tests.factories import AccountFactory


def response_id(account_id: int, index: int) -> str:
    return f"resp_{account_id:08x}{index:032x}"


def save_chain(account_id: int, length: int, start: int = 0) -> Chain:
    """Store ``length`` chained responses, each with one input and one output item."""
    chain = Chain()
    for index in range(start, start + length):
        response = {"id": response_id(account_id, index), "output": [{"id": f"out{index}"}]}
        save_response(
            account_id=account_id,
            chain=chain,
            input_items=[{"id": f"in{index}"}],
            response=response,
            ttl_days=1,
        )
        chain = find_chain(account_id, response["id"])
    return chain


def test_a_chain_is_read_oldest_first_with_its_length_and_size(app_context):
    account = AccountFactory.create()

    chain = save_chain(account.id, 3)

    assert [item["id"] for item in chain.items] == ["in0", "out0", "in1", "out1", "in2", "out2"]
    assert chain.length == 3 and chain.response_id == response_id(account.id, 2)
    stored = db.session.scalars(
        select(StoredResponse).where(StoredResponse.account_id == account.id)
    )
    assert chain.size == sum(len(s.input_items) + len(s.response) for s in stored)


def test_another_accounts_or_an_expired_response_is_not_found(app_context):
    owner, stranger = AccountFactory.create(), AccountFactory.create()
    chain = save_chain(owner.id, 1)

    assert find_stored(stranger.id, chain.response_id) is None
    with pytest.raises(PreviousResponseNotFound):
        find_chain(stranger.id, chain.response_id)
    db.session.execute(
        update(StoredResponse)
        .where(StoredResponse.id == chain.response_id)
        .values(expires_at=utcnow() - timedelta(days=2))
    )
    db.session.commit()
    assert find_stored(owner.id, chain.response_id) is None


def test_a_chain_missing_an_earlier_response_is_not_continued(app_context):
    account = AccountFactory.create()
    chain = save_chain(account.id, 3)
    store.delete_response(account.id, response_id(account.id, 1))

    with pytest.raises(PreviousResponseNotFound) as refused:
        find_chain(account.id, chain.response_id)

    assert "deleted or expired" in refused.value.message
    assert find_chain(account.id, response_id(account.id, 0)).length == 1


def test_a_chain_at_its_bounds_is_refused(app_context, monkeypatch):
    account = AccountFactory.create()
    monkeypatch.setattr(store, "MAX_CHAIN_LENGTH", 3)
    chain = save_chain(account.id, 2)
    last = {"id": response_id(account.id, 9), "output": []}
    save_response(account_id=account.id, chain=chain, input_items=[], response=last, ttl_days=1)

    with pytest.raises(ConversationTooLong):
        find_chain(account.id, response_id(account.id, 9))
    monkeypatch.setattr(store, "MAX_CHAIN_BYTES", chain.size - 1)
    with pytest.raises(ConversationTooLong):
        find_chain(account.id, chain.response_id)


def test_the_sweeper_deletes_expired_responses_in_batches(app):
    with app.app_context():
        account_id = AccountFactory.create().id
        save_chain(account_id, 5)
        kept = save_chain(account_id, 1, start=10)
        db.session.execute(
            update(StoredResponse)
            .where(StoredResponse.account_id == account_id, StoredResponse.id != kept.response_id)
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )
        db.session.commit()

    assert prune_stored_responses(app, batch_size=2) >= 5

    with app.app_context():
        left = db.session.scalars(
            select(StoredResponse.id).where(StoredResponse.account_id == account_id)
        ).all()
        assert left == [kept.response_id]
