"""A deleted key is unknown at once, but its row (and its history) stays."""

from __future__ import annotations

import pytest

from app.accounts.errors import KeyNotFound
from app.accounts.keys import create_key, delete_key, list_keys, rotate_key
from app.auth.keys import find_caller
from app.auth.models import DELETED, ApiKey
from app.extensions import db
from tests.factories import AccountFactory


def test_a_deleted_key_keeps_its_row_without_its_digest(app_context):
    account = AccountFactory.create()
    issued = create_key(account_id=account.id, name="gone")
    kept = create_key(account_id=account.id, name="kept")
    delete_key(issued.id)
    assert find_caller(issued.value) is None
    db.session.expire_all()
    row = db.session.get(ApiKey, issued.id)
    assert row.state == DELETED and row.name == "gone"
    assert len(row.digest) != 64 and row.display_prefix == issued.display_prefix
    assert [key.id for key in list_keys(account.id)] == [kept.id]
    for change in (delete_key, rotate_key):
        with pytest.raises(KeyNotFound):
            change(issued.id)
