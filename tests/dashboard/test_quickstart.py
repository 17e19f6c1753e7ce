"""The Quick start page: each door and client, configured for the address the page is read at."""

from __future__ import annotations

import html
import re
import tomllib

import pytest

from tests.dashboard.conftest import PASSWORD, csrf_token, make_holder, new_client
from tests.dashboard.test_browser import sign_up

HOST = "gateway.example.org"
PUBLIC = f"http://{HOST}:8443"  # another host and port than the test client's own
CONFIGURATIONS = (
    "key",
    "curl",
    "openai-python",
    "openai-node",
    "anthropic-python",
    "anthropic-typescript",
    "codex-cli",
    "claude-code",
)


def shown(page: str, element_id: str) -> str:
    """The text of the element ``element_id``, as a reader copies it."""
    match = re.search(rf'<code id="{element_id}"[^>]*>(.*?)</code>', page, re.DOTALL)
    assert match, f"the page shows no {element_id}"
    return html.unescape(match.group(1))


@pytest.fixture
def quickstart(app) -> str:
    """The Quick start page as a holder signed in at the public address reads it."""
    _, email = make_holder(app)
    client = new_client(app)
    token = csrf_token(client.get("/signin", base_url=PUBLIC).text)
    form = {"csrf_token": token, "email": email, "password": PASSWORD}
    assert client.post("/signin", data=form, base_url=PUBLIC).status_code == 302
    answer = client.get("/quickstart", base_url=PUBLIC)
    assert answer.status_code == 200
    return answer.text


def test_the_page_names_both_base_urls_of_its_own_address(quickstart):
    assert shown(quickstart, "openai-base-url") == f"{PUBLIC}/v1"
    assert shown(quickstart, "anthropic-base-url") == PUBLIC


def test_every_client_has_a_block_and_a_copy_button_for_it(quickstart):
    for name in CONFIGURATIONS:
        assert shown(quickstart, f"code-{name}")
        assert f'data-copy-target="code-{name}"' in quickstart
    assert shown(quickstart, "code-key") == "export GATEWAY_API_KEY=sk-gw-...\n"


def test_codex_gets_a_model_provider_block_for_the_responses_api(quickstart):
    config = tomllib.loads(shown(quickstart, "code-codex-cli"))

    provider = config["model_providers"][config["model_provider"]]
    assert provider["base_url"] == f"{PUBLIC}/v1"
    assert (provider["wire_api"], provider["env_key"]) == ("responses", "GATEWAY_API_KEY")
    assert f"<code>{config['model']}</code>" in quickstart  # a model the page lists


def test_claude_code_gets_its_variables_without_v1(quickstart):
    lines = shown(quickstart, "code-claude-code").splitlines()

    assert f"export ANTHROPIC_BASE_URL={PUBLIC}" in lines
    assert "export ANTHROPIC_AUTH_TOKEN=$GATEWAY_API_KEY" in lines
    assert lines[-1].startswith("claude --model ")


@pytest.mark.parametrize(
    "name, address",
    [
        ("openai-python", f'base_url="{PUBLIC}/v1"'),
        ("openai-node", f'baseURL: "{PUBLIC}/v1"'),
        ("anthropic-python", f'base_url="{PUBLIC}"'),
        ("anthropic-typescript", f'baseURL: "{PUBLIC}"'),
    ],
)
def test_each_sdk_is_given_its_doors_address(quickstart, name, address):
    code = shown(quickstart, f"code-{name}")

    assert address in code and "GATEWAY_API_KEY" in code
    if name.endswith("python"):
        compile(code, name, "exec")


def test_curl_calls_each_door(quickstart):
    code = shown(quickstart, "code-curl")

    for path in ("/v1/chat/completions", "/v1/responses", "/v1/messages"):
        assert f"curl {PUBLIC}{path} " in code


@pytest.mark.parametrize("width", [1280, 390])
def test_every_block_and_table_stays_in_its_card(live_server, browser, artifacts, width):
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)
    page = context.new_page()
    try:
        sign_up(page, live_server.url)
        page.goto(f"{live_server.url}/quickstart")
        page.screenshot(path=str(artifacts / f"quickstart-{width}.png"), full_page=True)

        assert page.evaluate("document.documentElement.scrollWidth") <= width
        overflowing = page.evaluate(
            """() => [...document.querySelectorAll('.card pre, .card table, .card button')]
                .filter((element) => {
                  const inner = element.getBoundingClientRect();
                  const card = element.closest('.card').getBoundingClientRect();
                  return inner.right > card.right + 0.5 || inner.left < card.left - 0.5;
                })
                .map((element) => element.outerHTML.slice(0, 80))"""
        )
        assert overflowing == []
        section = page.locator("section", has=page.get_by_role("heading", name="Codex CLI"))
        section.get_by_role("button", name="Copy").click()
        copied = page.evaluate("navigator.clipboard.readText()")
        assert f'base_url = "{live_server.url}/v1"' in copied
    finally:
        context.close()
