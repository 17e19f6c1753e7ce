"""Clients for the contract tests: the official openai SDK against the live server."""

from __future__ import annotations

import openai
import pytest


@pytest.fixture
def make_client(live_server):
    """``make_client(key)``: an OpenAI SDK client pointed at the gateway, without retries."""

    def make(key: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{live_server.url}/v1", api_key=key, max_retries=0, timeout=30
        )

    return make


@pytest.fixture
def sdk(make_client, funded_key) -> openai.OpenAI:
    """An SDK client with a funded key."""
    return make_client(funded_key.key)
