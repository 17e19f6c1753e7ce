"""What a stream delivered: the upstream's usage as it arrives, and the text itself.

A stream is billed from the upstream's usage when it reaches its end, and otherwise
from what it delivered, counted here. The count is kept as the stream goes, so that the
worker can record it (app.sweeper) for the stream to be billed even if the worker dies.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from app.catalog.registry import Model
from app.providers.base import ChatRequest, Chunk, Usage


class Meter(Protocol):
    """What a stream's settlement and its recorded progress need of the stream's meter."""

    usage: Usage | None
    complete: bool
    finish_reason: str | None
    # Whether the upstream said in the stream itself that the generation failed.
    failed: bool

    @property
    def delivered_since_counted(self) -> bool:
        """Whether anything was delivered since the delivered tokens were last counted."""

    def usage_so_far(self) -> Usage:
        """Return the usage of what was delivered until now (estimated)."""

    def final_usage(self) -> Usage:
        """Return the usage to bill: the upstream's at the end, else what was delivered."""


class RelayMeter(Meter, Protocol):
    """A meter of a stream passed through in its door's wire format: it reads the bytes."""

    def observe(self, data: bytes) -> bool:
        """Read one upstream read's bytes; return whether they carried generated output."""


@dataclass(frozen=True)
class Outcome:
    """What a whole answer passed through came to, as its door reads it."""

    usage: Usage
    finish_reason: str | None = None
    # Whether the upstream's answer itself says that the generation failed.
    failed: bool = False


class Metered(Protocol):
    """What a meter needs of the generation it counts (app.generations.lifecycle)."""

    model: Model
    request: ChatRequest
    prompt_tokens: int
    prompt_tokens_exact: bool


class DeliveryMeter:
    """Counts what one stream delivered, as it goes: the text a door hands it (``deliver``).

    Tokens are counted as the generation's first route counts them; the generation's
    ``prompt_tokens`` is the count its hold was placed with, an upper bound unless
    ``prompt_tokens_exact``. A door's meter reads its stream's pieces and delivers their
    text here.
    """

    def __init__(self, generation: Metered) -> None:
        self.route = generation.model.routes[0]
        self.request = generation.request
        self.usage: Usage | None = None
        self.complete = False
        self.finish_reason: str | None = None
        self.failed = False
        # Delivered text not counted yet; then what the counted pieces came to.
        self._pieces: list[str] = []
        self._delivered_tokens = 0
        self._prompt_tokens = generation.prompt_tokens
        self._prompt_exact = generation.prompt_tokens_exact

    def deliver(self, text: str) -> None:
        """Remember a piece of generated text that went out, to count if it must be."""
        self._pieces.append(text)

    @property
    def delivered_since_counted(self) -> bool:
        """Whether text was delivered since the delivered tokens were last counted."""
        return bool(self._pieces)

    def final_usage(self) -> Usage:
        """Return the usage to bill: the upstream's at the end, else what was delivered."""
        if self.complete and self.usage is not None:
            return self.usage
        return self.usage_so_far()

    def answer_usage(self) -> Usage:
        """Return the usage of a whole answer whose upstream reported none (estimated).

        The upstream answered: it read the whole prompt, as the hold counted it, and
        generated what it delivered, counted here.
        """
        delivered = self._count_delivered()
        return Usage(prompt_tokens=self._prompt_tokens, completion_tokens=delivered, estimated=True)

    def usage_so_far(self) -> Usage:
        """Return the usage of what was delivered until now (estimated).

        The delivered text is counted here, with the upstream's own prompt count when it
        sent one before the end (Anthropic does, at message_start), else the hold's
        estimate, counted exactly once if the hold used only a bound. Nothing delivered,
        nothing billed.
        """
        delivered = self._count_delivered()
        if delivered == 0:
            return Usage()
        if self.usage is not None:
            completion = max(self.usage.completion_tokens, delivered)
            return replace(self.usage, completion_tokens=completion, estimated=True)
        return Usage(prompt_tokens=self._prompt_tokens, completion_tokens=delivered, estimated=True)

    def _count_delivered(self) -> int:
        adapter, target = self.route.adapter, self.route.target
        # Each delta is counted alone: joined, neighbouring pieces could merge into fewer
        # tokens than were generated.
        for piece in self._pieces:
            self._delivered_tokens += adapter.count_text_tokens(piece, target)
        self._pieces.clear()
        return self._delivered_tokens


class StreamMeter(DeliveryMeter):
    """Counts what a stream of the core's normalized chunks delivered."""

    def observe(self, chunk: Chunk) -> None:
        """Remember the generated text and finish reason of a delivered chunk."""
        pieces = self._pieces
        for choice in chunk.choices:
            delta = choice.get("delta") or {}
            # Written out, not looped over the two keys: this runs for every chunk.
            if text := delta.get("content"):
                pieces.append(text)
            if text := delta.get("reasoning"):
                pieces.append(text)
            if "tool_calls" in delta:
                self._observe_calls(delta["tool_calls"] or ())
            if self.finish_reason is None and choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def _observe_calls(self, calls: list[dict[str, Any]]) -> None:
        for call in calls:
            function = call.get("function") or {}
            self._pieces.extend(filter(None, (function.get("name"), function.get("arguments"))))
