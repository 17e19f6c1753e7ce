"""Clients users bring, unchanged, pointed at the real service (gunicorn, real HTTP)."""

from __future__ import annotations

import openai
import pytest


@pytest.fixture
def base_url(live_server) -> str:
    """The gateway's API base, as every OpenAI client takes it."""
    return f"{live_server.url}/v1"


@pytest.fixture
def client(base_url, funded_key) -> openai.OpenAI:
    """The official Python SDK with a funded key, without retries unless a test asks."""
    return openai.OpenAI(base_url=base_url, api_key=funded_key.key, max_retries=0, timeout=30)
