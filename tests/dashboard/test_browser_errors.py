"""Where a browser goes astray it gets the dashboard's pages; an API client keeps its JSON.

Real headless Chromium and real HTTP against the gunicorn server.
"""

from __future__ import annotations

import pytest
import requests

from tests.dashboard.test_browser import sign_up

# What Chromium sends for a page it navigates to.
BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


def test_a_page_that_does_not_exist_is_the_dashboards_error_page(live_server, page):
    answer = page.goto(f"{live_server.url}/no-such-page")

    assert answer.status == 404 and answer.headers["content-type"].startswith("text/html")
    assert page.get_by_role("heading", name="Not found").is_visible()
    assert page.get_by_role("link", name="Back to the dashboard").is_visible()
    assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]


def test_get_signout_offers_the_sign_out_button_which_posts_with_its_token(live_server, page):
    sign_up(page, live_server.url)

    answer = page.goto(f"{live_server.url}/signout")

    assert answer.status == 200
    page.get_by_role("heading", name="Sign out?").wait_for()
    page.get_by_role("main").get_by_role("button", name="Sign out").click()
    page.get_by_role("heading", name="Sign in").wait_for()
    page.goto(f"{live_server.url}/keys")
    assert page.get_by_role("heading", name="Sign in").is_visible()


def test_get_signout_without_a_session_goes_to_sign_in(live_server, page):
    page.goto(f"{live_server.url}/signout")

    assert page.get_by_role("heading", name="Sign in").is_visible()


@pytest.mark.parametrize("path", ["/v1/no-such-thing", "/v1", "/healthz/more", "/metrics/x"])
def test_api_paths_answer_json_even_to_a_browser(live_server, path):
    answer = requests.get(
        f"{live_server.url}{path}", headers={"Accept": BROWSER_ACCEPT}, timeout=30
    )

    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("accept", [None, "*/*", "application/json"])
def test_an_unknown_path_answers_json_to_whoever_does_not_ask_for_html(live_server, accept):
    headers = {"Accept": accept} if accept else {}
    answer = requests.post(f"{live_server.url}/chat/completions", headers=headers, timeout=30)

    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "not_found"


def test_get_on_the_messages_door_stays_in_anthropics_envelope(live_server):
    answer = requests.get(
        f"{live_server.url}/v1/messages", headers={"Accept": BROWSER_ACCEPT}, timeout=30
    )

    assert answer.status_code == 405
    assert answer.json()["type"] == "error"
