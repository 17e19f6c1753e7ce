"""Load the TOML catalog once at start, validate it whole, and resolve bare model ids."""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from flask import Flask, current_app

from app.catalog.errors import CatalogError, ModelNotPermitted, UnknownModel, WrongModelType
from app.catalog.pricing import PRICED_TOOLS, Pricing
from app.providers import ADAPTERS
from app.providers.base import (
    REASONING_EFFORTS,
    Adapter,
    ChatRequest,
    Route,
    RouteTarget,
    UpstreamConfig,
)
from app.providers.cooldown import cooldown_policy
from app.providers.tokens import encoding_names

CAPABILITIES = frozenset({"tools", "json_schema", "reasoning", "vision"})
# What a model is for: chat (every generating door) or embedding (POST /v1/embeddings).
CHAT_MODEL, EMBEDDING_MODEL = "chat", "embedding"
MODEL_TYPES = (CHAT_MODEL, EMBEDDING_MODEL)
# An embedding model's capabilities: ``dimensions``, it takes the request's vector size.
EMBEDDING_CAPABILITIES = frozenset({"dimensions"})
BUILTIN_UPSTREAM = "builtin"
DEFAULT_CREATED = 1_700_000_000
URL_SCHEMES = ("http://", "https://")
# The protocols a route of each upstream kind may pass requests through in (``api``):
# OpenAI's Responses API to an OpenAI-compatible upstream that serves /v1/responses, the
# Gemini door's requests to Google's Gemini API.
PASSED_THROUGH = {"openai": ("responses",), "gemini": ("gemini",)}
UPSTREAM_KEYS = frozenset(
    {"kind", "base_url", "api_key_env", "connect_timeout", "read_timeout", "retries"}
)


@dataclass(frozen=True)
class Model:
    """A catalog entry as callers see it, with the routes that serve it."""

    id: str
    owned_by: str
    context_length: int
    max_output_tokens: int
    capabilities: frozenset[str]
    pricing: Pricing
    routes: tuple[Route, ...]
    created: int = DEFAULT_CREATED
    default_reasoning_effort: str | None = None
    type: str = CHAT_MODEL
    aliases: tuple[str, ...] = ()

    def with_defaults(self, request: ChatRequest) -> ChatRequest:
        """Return ``request`` with the model's defaults for the fields the caller left out."""
        if self.default_reasoning_effort is None or "reasoning_effort" in request.params:
            return request
        params = {**request.params, "reasoning_effort": self.default_reasoning_effort}
        return replace(request, params=params)

    def to_dict(self) -> dict[str, Any]:
        """Render as an entry of GET /v1/models (an embedding model generates no output)."""
        entry = {
            "id": self.id,
            "object": "model",
            "created": self.created,
            "owned_by": self.owned_by,
            "type": self.type,
            "context_length": self.context_length,
            "max_output_tokens": self.max_output_tokens,
            "capabilities": sorted(self.capabilities),
            "pricing": self.pricing.to_dict(),
        }
        if self.type == EMBEDDING_MODEL:
            del entry["max_output_tokens"]
        return entry


def _every_model(model_id: str) -> bool:
    return True


@dataclass
class Catalog:
    """The enabled, routable models by id."""

    path: str
    models: dict[str, Model] = field(default_factory=dict)
    # Every name a model is served under: its id and its aliases.
    names: dict[str, Model] = field(default_factory=dict)

    def resolve(
        self,
        model_id: str,
        *,
        may_use: Callable[[str], bool] = _every_model,
        model_type: str = CHAT_MODEL,
    ) -> Model:
        """Return the model served under ``model_id`` (or an alias) if ``may_use`` permits it.

        :raise UnknownModel: no model is served under ``model_id`` (400).
        :raise ModelNotPermitted: the caller may not use it (403).
        :raise WrongModelType: it is not a model of ``model_type`` (400).
        """
        model = self.names.get(model_id) if isinstance(model_id, str) else None
        if model is None:
            raise UnknownModel(model_id)
        if not may_use(model.id):
            raise ModelNotPermitted(model_id)
        if model.type != model_type:
            raise WrongModelType(model_id, model.type)
        return model

    def named(self, model_id: str) -> Model | None:
        """Return the model served under ``model_id`` (its id or an alias), if any."""
        return self.names.get(model_id)

    def list(self, *, may_use: Callable[[str], bool] = _every_model) -> list[Model]:
        """Every served model that ``may_use`` permits, in catalog order."""
        return [model for model in self.models.values() if may_use(model.id)]


def load_catalog(path: str | Path) -> Catalog:
    """Parse and validate the catalog at ``path``; raise CatalogError naming what is wrong."""
    path = str(path)
    try:
        with open(path, "rb") as file:
            document = tomllib.load(file, parse_float=Decimal)
    except OSError as exc:
        raise CatalogError(f"{path}: cannot be read ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{path}: is not valid TOML ({exc})") from None
    return build_catalog(document, path)


