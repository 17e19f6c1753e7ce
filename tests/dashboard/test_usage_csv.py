"""The CSV export's bytes, pinned: its columns, each value's spelling, its order and quoting."""

from __future__ import annotations

import csv
import io
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from sqlalchemy import insert

from app.accounts.keys import create_key, delete_key
from app.dashboard import usage
from app.extensions import db
from app.generations.models import Generation
from app.money import usd_text

HEADER = (
    "time,id,model,api,key,prompt_tokens,cached_tokens,completion_tokens,reasoning_tokens,"
    "cost_usd,latency_ms,status,streamed,estimated\r\n"
)
# Newest first by (time, id): the two at 05:06:07.123456 tie on time and go by id.
ROWS = (
    "2026-03-05T00:00:00.000000+00:00,gen-e,dev-chat,chat,,0,0,0,0,12,0,failed,false,false\r\n",
    "2026-03-04T05:06:07.123456+00:00,gen-b,'=cmd|x,chat,'=sum,1,2,3,4,"
    "1.2345678901,250,completed,true,false\r\n",
    '2026-03-04T05:06:07.123456+00:00,gen-a,"\'-x,y",responses,"say ""hi"", twice",'
    "10,0,20,0,0.0000000001,7,completed,false,true\r\n",
    "2026-03-04T05:06:00.000000+00:00,gen-c,dev-chat-mini,messages,old (deleted),"
    "5,0,6,0,0,99,cancelled,true,true\r\n",
    "2026-03-01T23:59:59.999999+00:00,gen-d,dev-chat,chat,'=sum,0,0,0,0,"
    "0.5,1,interrupted,false,false\r\n",
)


