"""What a stream delivered: the upstream's usage as it arrives, and the text itself.

A stream is billed from the upstream's usage when it reaches its end, and otherwise
from what it delivered, counted here. The count is kept as the stream goes, so that the
worker can record it (app.sweeper) for the stream to be billed even if the worker dies.

An estimate never counts less than was sent and delivered: the prompt as the hold
counted it (an upper bound, unless the prompt had to be tokenized to fit), the delivered
text by the route's tokenizer rounded up, and the upstream's own usage wherever it came
before the estimate is taken (a stream's worker killed as it ended is billed at it).

What a worker delivered since it last recorded its progress is lost with it, so a
dead worker's stream is billed from its progress only once the upstream had ended the
generation (``ended``): nothing can have been delivered since. Before that, it is billed
at the most the request could produce (app.generations.lifecycle.settle_interrupted).
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
    # Whether the upstream ended the generation: no more output can follow.
    ended: bool

    @property
    def changed_since_counted(self) -> bool:
        """Whether text was delivered, or usage came, since the usage was last estimated."""

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


class DeliveryMeter:
    """Counts what one stream delivered, as it goes: the text a door hands it (``deliver``).

    Tokens are counted as the generation's first route counts them; the generation's
    ``prompt_tokens`` is the count its hold was placed with. A door's meter reads its
    stream's pieces and delivers their text here, and keeps the upstream's usage in
    ``usage`` as it comes.
    """

    def __init__(self, generation: Metered) -> None:
        self.route = generation.model.routes[0]
        self._usage: Usage | None = None
        self._usage_changed = False
        self.complete = False
        self.finish_reason: str | None = None
        self.failed = False
        self.ended = False
        # Delivered text not counted yet; then what the counted pieces came to.
        self._pieces: list[str] = []
        self._delivered_tokens = 0
        self._prompt_tokens = generation.prompt_tokens

    @property
    def usage(self) -> Usage | None:
        """The usage the upstream reported so far (complete once the stream ended)."""
        return self._usage

    @usage.setter
    def usage(self, usage: Usage | None) -> None:
        if usage != self._usage:
            self._usage, self._usage_changed = usage, True

    def end_generation(self) -> None:
        """Note that the upstream ended the generation; its progress is recorded again."""
        if not self.ended:
            self.ended = self._usage_changed = True

    def deliver(self, text: str) -> None:
        """Remember a piece of generated text that went out, to count if it must be."""
        self._pieces.append(text)

    @property
    def changed_since_counted(self) -> bool:
        """Whether text was delivered, or usage came, since the usage was last estimated."""
        return bool(self._pieces) or self._usage_changed

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

        The upstream's usage, where it sent one before the end (Anthropic does, at
        message_start; OpenAI's last chunk does), its output never below the delivered
        text's count; else the hold's prompt count and the delivered text's. Nothing
        delivered, nothing billed.
        """
        self._usage_changed = False
        delivered = self._count_delivered()
        if delivered == 0:
            return Usage()
        if self.usage is not None:
            completion = max(self.usage.completion_tokens, delivered)
            return replace(self.usage, completion_tokens=completion, estimated=True)
        return Usage(prompt_tokens=self._prompt_tokens, completion_tokens=delivered, estimated=True)

    def _count_delivered(self) -> int:
        adapter, target = self.route.adapter, self.route.target
        # Each delta is counted alone, rounded up: joined, neighbouring pieces could merge
        # into fewer tokens than were generated, and every delta carried one at least.
        for piece in self._pieces:
            self._delivered_tokens += adapter.count_text_tokens(piece, target)
        self._pieces.clear()
        return self._delivered_tokens


class StreamMeter(DeliveryMeter):
    """Counts what a stream of the core's normalized chunks delivered."""

    def __init__(self, generation: Metered) -> None:
        super().__init__(generation)
        self._choices = generation.request.choice_count
        # The choices the upstream finished: the generation ended once all of them were.
        self._finished: set[Any] = set()

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
            if choice.get("finish_reason"):
                self._finish(choice)

    def _finish(self, choice: dict[str, Any]) -> None:
        if self.finish_reason is None:
            self.finish_reason = choice["finish_reason"]
        self._finished.add(choice.get("index", 0))
        if len(self._finished) >= self._choices:
            self.end_generation()

    def _observe_calls(self, calls: list[dict[str, Any]]) -> None:
        for call in calls:
            function = call.get("function") or {}
            self._pieces.extend(filter(None, (function.get("name"), function.get("arguments"))))