def build_catalog(document: Mapping[str, Any], path: str = "<catalog>") -> Catalog:
    """Build a Catalog from a parsed TOML document."""
    adapters = _build_adapters(document.get("upstreams", {}), path)
    catalog = Catalog(path=path)
    for index, entry in enumerate(document.get("models", [])):
        where = f"{path}: models[{index}]" + (f" ({entry['id']})" if "id" in entry else "")
        model = _build_model(entry, adapters, where)
        if model is None:
            continue
        if model.id in catalog.models:
            raise CatalogError(f"{where}: the id is listed twice")
        for name in (model.id, *model.aliases):
            if name in catalog.names:
                raise CatalogError(f"{where}: the name {name!r} is already a model's id or alias")
            catalog.names[name] = model
        catalog.models[model.id] = model
    return catalog


def _build_adapters(upstreams: Mapping[str, Any], path: str) -> dict[str, Adapter]:
    configs = {BUILTIN_UPSTREAM: UpstreamConfig(name=BUILTIN_UPSTREAM, kind="builtin")}
    for name, entry in upstreams.items():
        where = f"{path}: upstreams.{name}"
        kind = entry.get("kind")
        if kind not in ADAPTERS:
            raise CatalogError(f"{where}: kind must be one of {', '.join(sorted(ADAPTERS))}")
        # Google's API has one address: a gemini upstream may leave it out.
        base_url = entry.get("base_url", ADAPTERS[kind].default_base_url)
        if kind != "builtin" and not str(base_url or "").startswith(URL_SCHEMES):
            raise CatalogError(f"{where}: base_url is required, as an http:// or https:// URL")
        configs[name] = UpstreamConfig(
            name=name,
            kind=kind,
            base_url=base_url,
            api_key_env=entry.get("api_key_env"),
            connect_timeout=float(entry.get("connect_timeout", 3)),
            read_timeout=float(entry.get("read_timeout", 300)),
            retries=int(entry.get("retries", 2)),
            options={key: value for key, value in entry.items() if key not in UPSTREAM_KEYS},
        )
    return {
        name: _build_adapter(config, f"{path}: upstreams.{name}")
        for name, config in configs.items()
    }


def _build_adapter(config: UpstreamConfig, where: str) -> Adapter:
    try:
        cooldown_policy(config)
        return ADAPTERS[config.kind](config)
    except ValueError as exc:
        # Adapters check their own options (pool_size, tokenizer, ...) and name the key.
        raise CatalogError(f"{where}: {exc}") from None


def _build_model(
    entry: Mapping[str, Any], adapters: Mapping[str, Adapter], where: str
) -> Model | None:
    model_id = entry.get("id")
    if not isinstance(model_id, str) or not model_id or "/" in model_id:
        raise CatalogError(f"{where}: id must be a bare model id (no provider prefix)")
    model_type = entry.get("type", CHAT_MODEL)
    if model_type not in MODEL_TYPES:
        raise CatalogError(f"{where}: type must be one of {', '.join(MODEL_TYPES)}")
    capabilities = frozenset(entry.get("capabilities", []))
    allowed = EMBEDDING_CAPABILITIES if model_type == EMBEDDING_MODEL else CAPABILITIES
    if unknown := capabilities - allowed:
        raise CatalogError(
            f"{where}: unknown capabilities {sorted(unknown)} for a {model_type} model"
        )
    max_output = _positive_int(entry, "max_output_tokens", where, default=4096)
    routes = tuple(
        _build_route(route, adapters, capabilities, max_output, entry, f"{where}: routes[{i}]")
        for i, route in enumerate(entry.get("routes", []))
    )
    if model_type == EMBEDDING_MODEL:
        _check_embedding_routes(routes, entry, where)
        pricing = _embedding_pricing(entry.get("pricing"), where)
    else:
        pricing = _build_pricing(entry.get("pricing"), where)
    if not routes or not entry.get("enabled", True):
        return None
    return Model(
        id=model_id,
        owned_by=str(entry.get("owned_by", "system")),
        context_length=_positive_int(entry, "context_length", where, default=8192),
        max_output_tokens=max_output,
        capabilities=capabilities,
        pricing=pricing,
        routes=routes,
        default_reasoning_effort=_reasoning_effort(entry, where),
        type=model_type,
        aliases=_aliases(entry, where),
    )


def _aliases(entry: Mapping[str, Any], where: str) -> tuple[str, ...]:
    aliases = entry.get("aliases", [])
    if not isinstance(aliases, list) or not all(
        isinstance(alias, str) and alias and "/" not in alias for alias in aliases
    ):
        raise CatalogError(f"{where}: aliases must be a list of bare model ids")
    return tuple(aliases)


def _check_embedding_routes(
    routes: tuple[Route, ...], entry: Mapping[str, Any], where: str
) -> None:
    """Refuse an embedding model on an upstream that serves no embeddings, or passed through."""
    for index, route in enumerate(routes):
        if not route.adapter.embeds:
            raise CatalogError(
                f"{where}: routes[{index}]: upstreams of kind {route.adapter.kind} "
                "serve no embedding models"
            )
        if route.target.api is not None:
            raise CatalogError(f"{where}: routes[{index}]: an embedding model takes no api")


