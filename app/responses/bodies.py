"""The Responses API's wire format: output items, the Response object, usage, stream events.

Nothing here knows where the output came from: ``translation`` fills it from the core's
normalized results; a response passed through from an upstream that speaks the protocol
would come in this shape already.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from app.errors import APIError
from app.providers.base import Usage
from app.responses.ids import ItemIds
from app.responses.schemas import ResponseRequest
from app.sse import Framing, typed_events

COMPLETED, INCOMPLETE, FAILED, IN_PROGRESS = "completed", "incomplete", "failed", "in_progress"
# A chat finish reason that cuts the answer short, as the Response's incomplete reason.
INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}


def message_item(item_id: str, text: str, status: str = COMPLETED) -> dict[str, Any]:
    """Return an assistant message item with one output_text part."""
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [text_part(text)],
    }


def text_part(text: str) -> dict[str, Any]:
    """Return an output_text part."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_item(item_id: str, summary: str) -> dict[str, Any]:
    """Return a reasoning item whose summary is the model's reasoning text."""
    return {"id": item_id, "type": "reasoning", "summary": [summary_part(summary)]}


def summary_part(text: str) -> dict[str, Any]:
    """Return a summary_text part."""
    return {"type": "summary_text", "text": text}


def function_call_item(
    item_id: str,
    call_id: str,
    name: str,
    arguments: str,
    namespace: str | None = None,
    status: str = COMPLETED,
) -> dict[str, Any]:
    """Return a function_call item; a namespaced function's call names its namespace."""
    item = {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }
    if namespace is not None:
        item["namespace"] = namespace
    return item


def usage_body(usage: Usage, cost: Decimal) -> dict[str, Any]:
    """Render the Responses usage, with the contract's cost of what was charged."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
            "cache_write_1h_tokens": usage.cache_write_1h_tokens,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
        "cost": {"total_cost": cost},
    }


class ResponseDraft:
    """A response being answered: its id, when, for which model, and the settings echoed."""

    def __init__(self, response_id: str, created_at: int, request: ResponseRequest) -> None:
        self.id = response_id
        self.created_at = created_at
        self.item_ids = ItemIds(response_id)
        self.settings = echoed_settings(request)

    def body(
        self,
        status: str,
        output: list[dict[str, Any]],
        *,
        usage: dict[str, Any] | None = None,
        incomplete_reason: str | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Return the Response object in ``status`` with ``output``."""
        finished = status in (COMPLETED, INCOMPLETE)
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": self.created_at if finished else None,
            "error": error,
            "incomplete_details": incomplete_reason and {"reason": incomplete_reason},
            "output": output,
            "usage": usage,
            **self.settings,
        }


