"""openai-python's Responses API client against the gateway, as its users call it."""

from __future__ import annotations

import json
from decimal import Decimal

import openai
import pytest
from pydantic import BaseModel

from tests.contract.conftest import billing_records

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "strict": True,
}
TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def cost_of(usage) -> Decimal:
    """Read the gateway's usage.cost.total_cost where the SDK keeps unknown fields."""
    return Decimal(str(usage.model_extra["cost"]["total_cost"]))


def charged(app, account_id: int) -> dict[str, Decimal]:
    """The cost of each of the account's generations, by id, as recorded and charged."""
    account, generations, charges, _ = billing_records(app, account_id)
    assert sum(-charge.amount for charge in charges) == sum(g.cost for g in generations)
    return {generation.id: generation.cost for generation in generations}


def test_create_answers_with_the_text_and_what_it_was_charged(app, client, funded_key):
    response = client.responses.create(
        model="dev-chat", input="Hello there", instructions="Be brief.", max_output_tokens=40
    )

    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed" and response.model == "dev-chat"
    assert response.output_text.startswith("Hello there ")
    (message,) = response.output
    assert message.type == "message" and message.id.startswith("msg_")
    assert message.content[0].annotations == []
    usage = response.usage
    # The built-in model: 4 per message and 3 for the reply, plus the texts' tokens.
    assert usage.input_tokens == (4 + 2) + (4 + 3) + 3
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0
    assert charged(app, funded_key.account_id) == {response.id: cost_of(usage)}
    assert (
        cost_of(usage)
        == (usage.input_tokens * Decimal("0.50") + usage.output_tokens * Decimal("1.50")) / 10**6
    )


def test_a_stream_sends_every_event_in_order_numbered_from_zero(app, client, funded_key):
    events = list(client.responses.create(model="dev-chat", input="Hello there", stream=True))

    types = [event.type for event in events]
    deltas = types.count("response.output_text.delta")
    assert deltas > 2
    assert types == TEXT_EVENTS[:4] + ["response.output_text.delta"] * deltas + TEXT_EVENTS[5:]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    response_ids = {
        event.response.id
        for event in events
        if event.type.startswith("response.") and hasattr(event, "response")
    }
    completed = events[-1].response
    assert response_ids == {completed.id}
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert completed.output_text == text and text.startswith("Hello there ")
    item_id = completed.output[0].id
    assert {event.item_id for event in events if hasattr(event, "item_id")} == {item_id}
    assert charged(app, funded_key.account_id) == {completed.id: cost_of(completed.usage)}


def test_the_stream_helper_accumulates_the_final_response(client):
    with client.responses.stream(model="dev-chat", input="Hello there") as stream:
        texts = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()

    assert final.output_text == "".join(texts)
    assert final.status == "completed" and cost_of(final.usage) > 0


def test_a_function_tool_round_trip(client):
    first = client.responses.create(
        model="dev-chat", input="Use get_weather for Paris", tools=[WEATHER_TOOL]
    )

    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.id.startswith("fc_") and call.status == "completed"
    assert json.loads(call.arguments)["unit"] == "celsius"
    answer = client.responses.create(
        model="dev-chat",
        input=[
            {"role": "user", "content": "Use get_weather for Paris"},
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp": 18}'},
        ],
        tools=[WEATHER_TOOL],
    )

    assert answer.output_text == 'Tool result received: {"temp": 18}'


def test_previous_response_id_continues_the_conversation_and_bills_it_as_input(client):
    first = client.responses.create(
        model="dev-chat", input="Use get_weather for Paris", tools=[WEATHER_TOOL]
    )
    (call,) = first.output

    answer = client.responses.create(
        model="dev-chat",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[WEATHER_TOOL],
    )

    assert answer.output_text == "Tool result received: sunny"
    assert answer.previous_response_id == first.id
    again = client.responses.create(
        model="dev-chat", previous_response_id=answer.id, input="Thanks", tools=[WEATHER_TOOL]
    )
    chained = again.usage.input_tokens
    # Every earlier message is input again: the user's, the call, its output, the answer.
    assert chained > answer.usage.input_tokens > first.usage.input_tokens


def test_a_chained_answer_counts_the_earlier_turn_exactly(client):
    first = client.responses.create(model="dev-chat", input="Hello there")
    second = client.responses.create(model="dev-chat", input="Again", previous_response_id=first.id)

    # The chain: the user's message (4 + 2), the answer (4 + its tokens), then (4 + 1) + 3.
    assert second.usage.input_tokens == first.usage.input_tokens + first.usage.output_tokens + 9


def test_retrieve_input_items_and_delete(client):
    created = client.responses.create(
        model="dev-chat",
        input=[
            {"role": "developer", "content": "Answer plainly."},
            {"role": "user", "content": [{"type": "input_text", "text": "Hello there"}]},
        ],
        metadata={"ticket": "T-1"},
    )

    retrieved = client.responses.retrieve(created.id)
    assert retrieved.model_dump() == created.model_dump()
    assert retrieved.metadata == {"ticket": "T-1"}
    items = list(client.responses.input_items.list(created.id))
    assert [(item.type, item.role) for item in items] == [
        ("message", "user"),
        ("message", "developer"),
    ]
    assert items[0].content[0].text == "Hello there"
    ascending = client.responses.input_items.list(created.id, order="asc", limit=1)
    assert ascending.data[0].role == "developer" and ascending.has_more
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.retrieve(created.id)
    assert caught.value.code == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="dev-chat", input="Hi", previous_response_id=created.id)


def test_a_response_not_stored_cannot_be_retrieved_or_continued(client):
    created = client.responses.create(model="dev-chat", input="Hello there", store=False)

    assert created.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model="dev-chat", input="Hi", previous_response_id=created.id)
    assert caught.value.code == "previous_response_not_found"
    assert caught.value.param == "previous_response_id"


def test_another_accounts_response_is_not_found(client, base_url, make_funded_key):
    created = client.responses.create(model="dev-chat", input="Hello there")
    stranger = openai.OpenAI(base_url=base_url, api_key=make_funded_key().key, max_retries=0)

    with pytest.raises(openai.NotFoundError):
        stranger.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        stranger.responses.input_items.list(created.id)
    with pytest.raises(openai.NotFoundError):
        stranger.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        stranger.responses.create(model="dev-chat", input="Hi", previous_response_id=created.id)
    assert client.responses.retrieve(created.id).id == created.id


class CityWeather(BaseModel):
    city: str
    temperature_celsius: float
    raining: bool


def test_parse_returns_a_pydantic_model(client):
    response = client.responses.parse(
        model="dev-chat", input="Weather in Paris as JSON", text_format=CityWeather
    )

    assert isinstance(response.output_parsed, CityWeather)
    assert response.output_parsed == CityWeather.model_validate_json(response.output_text)
    assert cost_of(response.usage) > 0


def test_reasoning_comes_first_as_a_summary(client):
    response = client.responses.create(
        model="dev-chat", input="Hello there", reasoning={"effort": "low", "summary": "auto"}
    )

    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.summary[0].text.startswith("Considering")
    assert response.usage.output_tokens_details.reasoning_tokens == 16
    assert message.content[0].text.startswith("Hello there")


def test_max_output_tokens_cuts_the_answer_short_as_incomplete(client):
    response = client.responses.create(model="dev-chat", input="Hello there", max_output_tokens=3)

    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3
    assert response.output[0].status == "incomplete"
