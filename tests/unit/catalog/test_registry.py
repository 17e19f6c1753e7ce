import tomllib
from decimal import Decimal
from pathlib import Path

import pytest

from app.catalog.errors import CatalogError, UnknownModel
from app.catalog.registry import build_catalog, load_catalog
from app.providers.errors import UpstreamMisconfigured


def model(**overrides):
    entry = {
        "id": "m",
        "pricing": {"prompt": Decimal("0.1"), "completion": Decimal("0.2")},
        "routes": [{"upstream": "builtin"}],
    }
    entry.update(overrides)
    return entry


def test_prices_default_cached_read_and_image_to_the_prompt_price():
    catalog = build_catalog({"models": [model()]})
    pricing = catalog.resolve("m").pricing
    assert pricing.cached_read == Decimal("0.1") and pricing.image == Decimal("0.1")


def test_disabled_and_routeless_models_are_not_served():
    catalog = build_catalog(
        {"models": [model(id="off", enabled=False), model(id="nowhere", routes=[]), model()]}
    )
    assert [m.id for m in catalog.list()] == ["m"]
    with pytest.raises(UnknownModel):
        catalog.resolve("off")


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"models": [model(pricing={"prompt": Decimal(1)})]}, "pricing.completion is required"),
        ({"models": [model(pricing=None)]}, "pricing is required"),
        ({"models": [model(routes=[{"upstream": "nope"}])]}, "unknown upstream 'nope'"),
        ({"models": [model(id="acme/m")]}, "bare model id"),
        ({"models": [model(capabilities=["telepathy"])]}, "unknown capabilities"),
        ({"models": [model(), model()]}, "listed twice"),
        ({"models": [model(max_output_tokens=0)]}, "max_output_tokens must be a positive integer"),
        ({"upstreams": {"x": {"kind": "carrier-pigeon"}}}, "upstreams.x: kind must be one of"),
        ({"upstreams": {"x": {"kind": "openai"}}}, "upstreams.x"),
        (
            {"models": [model(pricing={"prompt": Decimal(-1), "completion": Decimal(1)})]},
            "pricing.prompt must be a non-negative number",
        ),
    ],
)
def test_invalid_catalogs_name_the_entry_and_the_problem(document, problem):
    with pytest.raises(CatalogError, match=problem.replace("(", r"\(")):
        build_catalog(document, "cat.toml")


def test_hour_long_cache_writes_default_to_the_five_minute_price_which_defaults_to_the_prompt():
    plain = build_catalog({"models": [model()]}).resolve("m").pricing
    written = (
        build_catalog(
            {
                "models": [
                    model(pricing={"prompt": 3, "completion": 15, "cache_write": Decimal("3.75")})
                ]
            }
        )
        .resolve("m")
        .pricing
    )
    assert (plain.cache_write, plain.cache_write_1h) == (Decimal("0.1"), Decimal("0.1"))
    assert (written.cache_write, written.cache_write_1h) == (Decimal("3.75"), Decimal("3.75"))
    assert (plain.tool_calls, plain.tiers) == ({}, {})


def test_tool_call_and_tier_prices_parse_exactly_from_toml(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text(
        '[[models]]\nid = "m"\nroutes = [{ upstream = "builtin" }]\n'
        "[models.pricing]\nprompt = 3\ncompletion = 15\ncache_write_1h = 6.0\n"
        "tool_calls = { web_search = 0.01, code_interpreter = 0.03 }\n"
        "tiers = { priority = 2.0, flex = 0.5 }\n"
    )
    pricing = load_catalog(path).resolve("m").pricing
    assert pricing.cache_write_1h == Decimal(6)
    assert pricing.tool_calls == {
        "web_search": Decimal("0.01"),
        "code_interpreter": Decimal("0.03"),
    }
    assert pricing.tiers == {"priority": Decimal(2), "flex": Decimal("0.5")}
    assert pricing.tier_multiplier("priority") == 2 and pricing.tier_multiplier("auto") == 1
    assert pricing.tier_multiplier("scale") is None


def priced(**extra):
    return model(pricing={"prompt": Decimal(1), "completion": Decimal(1), **extra})


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        (
            priced(cache_write_1h=Decimal(-2)),
            "pricing.cache_write_1h must be a non-negative number",
        ),
        (priced(cache_write_1h="6"), "pricing.cache_write_1h must be a non-negative number"),
        (priced(tool_calls=Decimal("0.01")), "pricing.tool_calls must be a table"),
        (priced(tool_calls={"web_serach": 1}), "pricing.tool_calls names unknown tools"),
        (priced(tool_calls={"web_search": True}), "pricing.tool_calls.web_search must be a non"),
        (priced(tool_calls={"web_search": -1}), "pricing.tool_calls.web_search must be a non"),
        (priced(tiers=["priority"]), "pricing.tiers must be a table"),
        (priced(tiers={"priority": 0}), "pricing.tiers.priority must be a positive number"),
        (priced(tiers={"flex": "half"}), "pricing.tiers.flex must be a non-negative number"),
    ],
)
def test_malformed_tool_and_tier_prices_name_the_entry_and_the_problem(entry, problem):
    with pytest.raises(CatalogError, match=f"cat.toml: models\\[0\\] \\(m\\): {problem}"):
        build_catalog({"models": [entry]}, "cat.toml")


