"""The usage page's generations, a keyset page at a time, and the CSV, over a filtered list."""

from __future__ import annotations

import csv
import html
import io
import re
import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from sqlalchemy import insert

from app.accounts.keys import create_key
from app.dashboard import usage
from app.database import utcnow
from app.extensions import db
from app.generations.models import Generation
from app.generations.rollups import rebuild_rollups

# Three generations share each moment, so that pages and batches split ties.
PER_MOMENT = 3


@pytest.fixture
def history(app, holder_client):
    """Two keys' generations on two models, each with its own latency to tell it by."""
    client, account_id, _ = holder_client
    with app.app_context():
        first = create_key(account_id=account_id, name="first").id
        second = create_key(account_id=account_id, name="second").id
        start = utcnow() - timedelta(days=3)
        rows = []
        for index in range(240):
            key_id = first if index % 2 else second
            rows.append(
                {
                    "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
                    "account_id": account_id,
                    "api_key_id": key_id,
                    "model": "dev-chat" if index % 4 < 2 else "dev-chat-mini",
                    "cost": Decimal("0.001"),
                    "status": "completed",
                    "latency_ms": 10_000 + index,
                    "created_at": start + timedelta(minutes=17 * (index // PER_MOMENT)),
                }
            )
        db.session.execute(insert(Generation), rows)
        db.session.commit()
        rebuild_rollups(account_id=account_id)
    return client, first, rows


def newest_first(rows):
    ordered = sorted(rows, key=lambda row: (row["created_at"], row["id"]), reverse=True)
    return [row["latency_ms"] for row in ordered]


def latencies(page: str) -> list[int]:
    cells = re.findall(r'<td data-label="Latency" class="num">(\d+) ms</td>', page)
    return [int(found) for found in cells]


def link(page: str, rel: str) -> str | None:
    found = re.search(rf'rel="{rel}" href="([^"]+)"', page)
    return html.unescape(found.group(1)) if found else None


def test_older_links_walk_a_filtered_list_once_each_and_newer_ones_walk_back(history):
    client, first, rows = history
    expected = newest_first([row for row in rows if row["api_key_id"] == first])
    pages, url = [], f"/usage?key={first}"
    while url:
        page = client.get(url).text
        pages.append(latencies(page))
        url = link(page, "next")
        assert url is None or f"key={first}" in url

    assert [latency for page in pages for latency in page] == expected
    assert [len(page) for page in pages] == [50, 50, 20]

    back, url = [], link(page, "prev")
    while url:
        page = client.get(url).text
        back.insert(0, latencies(page))
        url = link(page, "prev")
    assert back == pages[:-1]


def test_a_page_deep_in_the_list_starts_right_after_its_cursor(history):
    client, first, rows = history
    expected = newest_first([row for row in rows if row["model"] == "dev-chat-mini"])
    page = client.get("/usage?model=dev-chat-mini").text
    second = client.get(link(page, "next")).text
    assert latencies(page) + latencies(second)[:10] == expected[:60]


def test_the_csv_streams_the_filtered_list_in_batches_newest_first(history, monkeypatch):
    client, first, rows = history
    monkeypatch.setattr(usage, "CSV_BATCH", 7)
    chosen = [row for row in rows if row["api_key_id"] == first and row["model"] == "dev-chat"]

    exported = client.get(f"/usage.csv?key={first}&model=dev-chat").text
    records = list(csv.DictReader(io.StringIO(exported)))

    assert [int(record["latency_ms"]) for record in records] == newest_first(chosen)
    assert {record["key"] for record in records} == {"first"}
    assert len({record["id"] for record in records}) == len(chosen) == 60


def test_totals_come_from_the_rollups_of_the_filtered_hours(history):
    client, first, rows = history
    day = rows[-1]["created_at"].date()
    page = client.get(f"/usage?key={first}&from={day}&to={day}").text
    count = sum(1 for row in rows if row["api_key_id"] == first and row["created_at"].date() == day)
    per_model = page.split('id="totals-1"')[1].split("</section>")[0]
    requests = re.findall(r'<td data-label="Requests" class="num">(\d+)</td>', per_model)
    counted = sum(int(n) for n in requests)
    assert counted == count


def test_totals_cover_the_last_30_days_unless_dates_are_chosen(app, holder_client):
    client, account_id, _ = holder_client
    today = utcnow()
    with app.app_context():
        db.session.execute(
            insert(Generation),
            [
                {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "account_id": account_id,
                 "model": model, "cost": Decimal("0.5"), "status": "completed",
                 "created_at": today - timedelta(days=days)}
                for model, days in (("dev-chat", 40), ("dev-chat-mini", 1))
            ],
        )  # fmt: skip
        db.session.commit()
        rebuild_rollups(account_id=account_id)

    window = client.get("/usage").text.split('id="totals-1"')[1].split("</section>")[0]
    chosen = client.get(f"/usage?from={(today - timedelta(days=60)).date()}").text
    everything = chosen.split('id="totals-1"')[1].split("</section>")[0]

    dev_chat = '<td data-label="Model">dev-chat</td>'
    assert "dev-chat-mini" in window and dev_chat not in window
    assert dev_chat in everything and "dev-chat-mini" in everything
    assert "the last 30 days, unless dates are chosen" in client.get("/usage").text


def test_the_chart_keeps_every_model_while_the_totals_follow_a_models_filter(history):
    client, _, rows = history
    spent = sum(row["cost"] for row in rows)

    whole = client.get("/usage").text
    filtered = client.get("/usage?model=dev-chat").text

    def chart_total(page: str) -> str:
        return re.search(r'<title id="chart-title">[^<]*: \$([0-9.]+) in all</title>', page)[1]

    def legend(page: str) -> list[str]:
        listed = page.split('class="legend"')[1].split("</ul>")[0]
        return re.findall(r"</svg> ([\w-]+)</li>", listed)

    def per_model(page: str) -> str:
        return page.split('id="totals-1"')[1].split("</section>")[0]

    assert chart_total(whole) == chart_total(filtered) and Decimal(chart_total(whole)) == spent
    assert legend(whole) == legend(filtered) and set(legend(whole)) == {"dev-chat", "dev-chat-mini"}
    assert "dev-chat-mini" in per_model(whole) and "dev-chat-mini" not in per_model(filtered)
