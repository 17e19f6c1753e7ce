"""A simulated upstream: every chunk, usage figure and failure is the simulator's choice.

The adapter knows nothing of time or scheduling: the simulator decides when each chunk is
pulled by advancing the gateway's generator, and what the upstream will do by writing the
request's ``UpstreamScript`` before the request starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from app.providers.base import (
    Adapter,
    ChatRequest,
    Chunk,
    Completion,
    RouteTarget,
    UpstreamConfig,
    Usage,
)
from app.providers.errors import UpstreamError, UpstreamTimeout

SCRIPT_FIELD = "simulation_request"
WORD = "tok"


@dataclass
class UpstreamScript:
    """What the upstream will do for one request.

    ``chunk_tokens`` are the content chunks in order (tokens each); ``reported`` is the
    usage sent after the last one (None: the upstream sends none); ``early_prompt`` is a
    prompt count sent with the first chunk, as Anthropic's ``message_start`` does;
    ``fail_before`` is the chunk index before which the upstream fails (the number of
    chunks: after the content, before the usage).
    """

    prompt_estimate: int
    chunk_tokens: list[int] = field(default_factory=list)
    reported: Usage | None = None
    early_prompt: int | None = None
    fail_before: int | None = None
    # Set by the simulator when the upstream has been silent for longer than its read
    # timeout: the next read fails, as it would through ``requests``.
    timed_out: bool = False

    @property
    def prompt_bound(self) -> int:
        """The bound of the prompt's tokens the gateway sizes a hold by before it counts."""
        return 2 * self.prompt_estimate

    @property
    def completion_tokens(self) -> int:
        """Every token of content the upstream would deliver if nothing failed."""
        return sum(self.chunk_tokens)


def words(tokens: int) -> str:
    """Text of exactly ``tokens`` tokens, as this upstream counts them."""
    return " ".join([WORD] * tokens)


class SimulatedAdapter(Adapter):
    """An upstream that plays each request's script."""

    kind = "simulated"

    def __init__(self) -> None:
        super().__init__(UpstreamConfig(name="simulated", kind=self.kind, retries=0))
        self.scripts: dict[int, UpstreamScript] = {}

    def script_for(self, request: ChatRequest) -> UpstreamScript:
        """The script of the simulated request ``request`` carries."""
        return self.scripts[request.extra[SCRIPT_FIELD]]

    def count_prompt_tokens(
        self, request: ChatRequest, target: RouteTarget, *, limit: int | None = None
    ) -> int:
        """The gateway's count of the prompt, as the script says (whatever ``limit``)."""
        return self.script_for(request).prompt_estimate

    def prompt_token_bound(self, request: ChatRequest, target: RouteTarget) -> int:
        """A bound above the count, as a prompt's size in bytes is: a short balance recounts."""
        return self.script_for(request).prompt_bound

    def count_text_tokens(self, text: str, target: RouteTarget) -> int:
        """One token per word."""
        return len(text.split())

    def complete(self, request: ChatRequest, target: RouteTarget) -> Completion:
        """Answer whole, or fail; without reported usage the adapter counts, as real ones do."""
        script = self.script_for(request)
        if script.timed_out:
            raise UpstreamTimeout()
        if script.fail_before is not None:
            raise UpstreamError("The simulated upstream failed.")
        usage = script.reported or Usage()
        if script.reported is None and script.completion_tokens:
            usage = Usage(
                prompt_tokens=script.prompt_estimate,
                completion_tokens=script.completion_tokens,
                estimated=True,
            )
        message = {"role": "assistant", "content": words(script.completion_tokens)}
        choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
        return Completion(choices=[choice], usage=usage)

    def stream(self, request: ChatRequest, target: RouteTarget) -> Iterator[Chunk]:
        """Yield the script's chunks, failing where it says, usage last."""
        script = self.script_for(request)
        last = len(script.chunk_tokens) - 1
        for index, tokens in enumerate(script.chunk_tokens):
            if script.timed_out:
                raise UpstreamTimeout()
            if index == script.fail_before:
                raise UpstreamError("The simulated upstream broke off.")
            early = script.early_prompt if index == 0 else None
            delta = {"index": 0, "delta": {"content": words(tokens)}}
            delta["finish_reason"] = "stop" if index == last else None
            yield Chunk(
                choices=[delta],
                usage=None if early is None else Usage(prompt_tokens=early),
            )
        if script.timed_out:
            raise UpstreamTimeout()
        if script.fail_before == len(script.chunk_tokens):
            raise UpstreamError("The simulated upstream broke off before its usage.")
        if script.reported is not None:
            yield Chunk(choices=[], usage=script.reported)