def echoed_settings(request: ResponseRequest) -> dict[str, Any]:
    """Return the request's settings as the Response object echoes them."""
    params = request.params
    text = dict(params.get("text") or {})
    text.setdefault("format", {"type": "text"})
    text.setdefault("verbosity", params.get("verbosity", "medium"))
    reasoning = params.get("reasoning") or {}
    return {
        "model": request.model,
        "background": False,
        "instructions": params.get("instructions"),
        "max_output_tokens": params.get("max_output_tokens"),
        "max_tool_calls": None,
        "metadata": params.get("metadata", {}),
        "parallel_tool_calls": params.get("parallel_tool_calls", True),
        "previous_response_id": params.get("previous_response_id"),
        "prompt_cache_key": params.get("prompt_cache_key"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "safety_identifier": params.get("safety_identifier"),
        "service_tier": "default",
        "store": request.store,
        "temperature": params.get("temperature"),
        "text": text,
        "tool_choice": params.get("tool_choice", "auto"),
        "tools": params.get("tools", []),
        "top_logprobs": params.get("top_logprobs"),
        "top_p": params.get("top_p"),
        "truncation": params.get("truncation", "disabled"),
        "user": params.get("user"),
    }


def error_body(error: APIError) -> dict[str, Any]:
    """Return an error as a Response's ``error`` and the error event carry it."""
    return {"type": error.type, "code": error.code or error.type, "message": error.message}


class EventWriter:
    """Writes a streamed response's events: numbered from 0, one output item open at a time.

    ``translation`` tells it what the model produced (text, reasoning, a call's
    arguments); it opens and closes items around that and appends their events to
    ``events``, which the stream takes as they come. ``output`` holds the items done.
    """

    def __init__(self, draft: ResponseDraft) -> None:
        self.draft = draft
        self.events: list[dict[str, Any]] = []
        self.output: list[dict[str, Any]] = []
        self.sequence = 0
        # The open item (its kind, id and output index), and the pieces of its text (or
        # arguments) delivered so far.
        self.open: dict[str, Any] | None = None
        self.open_kind: str | None = None
        self.open_id = ""
        self.pieces: list[str] = []

    def number(self) -> int:
        """Return the next sequence number."""
        self.sequence += 1
        return self.sequence - 1

    def event(self, kind: str, **fields: Any) -> None:
        """Append an event of ``kind`` with the next sequence number."""
        self.events.append({"type": kind, "sequence_number": self.number(), **fields})

    def start(self) -> None:
        """Announce the response: created, then in progress."""
        response = self.draft.body(IN_PROGRESS, [])
        self.event("response.created", response=response)
        self.event("response.in_progress", response=response)

    def text(self, delta: str) -> None:
        """Deliver answer text, in the open message or a new one."""
        if self.open_kind != "message":
            item_id = self.draft.item_ids.next("msg")
            self._open({"id": item_id, "type": "message", "status": IN_PROGRESS,
                        "role": "assistant", "content": []})  # fmt: skip
            self._item_event("response.content_part.added", content_index=0, part=text_part(""))
        self.pieces.append(delta)
        # The one event of every token: written out here, without a helper's calls.
        self.events.append({"type": "response.output_text.delta", "sequence_number": self.number(),
                            "item_id": self.open_id, "output_index": len(self.output),
                            "content_index": 0, "delta": delta, "logprobs": []})  # fmt: skip

    def reasoning(self, delta: str) -> None:
        """Deliver reasoning text, as the summary of the open reasoning item or a new one."""
        if self.open_kind != "reasoning":
            self._open({"id": self.draft.item_ids.next("rs"), "type": "reasoning", "summary": []})
            self._item_event(
                "response.reasoning_summary_part.added", summary_index=0, part=summary_part("")
            )
        self.pieces.append(delta)
        self._item_event("response.reasoning_summary_text.delta", summary_index=0, delta=delta)

    def call(self, call_id: str, name: str, namespace: str | None) -> None:
        """Open a function call item, its arguments to come."""
        item_id = self.draft.item_ids.next("fc")
        self._open(function_call_item(item_id, call_id, name, "", namespace, IN_PROGRESS))

    def arguments(self, delta: str) -> None:
        """Deliver a piece of the open function call's arguments."""
        self.pieces.append(delta)
        self._item_event("response.function_call_arguments.delta", delta=delta)

    def close(self, status: str = COMPLETED) -> None:
        """Close the open item, if any, with its whole text."""
        if self.open is None:
            return
        done = self.done_item(status)
        if self.open_kind == "message":
            part = done["content"][0]
            self._item_event(
                "response.output_text.done", content_index=0, text=part["text"], logprobs=[]
            )
            self._item_event("response.content_part.done", content_index=0, part=part)
        elif self.open_kind == "reasoning":
            part = done["summary"][0]
            self._item_event(
                "response.reasoning_summary_text.done", summary_index=0, text=part["text"]
            )
            self._item_event("response.reasoning_summary_part.done", summary_index=0, part=part)
        else:
            self._item_event(
                "response.function_call_arguments.done",
                arguments=done["arguments"],
                name=done["name"],
            )
        self.event("response.output_item.done", output_index=len(self.output), item=done)
        self.output.append(done)
        self.open, self.open_kind, self.pieces = None, None, []

    def done_item(self, status: str) -> dict[str, Any]:
        """Return the open item whole, with what was delivered of it."""
        item, text = self.open, "".join(self.pieces)
        if self.open_kind == "message":
            return message_item(item["id"], text, status)
        if self.open_kind == "reasoning":
            return reasoning_item(item["id"], text)
        return {**item, "arguments": text, "status": COMPLETED}

    def finish(self, usage: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        """Close the open item and return the finished Response (its terminal event to come)."""
        reason = INCOMPLETE_REASONS.get(finish_reason or "")
        status = INCOMPLETE if reason else COMPLETED
        self.close(status)
        if not self.output:
            # A model that said nothing still answers with a message, as OpenAI does.
            self.text("")
            self.close(status)
        return self.draft.body(status, self.output, usage=usage, incomplete_reason=reason)

    def terminal(self, response: dict[str, Any]) -> None:
        """Append the event that ends the stream: response.completed or response.incomplete."""
        self.event(f"response.{response['status']}", response=response)

    def failure(self, error: APIError) -> bytes:
        """Frame the events that end a stream broken by ``error``: error, response.failed."""
        partial = [*self.output, self.done_item(INCOMPLETE)] if self.open else self.output
        body = error_body(error)
        self.events = []
        self.event("error", code=body["code"], message=body["message"], param=error.param,
                   error={**body, "param": error.param})  # fmt: skip
        self.event("response.failed", response=self.draft.body(FAILED, partial, error=body))
        return typed_events(self.events)

    def framing(self) -> Framing:
        """Return how this stream's events are written: each upstream read's together."""
        return Framing(frame=typed_events, error=self.failure)

    def _open(self, item: dict[str, Any]) -> None:
        # ``item`` is never changed once added: done_item makes the finished one anew.
        self.close()
        self.open, self.open_kind, self.open_id, self.pieces = item, item["type"], item["id"], []
        self.event("response.output_item.added", output_index=len(self.output), item=item)

    def _item_event(self, kind: str, **fields: Any) -> None:
        self.event(kind, item_id=self.open_id, output_index=len(self.output), **fields)