def at(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


@pytest.fixture
def exported(app, holder_client):
    """Five generations whose every column has an edge to it, under keys named like them.

    Their ids are ``gen-a`` to ``gen-e`` after a prefix of this test's own.
    """
    client, account_id, _ = holder_client
    prefix = uuid.uuid4().hex
    with app.app_context():
        formula = create_key(account_id=account_id, name="=sum").id
        quoted = create_key(account_id=account_id, name='say "hi", twice').id
        old = create_key(account_id=account_id, name="old").id
        delete_key(old)
        rows = [
            ("gen-a", quoted, "-x,y", "responses", (10, 0, 20, 0), "0.0000000001", 7,
             "completed", False, True, at(2026, 3, 4, 5, 6, 7, 123456)),
            ("gen-b", formula, "=cmd|x", "chat", (1, 2, 3, 4), "1.2345678901", 250,
             "completed", True, False, at(2026, 3, 4, 5, 6, 7, 123456)),
            ("gen-c", old, "dev-chat-mini", "messages", (5, 0, 6, 0), "0", 99,
             "cancelled", True, True, at(2026, 3, 4, 5, 6)),
            ("gen-d", formula, "dev-chat", "chat", (0, 0, 0, 0), "0.5", 1,
             "interrupted", False, False, at(2026, 3, 1, 23, 59, 59, 999999)),
            ("gen-e", None, "dev-chat", "chat", (0, 0, 0, 0), "12", 0,
             "failed", False, False, at(2026, 3, 5)),
        ]  # fmt: skip
        db.session.execute(
            insert(Generation),
            [
                {
                    "id": prefix + generation_id,
                    "account_id": account_id,
                    "api_key_id": key_id,
                    "model": model,
                    "api": api,
                    "prompt_tokens": tokens[0],
                    "cached_tokens": tokens[1],
                    "completion_tokens": tokens[2],
                    "reasoning_tokens": tokens[3],
                    "cost": Decimal(cost),
                    "latency_ms": latency,
                    "status": status,
                    "streamed": streamed,
                    "estimated": estimated,
                    "created_at": moment,
                }
                for (generation_id, key_id, model, api, tokens, cost, latency, status,
                     streamed, estimated, moment) in rows
            ],
        )  # fmt: skip
        db.session.commit()
    return client, formula, prefix


def expected(prefix: str, *rows: str) -> str:
    return HEADER + "".join(row.replace(",gen-", f",{prefix}gen-", 1) for row in rows)


@pytest.mark.parametrize("batch", [1000, 2, 1])
def test_the_csv_spells_every_column_exactly_in_any_batch_size(exported, monkeypatch, batch):
    client, _, prefix = exported
    monkeypatch.setattr(usage, "CSV_BATCH", batch)

    response = client.get("/usage.csv")

    assert response.status_code == 200
    assert response.mimetype == "text/csv"
    assert response.get_data(as_text=True) == expected(prefix, *ROWS)


def test_a_filtered_csv_keeps_the_rows_it_names_byte_for_byte(exported, monkeypatch):
    client, formula, prefix = exported
    monkeypatch.setattr(usage, "CSV_BATCH", 1)

    by_key = client.get(f"/usage.csv?key={formula}").get_data(as_text=True)
    by_model_and_dates = client.get("/usage.csv?model=dev-chat&from=2026-03-01&to=2026-03-04")

    assert by_key == expected(prefix, ROWS[1], ROWS[4])
    assert by_model_and_dates.get_data(as_text=True) == expected(prefix, ROWS[4])


# Texts with every character csv.writer quotes for, or the formula guard prefixes for.
AWKWARD = ["plain", "", "a,b", 'say "x"', "line\nbreak", "cr\rhere", "=1+1", "+1", "-1", "@a",
           "\tx", "\rx", ' "', ",", "'quoted'", "ünïcødé, too"]  # fmt: skip


def guarded(text: str) -> str:
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def test_every_awkward_text_is_written_as_csv_writer_writes_it(app, holder_client):
    client, account_id, _ = holder_client
    prefix, start = uuid.uuid4().hex, at(2026, 1, 1)
    written = io.StringIO()
    writer = csv.writer(written)
    writer.writerow(HEADER.rstrip("\r\n").split(","))
    with app.app_context():
        rows = []
        for index, text in enumerate(AWKWARD):
            key = create_key(account_id=account_id, name=text or "-").id
            generation_id = f"{prefix}{index:02d}{text}"
            moment = start + timedelta(seconds=index)
            units = 10 ** (index % 12) + index
            rows.append(
                {"id": generation_id, "account_id": account_id, "api_key_id": key,
                 "model": text, "api": text, "status": text, "cost": Decimal(units) / 10**10,
                 "latency_ms": index, "streamed": index % 2 == 0, "estimated": index % 3 == 0,
                 "created_at": moment}
            )  # fmt: skip
            expected = [moment.isoformat(timespec="microseconds"), generation_id, guarded(text),
                        text, guarded(text or "-"), 0, 0, 0, 0, usd_text(units), index, text,
                        str(index % 2 == 0).lower(), str(index % 3 == 0).lower()]  # fmt: skip
            rows[-1]["expected"] = expected
        for row in reversed(rows):
            writer.writerow(row.pop("expected"))
        db.session.execute(insert(Generation), rows)
        db.session.commit()

    assert client.get("/usage.csv").get_data(as_text=True) == written.getvalue()


@pytest.mark.parametrize(
    "units",
    [0, 1, 9, 10, 10**9, 5 * 10**9, 10**10 - 1, 10**10, 10**10 + 1, 12_345_678_901,
     999_999_999_999, 10**17 + 3, 2**62],
)  # fmt: skip
def test_the_cost_is_spelled_as_usd_text_spells_its_units(app, holder_client, units):
    client, account_id, _ = holder_client
    with app.app_context():
        db.session.execute(
            insert(Generation),
            [{"id": uuid.uuid4().hex, "account_id": account_id, "model": "dev-chat",
              "status": "completed", "cost": Decimal(units) / 10**10}],
        )  # fmt: skip
        db.session.commit()

    (record,) = csv.DictReader(io.StringIO(client.get("/usage.csv").get_data(as_text=True)))

    assert record["cost_usd"] == usd_text(units)
