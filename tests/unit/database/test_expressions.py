"""SQL expressions each database spells its own way give the same values on both."""

from __future__ import annotations

import pytest
from sqlalchemy import BigInteger, literal, null, select, type_coerce

from app.database import later_of
from app.extensions import db


@pytest.mark.parametrize(
    ("first", "second", "later"),
    [(3, 5, 5), (7, 5, 7), (None, 5, 5), (5, 5, 5)],
)
def test_later_of_two_values_counts_a_null_as_none(app_context, first, second, later):
    kept = null() if first is None else literal(first, BigInteger())
    value = type_coerce(kept, BigInteger())
    assert db.session.scalar(select(later_of(value, literal(second, BigInteger())))) == later
    db.session.commit()