def _embedding_pricing(pricing: Any, where: str) -> Pricing:
    """Price an embedding model by ``prompt`` alone: it generates no tokens."""
    if not isinstance(pricing, Mapping) or "prompt" not in pricing:
        raise CatalogError(f"{where}: pricing.prompt is required")
    if others := sorted(set(pricing) - {"prompt"}):
        raise CatalogError(
            f"{where}: an embedding model is priced by prompt alone (found pricing.{others[0]})"
        )
    prompt = _price(pricing["prompt"], f"{where}: pricing.prompt")
    return Pricing(prompt=prompt, completion=Decimal(0), cached_read=prompt, image=prompt)


def _build_route(
    route: Mapping[str, Any],
    adapters: Mapping[str, Adapter],
    capabilities: frozenset[str],
    max_output: int,
    entry: Mapping[str, Any],
    where: str,
) -> Route:
    upstream = route.get("upstream")
    if upstream not in adapters:
        raise CatalogError(f"{where}: unknown upstream {upstream!r}")
    tokenizer = entry.get("tokenizer")
    if tokenizer is not None and tokenizer not in encoding_names():
        raise CatalogError(f"{where}: tokenizer must be one of {', '.join(encoding_names())}")
    api = _route_api(route, adapters[upstream], where)
    target = RouteTarget(
        upstream_model=str(route.get("model") or entry["id"]),
        capabilities=capabilities,
        extra_params=frozenset(entry.get("extra_params", [])),
        max_output_tokens=max_output,
        api=api,
        tokenizer=tokenizer,
    )
    return Route(adapter=adapters[upstream], target=target)


def _route_api(route: Mapping[str, Any], adapter: Adapter, where: str) -> str | None:
    """Return the protocol the route passes requests through in, if it names one it may."""
    api = route.get("api")
    allowed = PASSED_THROUGH.get(adapter.kind, ())
    if api is not None and api not in allowed:
        names = ", ".join(allowed) if allowed else f"none for an upstream of kind {adapter.kind}"
        raise CatalogError(f"{where}: api must be one of: {names}")
    return api


def _build_pricing(pricing: Any, where: str) -> Pricing:
    if not isinstance(pricing, Mapping):
        raise CatalogError(f"{where}: pricing is required")
    for required in ("prompt", "completion"):
        if required not in pricing:
            raise CatalogError(f"{where}: pricing.{required} is required")
    prices = {}
    for kind in ("prompt", "completion", "cached_read", "image", "cache_write", "cache_write_1h"):
        # Each defaults as operations.md says: cache_write_1h to cache_write, the rest to prompt.
        default = prices.get("cache_write") if kind == "cache_write_1h" else pricing["prompt"]
        prices[kind] = _price(pricing.get(kind, default), f"{where}: pricing.{kind}")
    return Pricing(
        **prices,
        tool_calls=_price_table(pricing, "tool_calls", where, names=PRICED_TOOLS),
        tiers=_price_table(pricing, "tiers", where),
    )


def _price(raw: Any, where: str, *, positive: bool = False) -> Decimal:
    if isinstance(raw, bool) or not isinstance(raw, int | Decimal) or raw < 0:
        raise CatalogError(f"{where} must be a non-negative number")
    if positive and raw == 0:
        raise CatalogError(f"{where} must be a positive number")
    return Decimal(raw)


def _price_table(
    pricing: Mapping[str, Any], key: str, where: str, *, names: frozenset[str] | None = None
) -> dict[str, Decimal]:
    """Return ``pricing.tool_calls`` (USD per call) or ``pricing.tiers`` (multipliers)."""
    table = pricing.get(key, {})
    if not isinstance(table, Mapping):
        raise CatalogError(f"{where}: pricing.{key} must be a table, as {{ name = number }}")
    if names is not None and (unknown := set(table) - names):
        raise CatalogError(
            f"{where}: pricing.{key} names unknown tools {sorted(unknown)}; "
            f"the priced tools are {', '.join(sorted(names))}"
        )
    # A tier's multiplier of 0 would serve it free: a typo more likely than a price.
    return {
        name: _price(value, f"{where}: pricing.{key}.{name}", positive=key == "tiers")
        for name, value in table.items()
    }


def _reasoning_effort(entry: Mapping[str, Any], where: str) -> str | None:
    effort = entry.get("default_reasoning_effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise CatalogError(
            f"{where}: default_reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}"
        )
    return effort


def _positive_int(entry: Mapping[str, Any], key: str, where: str, *, default: int) -> int:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CatalogError(f"{where}: {key} must be a positive integer")
    return value


def current_catalog() -> Catalog:
    """Return the catalog the running app loaded at start."""
    # The app itself: an attribute read through the current_app proxy costs several times
    # as much, and every request asks.
    return current_app._get_current_object().extensions["catalog"]


def init_catalog(app: Flask) -> None:
    """Load the app's catalog once, at start; raise CatalogError if it cannot be served."""
    app.extensions["catalog"] = load_catalog(app.config["MODEL_CATALOG"])
