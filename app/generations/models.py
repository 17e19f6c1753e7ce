"""The record of every generation: what was asked, produced, and charged."""

from __future__ import annotations

from sqlalchemy import JSON, ForeignKey, Index, Integer, LargeBinary, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.database import Money, UTCDateTime, utcnow
from app.extensions import db

# How a generation ended: answered; failed before producing anything; its caller went
# away; its worker stopped while it streamed, billed from its last recorded progress.
COMPLETED, FAILED, CANCELLED, INTERRUPTED = "completed", "failed", "cancelled", "interrupted"
# The front doors a generation can come in by: Chat Completions, Responses, Messages,
# Gemini, Embeddings.
CHAT, RESPONSES, MESSAGES, GEMINI, EMBEDDINGS = (
    "chat",
    "responses",
    "messages",
    "gemini",
    "embeddings",
)


class Generation(db.Model):
    """One chat completion, written once, in the transaction that charges it.

    ``api_key_id`` names the key used; a deleted key keeps its row (state ``deleted``), so
    the record keeps it too.
    ``estimated`` marks token counts the gateway had to count itself.
    """

    __tablename__ = "generations"
    # Every query by time names the account, or the key (indexed below).
    __table_args__ = (Index("ix_generations_account_id_created_at", "account_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    api_key_id: Mapped[int | None] = mapped_column(
        ForeignKey("api_keys.id", ondelete="SET NULL"), index=True
    )
    model: Mapped[str] = mapped_column(String(200))
    # The wire protocol the request came in by: chat, responses, messages, gemini or embeddings.
    api: Mapped[str] = mapped_column(String(16), default=CHAT, server_default=CHAT)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0)
    prompt_image_tokens: Mapped[int] = mapped_column(Integer, default=0)
    reasoning_tokens: Mapped[int] = mapped_column(Integer, default=0)
    # Prompt tokens written to the upstream's prompt cache (part of prompt_tokens).
    cache_write_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Of them, the tokens written with a 1-hour TTL (the rest had 5 minutes).
    cache_write_1h_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    cost = mapped_column(Money, nullable=False, default=0)
    # What the usage priced at beyond what could be charged (the balance or the key's
    # monthly limit ran out); cost + shortfall is always the usage's price.
    shortfall = mapped_column(Money, nullable=False, default=0, server_default="0")
    # The catalog's prices (USD per million tokens) when the generation ran, so that an
    # audit can re-price it exactly after the catalog has changed.
    price_prompt = mapped_column(Money, nullable=False, default=0)
    price_completion = mapped_column(Money, nullable=False, default=0)
    price_cached_read = mapped_column(Money, nullable=False, default=0)
    price_image = mapped_column(Money, nullable=False, default=0)
    price_cache_write = mapped_column(Money, nullable=False, default=0, server_default="0")
    price_cache_write_1h = mapped_column(Money, nullable=False, default=0, server_default="0")
    # The hosted tools' calls the upstream reported, each with its price per call when it
    # ran: {"web_search": {"calls": 2, "price": "0.01"}}; none when no priced tool was called.
    # SQL NULL, not JSON null: the audit re-prices in Python only the rows that have some.
    tool_calls = mapped_column(JSON(none_as_null=True), nullable=True)
    # The service tier it was priced in, and that tier's multiplier of every price.
    service_tier: Mapped[str | None] = mapped_column(String(32))
    tier_multiplier = mapped_column(Money, nullable=False, default=1, server_default=str(10**10))
    status: Mapped[str] = mapped_column(String(16))
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    streamed: Mapped[bool] = mapped_column(default=False)
    estimated: Mapped[bool] = mapped_column(default=False)
    latency_ms: Mapped[int] = mapped_column(Integer, default=0)
    created_at = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    # The X-Request-Id of the request that ran it, to find its log lines.
    request_id: Mapped[str | None] = mapped_column(String(128))
    time_to_first_token_ms: Mapped[int | None] = mapped_column(Integer)
    # Each upstream call: [{"upstream", "outcome", "duration_ms"}], in order.
    upstream_attempts = mapped_column(JSON, nullable=True)


class IdempotentRequest(db.Model):
    """A caller's ``Idempotency-Key``: the request it was first used for, and its answer.

    The row is claimed before the request runs (``response`` empty) and completed with
    the response body of a whole answer; a retry with the same key and body gets that
    body back instead of a second generation and a second charge.
    """

    __tablename__ = "idempotent_requests"
    __table_args__ = (UniqueConstraint("account_id", "key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    key: Mapped[str] = mapped_column(String(255))
    body_digest: Mapped[str] = mapped_column(String(64))
    # The generation the request runs as: its hold and its record carry this id.
    generation_id: Mapped[str | None] = mapped_column(String(64))
    streamed: Mapped[bool] = mapped_column(default=False)
    response = mapped_column(LargeBinary, nullable=True)
    created_at = mapped_column(UTCDateTime, nullable=False, default=utcnow, index=True)


class AuditCheckpoint(db.Model):
    """How far ``flask ledger audit`` found an account's books clean, to start from next time.

    The ledger up to entry ``ledger_entry_id`` summed to ``ledger_sum``; generations
    recorded from ``checked_until`` on, and the usage rollups of its hour and after, are
    the ones the next audit checks.
    """

    __tablename__ = "audit_checkpoints"

    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    ledger_entry_id: Mapped[int] = mapped_column(Integer, nullable=False)
    ledger_sum = mapped_column(Money, nullable=False)
    checked_until = mapped_column(UTCDateTime, nullable=False)
    checked_at = mapped_column(UTCDateTime, nullable=False)


class GenerationRetention(db.Model):
    """The one row saying how far raw generations were pruned (GENERATION_RETENTION_DAYS).

    ``pruned_before`` is moved before any row is deleted, so that every generation
    recorded since is still there: the hours from then on are the ones whose usage
    rollups can be checked against, or rebuilt from, their generations.
    ``swept_before`` is moved once every generation before it is gone, so that the next
    pruning looks only at what came after.
    """

    __tablename__ = "generation_retention"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pruned_before = mapped_column(UTCDateTime, nullable=True)
    swept_before = mapped_column(UTCDateTime, nullable=True)