def test_unparseable_file_names_the_file(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text("[[models]\nid = ")
    with pytest.raises(CatalogError, match="models.toml: is not valid TOML"):
        load_catalog(path)


def test_prices_parse_exactly_from_toml(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text(
        '[[models]]\nid = "m"\npricing = { prompt = 0.1, completion = 0.3 }\n'
        'routes = [{ upstream = "builtin" }]\n'
    )
    assert load_catalog(path).resolve("m").pricing.completion == Decimal("0.3")


def test_the_default_catalog_loads():
    catalog = load_catalog("config/models.toml")
    assert {"dev-chat", "dev-chat-mini"} <= set(catalog.models)


def test_the_example_catalog_of_real_upstreams_loads_without_their_keys(monkeypatch):
    path = Path("config/models.example.toml")
    upstreams = tomllib.loads(path.read_text())["upstreams"]
    for entry in upstreams.values():
        if "api_key_env" in entry:
            monkeypatch.delenv(entry["api_key_env"], raising=False)

    catalog = load_catalog(path)

    adapters = {
        route.adapter.upstream.name: route.adapter for m in catalog.list() for route in m.routes
    }
    assert {adapter.kind for adapter in adapters.values()} == {"openai", "anthropic", "gemini"}
    assert set(adapters) == set(upstreams)
    assert any(len(model.routes) > 1 for model in catalog.list())
    with pytest.raises(UpstreamMisconfigured):
        adapters["anthropic"].api_key()
    assert adapters["gpu-llamacpp"].api_key() is None


def http_upstream(**entry):
    return {
        "upstreams": {"up": {"kind": "openai", "base_url": "http://10.0.0.5:8000/v1", **entry}},
        "models": [model(routes=[{"upstream": "up", "model": "upstream-name"}])],
    }


def test_http_upstreams_take_their_options_and_the_model_its_upstream_name():
    catalog = build_catalog(
        http_upstream(
            api_key_env="K", read_timeout=60, retries=0, tokenizer="o200k_base", pool_size=8
        )
    )

    route = catalog.resolve("m").routes[0]
    assert route.target.upstream_model == "upstream-name"
    adapter = route.adapter
    assert (adapter.timeout, adapter.upstream.retries, adapter.tokenizer) == (
        (3.0, 60.0),
        0,
        "o200k_base",
    )


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        (
            http_upstream(base_url="10.0.0.5:8000/v1"),
            "upstreams.up: base_url is required, as an http",
        ),
        (http_upstream(tokenizer="gpt2"), "upstreams.up: tokenizer must be one of"),
        (http_upstream(pool_size=0), "upstreams.up: pool_size must be a positive integer"),
        (
            {"models": [model(tokenizer="llama3")]},
            r"models\[0\] \(m\): routes\[0\]: tokenizer must be one of",
        ),
    ],
)
def test_invalid_upstream_options_name_the_entry_and_the_key(document, problem):
    with pytest.raises(CatalogError, match=problem):
        build_catalog(document, "cat.toml")


