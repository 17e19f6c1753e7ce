"""What a request continues: its chain of stored responses, and the items it references.

The items a request sends are kept as they will be stored and listed: each with an id
(one is made for those that came without), an ``item_reference`` replaced by the item it
names. Items the chain holds already are not sent twice: a reference to one of them, or
a function call (by its call_id) that clients send again with its output (the AI SDK
does, with previous_response_id).
"""

from __future__ import annotations

import time
from typing import Any

from app.generations.lifecycle import Answer
from app.providers.base import ChatRequest
from app.responses.bodies import COMPLETED, INCOMPLETE, ResponseDraft, usage_body
from app.responses.errors import ItemNotFound
from app.responses.ids import ItemIds, response_id_of_item
from app.responses.schemas import ResponseRequest, item_type
from app.responses.store import Chain, find_chain, find_stored, save_response, stored_items
from app.responses.translation import ToolSet, chat_request, output_items

ID_PREFIXES = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}


def continued_chain(request: ResponseRequest, account_id: int) -> Chain:
    """Return the chain ``previous_response_id`` names (empty without one)."""
    previous = request.params.get("previous_response_id")
    return Chain() if previous is None else find_chain(account_id, previous)


def own_items(
    sent: list[dict[str, Any]], chain: Chain, account_id: int, ids: ItemIds
) -> list[dict[str, Any]]:
    """Return the items a request ``sent``, as stored: references resolved, repeats out, ids made.

    :raise ItemNotFound: an item_reference names no item of the account's stored responses.
    """
    known_ids = {item.get("id") for item in chain.items}
    known_calls = {item["call_id"] for item in chain.items if item.get("type") == "function_call"}
    items = []
    for index, item in enumerate(sent):
        kind = item_type(item)
        if kind == "item_reference":
            if item["id"] in known_ids:
                continue
            item = referenced_item(account_id, item["id"], f"input[{index}].id")
        elif kind == "function_call" and item["call_id"] in known_calls:
            continue
        if not item.get("id"):
            item = {"id": ids.next(ID_PREFIXES.get(kind, "item")), **item}
        items.append(item)
    return items


def referenced_item(account_id: int, item_id: str, param: str) -> dict[str, Any]:
    """Return the item ``item_id`` of the account's stored responses."""
    response_id = response_id_of_item(item_id)
    stored = None if response_id is None else find_stored(account_id, response_id)
    for item in stored_items(stored) if stored is not None else ():
        if item.get("id") == item_id:
            return item
    raise ItemNotFound(f"No item with id '{item_id[:64]}' in your stored responses.", param=param)


class Turn:
    """One request's place in its conversation: what it continues, what it adds, its answer."""

    def __init__(
        self,
        request: ResponseRequest,
        *,
        account_id: int,
        response_id: str,
        ttl_days: int,
        sent: list[dict[str, Any]] | None = None,
    ) -> None:
        """Place the request in its conversation; its items are ``sent``, or its ``input``.

        ``sent`` are the items as the caller sent them, for a request passed through.
        """
        self.request = request
        self.account_id = account_id
        self.ttl_days = ttl_days
        self.draft = ResponseDraft(response_id, int(time.time()), request)
        self.chain = continued_chain(request, account_id)
        sent = request.input if sent is None else sent
        self.items = own_items(sent, self.chain, account_id, self.draft.item_ids)
        self.tools = ToolSet(request.params.get("tools", ()))

    def chat_request(self) -> ChatRequest:
        """Return the normalized request: the chain's items, then this request's."""
        return chat_request(self.request, self.chain.items + self.items, self.tools)

    def answered(self, answer: Answer) -> dict[str, Any]:
        """Return the Response of a whole answer, stored if the request asked."""
        output, reason = output_items(answer.completion, self.tools, self.draft.item_ids)
        usage = usage_body(answer.completion.usage, answer.cost)
        status = INCOMPLETE if reason else COMPLETED
        response = self.draft.body(status, output, usage=usage, incomplete_reason=reason)
        self.finished(response)
        return response

    def finished(self, response: dict[str, Any]) -> None:
        """Keep the finished ``response`` with this request's items, if the request asked."""
        if self.request.store:
            save_response(
                account_id=self.account_id,
                chain=self.chain,
                input_items=self.items,
                response=response,
                ttl_days=self.ttl_days,
            )
