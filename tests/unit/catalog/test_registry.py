from decimal import Decimal

import pytest

from app.catalog.errors import CatalogError, UnknownModel
from app.catalog.registry import build_catalog, load_catalog


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
