"""One page of a long listing: the rows, and whether there are pages before and after."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import Select

from app.extensions import db

Row = TypeVar("Row")
PER_PAGE = 50


@dataclass(frozen=True)
class Page(Generic[Row]):
    """Rows of page ``number`` (from 1) of a listing."""

    items: Sequence[Row]
    number: int
    has_previous: bool
    has_next: bool


def fetch_page(statement: Select[Any], number: int, per_page: int = PER_PAGE) -> Page[Any]:
    """Run ``statement`` (already ordered) for page ``number``: one row more tells of a next."""
    number = max(number, 1)
    rows = db.session.execute(statement.limit(per_page + 1).offset((number - 1) * per_page)).all()
    return Page(
        items=rows[:per_page],
        number=number,
        has_previous=number > 1,
        has_next=len(rows) > per_page,
    )
