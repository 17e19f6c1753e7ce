"""The OpenAI Agents SDK (Python): an Agent with a function tool, run by its Runner."""

from __future__ import annotations

import asyncio

import openai
import pytest
from agents import (
    Agent,
    Runner,
    function_tool,
    set_default_openai_api,
    set_default_openai_client,
    set_tracing_disabled,
)

from tests.contract.conftest import billing_records


@pytest.fixture
def agent(base_url, funded_key):
    """An agent on dev-chat through the gateway, with a get_weather tool that records its calls."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=funded_key.key, max_retries=0)
    set_default_openai_client(client, use_for_tracing=False)
    set_default_openai_api("responses")
    # Traces would go to OpenAI's own service, which these tests must never reach.
    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Return the weather for a city."""
        calls.append(city)
        return f"Sunny in {city}"

    agent = Agent(
        name="Assistant",
        instructions="Use tools when helpful.",
        model="dev-chat",
        tools=[get_weather],
    )
    return agent, calls


def test_runner_calls_the_tool_and_answers_from_its_result(app, agent, funded_key):
    assistant, calls = agent

    result = Runner.run_sync(assistant, "What is the weather in Paris? Use get_weather.")

    assert calls == ["What"]  # the built-in model fills a string with the prompt's first word
    assert result.final_output == "Tool result received: Sunny in What"
    _, generations, charges, _ = billing_records(app, funded_key.account_id)
    assert [g.api for g in generations] == ["responses", "responses"]
    usage = result.context_wrapper.usage
    assert usage.requests == 2
    assert usage.input_tokens == sum(g.prompt_tokens for g in generations)
    assert usage.output_tokens == sum(g.completion_tokens for g in generations)
    assert sum(-charge.amount for charge in charges) == sum(g.cost for g in generations) > 0


def test_a_streamed_run_answers_the_same(agent):
    assistant, calls = agent

    async def run() -> str:
        result = Runner.run_streamed(assistant, "What is the weather in Rome? Use get_weather.")
        kinds = {event.type async for event in result.stream_events()}
        assert "raw_response_event" in kinds
        return result.final_output

    assert asyncio.run(run()) == "Tool result received: Sunny in What"
    assert calls == ["What"]
