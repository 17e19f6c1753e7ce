"""One page of a long listing: the rows, and how to reach the pages before and after."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from sqlalchemy import Integer, Select, and_, bindparam, or_

from app.database.driver import driver_cursor, driver_form
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


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class Cursor:
    """A row's place in a listing ordered by time then id: where a keyset page starts."""

    moment: datetime
    id: str

    def __str__(self) -> str:
        """Render for a URL: microseconds since the epoch, then the id."""
        return f"{(self.moment - _EPOCH) // _MICROSECOND}_{self.id}"

    @classmethod
    def parse(cls, text: str | None) -> Cursor | None:
        """Return the cursor ``text`` renders, or None if it renders none."""
        micros, _, row_id = (text or "").partition("_")
        if not (micros.isascii() and micros.isdigit()) or not row_id or len(micros) > 18:
            return None
        return cls(_EPOCH + int(micros) * _MICROSECOND, row_id)


@dataclass(frozen=True)
class KeysetPage(Generic[Row]):
    """Rows of a listing newest first, and the cursors of the pages around them (None: none)."""

    items: Sequence[Row]
    newer: Cursor | None
    older: Cursor | None


# A listing's order: its time column and its id column, newest first.
Order = tuple[Any, Any]
Position = Callable[[Any], Cursor]


def _older_than(order: Order, cursor: Cursor) -> Any:
    # The time alone bounds the index scan; the id breaks ties between rows of one time.
    moment, row_id = order
    return and_(moment <= cursor.moment, or_(moment < cursor.moment, row_id < cursor.id))


def _newer_than(order: Order, cursor: Cursor) -> Any:
    moment, row_id = order
    return and_(moment >= cursor.moment, or_(moment > cursor.moment, row_id > cursor.id))


def fetch_keyset_page(
    statement: Select[Any],
    order: Order,
    position: Position,
    *,
    before: Cursor | None = None,
    after: Cursor | None = None,
    per_page: int = PER_PAGE,
) -> KeysetPage[Any]:
    """Return the rows just older than ``before``, just newer than ``after``, or the newest.

    No OFFSET: a page costs the same however deep in the listing it is. ``position``
    gives a row's cursor.
    """
    if after is not None:
        ascending = statement.where(_newer_than(order, after)).order_by(*order)
        rows = db.session.execute(ascending.limit(per_page + 1)).all()
        items = rows[:per_page][::-1]
        newer = position(items[0]) if len(rows) > per_page else None
        return KeysetPage(items, newer, position(items[-1]) if items else after)
    if before is not None:
        statement = statement.where(_older_than(order, before))
    descending = statement.order_by(*(column.desc() for column in order))
    rows = db.session.execute(descending.limit(per_page + 1)).all()
    items = rows[:per_page]
    newer = position(items[0]) if before is not None and items else None
    older = position(items[-1]) if len(rows) > per_page else None
    return KeysetPage(items, newer, older)


# A batch's cursor and size, bound by name: a listing's statements are built and compiled
# once, and each batch sends its values.
KEYSET_MOMENT, KEYSET_ID, KEYSET_SIZE = "keyset_moment", "keyset_id", "keyset_size"


@dataclass(frozen=True)
class KeysetBatches:
    """A listing read newest first in batches: its first batch's statement, and the next's.

    Both take the listing's own parameters and ``KEYSET_SIZE``; the next batch's also
    the last row seen, as ``KEYSET_MOMENT`` and ``KEYSET_ID``.
    """

    first: Select[Any]
    after: Select[Any]


def keyset_statements(statement: Select[Any], order: Order) -> KeysetBatches:
    """Return the statements that read ``statement``'s rows newest first, a batch each."""
    moment, row_id = order
    last_moment = bindparam(KEYSET_MOMENT, type_=moment.type)
    older = and_(
        moment <= last_moment,
        or_(moment < last_moment, row_id < bindparam(KEYSET_ID, type_=row_id.type)),
    )
    newest_first = [column.desc() for column in order]
    size = bindparam(KEYSET_SIZE, type_=Integer())
    return KeysetBatches(
        first=statement.order_by(*newest_first).limit(size),
        after=statement.where(older).order_by(*newest_first).limit(size),
    )


def keyset_batches(
    statements: KeysetBatches, parameters: dict[str, Any], position: Position, size: int
) -> Iterator[Sequence[Any]]:
    """Yield every row of ``statements``' listing, newest first, in lists of ``size`` rows.

    Each batch is a read of its own, ended before its rows are yielded: memory stays
    that of one batch however long the listing, and no read stays open while the rows
    are sent.
    """
    rows = _read_batch(statements.first, {**parameters, KEYSET_SIZE: size})
    while rows:
        yield rows
        if len(rows) < size:
            return
        last = position(rows[-1])
        after = {KEYSET_SIZE: size, KEYSET_MOMENT: last.moment, KEYSET_ID: last.id}
        rows = _read_batch(statements.after, {**parameters, **after})


def _read_batch(statement: Select[Any], parameters: dict[str, Any]) -> Sequence[Any]:
    """Run a read compiled once on the driver; return its rows as the driver reads them.

    A row is the driver's own tuple when no column needs SQLAlchemy's processing: a long
    listing is read without a Row built per row. A statement whose parameters the driver
    cannot take as compiled (an expanding IN) runs through SQLAlchemy.
    """
    connection = db.session.connection()
    form = driver_form(statement, connection.dialect, tuple(parameters))
    if form.slots is None:
        rows: Sequence[Any] = connection.execute(statement, parameters).all()
    else:
        cursor = driver_cursor(connection, form.text, form.arguments(parameters))
        if any(form.result_processors):
            rows = form.rows(cursor)
        else:
            rows = cursor.fetchall()
            cursor.close()
    db.session.commit()
    return rows
