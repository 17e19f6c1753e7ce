"""A gateway process remembers the callers of keys it has seen, until a key changes.

Each worker remembers callers and hears of key changes: on PostgreSQL by listening
(migration 0010's trigger), on SQLite from the file of changes beside the database.
These tests change keys from another process (the flask commands and the dashboard's
functions, run here by the test process, or plain SQL nobody hears of) while gunicorn
serves, on both databases.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import requests
from sqlalchemy import text

from app.accounts.keys import update_key_limits
from app.extensions import db
from tests.contract.conftest import billing_records

CHAT = {"model": "dev-chat-mini", "messages": [{"role": "user", "content": "hello"}]}


def models(base_url: str, key: str) -> requests.Response:
    return requests.get(
        f"{base_url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


def chat(base_url: str, key: str) -> requests.Response:
    return requests.post(
        f"{base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json=CHAT,
        timeout=30,
    )


def heard_within(seconds: float, ask: Callable[[], requests.Response], heard) -> requests.Response:
    """Ask until ``heard`` holds of the answer, for ``seconds`` at most; return the last answer.

    A change is read at the worker's first request after its notification arrived,
    which PostgreSQL sends once the change committed: a request sent at once may come
    first on a loaded machine. Reads (the models list) may answer as before until then;
    a hold never does, since it checks the key in its own statement.
    """
    deadline = time.monotonic() + seconds
    while not heard(answer := ask()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return answer


def change_keys_unheard(app, statement: str, **parameters: object) -> None:
    """Run ``statement`` on api_keys so that no process hears of the change.

    On PostgreSQL with the trigger off; on SQLite plain SQL is never heard of.
    """
    with app.app_context():
        postgresql = db.engine.dialect.name == "postgresql"
        if postgresql:
            db.session.execute(text("ALTER TABLE api_keys DISABLE TRIGGER api_keys_changed"))
        db.session.execute(text(statement), parameters)
        if postgresql:
            db.session.execute(text("ALTER TABLE api_keys ENABLE TRIGGER api_keys_changed"))
        db.session.commit()


def test_a_key_revoked_by_a_command_is_refused_at_its_next_request(live_server, runner, funded_key):
    assert models(live_server.url, funded_key.key).status_code == 200
    assert chat(live_server.url, funded_key.key).status_code == 200

    assert runner.invoke(args=["keys", "revoke", str(funded_key.key_id)]).exit_code == 0

    charged = chat(live_server.url, funded_key.key)
    listed = heard_within(
        10,
        lambda: models(live_server.url, funded_key.key),
        lambda answer: answer.status_code != 200,
    )
    for answer in (charged, listed):
        assert answer.status_code == 403
        assert answer.json()["error"]["code"] == "api_key_revoked"


def test_a_rotated_key_fails_at_once_and_its_new_value_works(live_server, runner, funded_key):
    assert models(live_server.url, funded_key.key).status_code == 200

    rotated = runner.invoke(args=["keys", "rotate", str(funded_key.key_id)])
    new_value = rotated.output.strip().splitlines()[-1]

    assert chat(live_server.url, funded_key.key).status_code == 401
    listed = heard_within(
        10,
        lambda: models(live_server.url, funded_key.key),
        lambda answer: answer.status_code != 200,
    )
    assert listed.status_code == 401
    assert chat(live_server.url, new_value).status_code == 200


def test_a_key_limited_to_other_models_is_held_to_them_at_its_next_request(
    app, live_server, funded_key
):
    assert chat(live_server.url, funded_key.key).status_code == 200

    with app.app_context():
        update_key_limits(funded_key.key_id, permitted_models=["dev-slow"], monthly_limit=None)

    def listed(answer: requests.Response) -> list[str]:
        return [model["id"] for model in answer.json()["data"]]

    answer = heard_within(
        10,
        lambda: models(live_server.url, funded_key.key),
        lambda answer: listed(answer) == ["dev-slow"],
    )
    refused = chat(live_server.url, funded_key.key)
    assert listed(answer) == ["dev-slow"]
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "model_not_found"


def test_a_hold_refuses_a_revoked_key_its_caller_was_remembered_with(app, live_server, funded_key):
    assert models(live_server.url, funded_key.key).status_code == 200

    change_keys_unheard(
        app, "UPDATE api_keys SET state = 'revoked' WHERE id = :id", id=funded_key.key_id
    )

    # The worker still remembers the key as active (nobody told it)...
    assert models(live_server.url, funded_key.key).status_code == 200
    # ...but the hold checks the key itself: nothing is held or charged on it.
    refused = chat(live_server.url, funded_key.key)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "api_key_revoked"
    account, generations, charges, holds = billing_records(app, funded_key.account_id)
    assert (generations, charges, holds) == ([], [], [])
    assert account.reserved == 0


def test_a_hold_refuses_the_old_value_of_a_key_rotated_unheard(app, live_server, funded_key):
    assert models(live_server.url, funded_key.key).status_code == 200

    change_keys_unheard(
        app,
        "UPDATE api_keys SET digest = :digest WHERE id = :id",
        id=funded_key.key_id,
        digest="0" * 64,
    )

    refused = chat(live_server.url, funded_key.key)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"
    _, generations, charges, holds = billing_records(app, funded_key.account_id)
    assert (generations, charges, holds) == ([], [], [])