def test_default_reasoning_effort_applies_only_when_the_caller_sends_none():
    from app.providers.base import ChatRequest

    catalog = build_catalog({"models": [model(default_reasoning_effort="none"), model(id="n")]})
    quiet, plain = catalog.resolve("m"), catalog.resolve("n")
    unset = ChatRequest(model="m", messages=[], params={"max_tokens": 5})
    chosen = ChatRequest(model="m", messages=[], params={"reasoning_effort": "high"})

    assert quiet.with_defaults(unset).params == {"max_tokens": 5, "reasoning_effort": "none"}
    assert unset.params == {"max_tokens": 5}
    assert quiet.with_defaults(chosen) is chosen
    assert plain.with_defaults(unset) is unset


def test_default_reasoning_effort_must_be_an_effort():
    with pytest.raises(CatalogError, match=r"models\[0\] \(m\): default_reasoning_effort must"):
        build_catalog({"models": [model(default_reasoning_effort="max")]}, "cat.toml")


def test_the_built_in_models_do_not_reason_unless_asked():
    root = Path(__file__).resolve().parents[3]
    for path in ("config/models.toml", "tests/fixtures/models.toml"):
        catalog = load_catalog(root / path)
        for model_id in ("dev-chat", "dev-chat-mini"):
            assert catalog.resolve(model_id).default_reasoning_effort == "none", (path, model_id)


def test_a_route_may_pass_the_responses_api_through_to_an_openai_compatible_upstream():
    catalog = build_catalog(
        {
            "upstreams": {"openai": {"kind": "openai", "base_url": "https://api.example/v1"}},
            "models": [
                {
                    "id": "m",
                    "pricing": {"prompt": 1, "completion": 2},
                    "routes": [{"upstream": "openai", "model": "gpt-x", "api": "responses"}],
                }
            ],
        }
    )

    route = catalog.models["m"].routes[0]
    assert route.target.api == "responses"
    assert route.speaks("responses") and not route.speaks("messages")


@pytest.mark.parametrize(("upstream", "kind"), [("builtin", None), ("up", "anthropic")])
def test_a_route_may_not_pass_through_what_its_upstream_does_not_speak(upstream, kind):
    upstreams = {} if kind is None else {"up": {"kind": kind, "base_url": "https://a.example"}}
    document = {
        "upstreams": upstreams,
        "models": [
            {
                "id": "m",
                "pricing": {"prompt": 1, "completion": 2},
                "routes": [{"upstream": upstream, "api": "responses"}],
            }
        ],
    }

    with pytest.raises(CatalogError, match=r"routes\[0\]: api must be one of"):
        build_catalog(document)


def gemini_document(api=None, kind="gemini", **upstream):
    route = {"upstream": "google", "model": "gemini-2.5-flash"}
    if api is not None:
        route["api"] = api
    return {
        "upstreams": {"google": {"kind": kind, "api_key_env": "GEMINI_API_KEY", **upstream}},
        "models": [{"id": "m", "pricing": {"prompt": 1, "completion": 2}, "routes": [route]}],
    }


def test_a_gemini_upstream_is_googles_api_unless_its_base_url_says_otherwise():
    default = build_catalog(gemini_document()).models["m"].routes[0]
    own = build_catalog(gemini_document(base_url="http://10.0.0.9:8080/")).models["m"].routes[0]

    assert default.adapter.upstream.base_url == "https://generativelanguage.googleapis.com"
    assert own.adapter.upstream.base_url == "http://10.0.0.9:8080/"
    # Requests from any door are translated, unless the route passes Gemini's through.
    assert not default.speaks("gemini") and not default.speaks("messages")


def test_a_route_of_a_gemini_upstream_may_pass_the_gemini_api_through():
    route = build_catalog(gemini_document(api="gemini")).models["m"].routes[0]

    assert route.target.api == "gemini" and route.speaks("gemini")


@pytest.mark.parametrize(
    ("kind", "api", "allowed"),
    [
        ("openai", "gemini", "responses"),
        ("anthropic", "gemini", "none for an upstream of kind anthropic"),
        ("gemini", "responses", "gemini"),
    ],
)
def test_api_gemini_is_refused_on_other_kinds_with_one_line(kind, api, allowed):
    document = gemini_document(api=api, kind=kind, base_url="https://a.example")

    with pytest.raises(CatalogError) as caught:
        build_catalog(document, "cat.toml")

    message = str(caught.value)
    assert message == f"cat.toml: models[0] (m): routes[0]: api must be one of: {allowed}"
    assert "\n" not in message
