"""The dashboard's usage page and CSV say a generation came through the Messages API."""

from __future__ import annotations

from app.accounts.keys import create_key


def test_usage_and_csv_name_the_messages_api_never_the_content(app, holder_client):
    client, account_id, _ = holder_client
    with app.app_context():
        issued = create_key(account_id=account_id, name="claude-code")
    marker = "wombat-content-7f3c"
    api = app.test_client()
    body = {
        "model": "dev-chat",
        "max_tokens": 20,
        "messages": [{"role": "user", "content": marker}],
    }
    answered = api.post("/v1/messages", json=body, headers={"x-api-key": issued.value})
    chat = {"model": "dev-chat", "messages": [{"role": "user", "content": "Hi"}]}
    headers = {"Authorization": f"Bearer {issued.value}"}
    assert answered.status_code == 200 and marker in answered.text
    assert api.post("/v1/chat/completions", json=chat, headers=headers).status_code == 200

    usage = client.get("/usage").text
    api = '<td data-label="API">{}</td>'.format
    assert api("messages") in usage and api("chat") in usage
    rows = client.get("/usage.csv").text.splitlines()
    assert sorted(row.split(",")[3] for row in rows[1:]) == ["chat", "messages"]
    assert answered.json["id"] in "\n".join(rows)
    for page in (usage, "\n".join(rows), client.get("/balance").text):
        assert marker not in page
