"""The dashboard's usage page and CSV list embeddings requests, named by their API."""

from __future__ import annotations

from app.accounts.keys import create_key


def test_usage_and_csv_name_the_embeddings_api_never_the_input(app, holder_client):
    client, account_id, _ = holder_client
    with app.app_context():
        issued = create_key(account_id=account_id, name="retrieval")
    marker = "platypus-input-5e1d"
    api = app.test_client()
    headers = {"Authorization": f"Bearer {issued.value}"}
    answered = api.post(
        "/v1/embeddings", json={"model": "dev-embed", "input": [marker, "b"]}, headers=headers
    )
    assert answered.status_code == 200

    usage = client.get("/usage").text
    assert '<td data-label="API">embeddings</td>' in usage and "dev-embed" in usage
    rows = client.get("/usage.csv").text.splitlines()
    assert [row.split(",")[3] for row in rows[1:]] == ["embeddings"]
    assert "dev-embed" in rows[1]
    for page in (usage, "\n".join(rows)):
        assert marker not in page
