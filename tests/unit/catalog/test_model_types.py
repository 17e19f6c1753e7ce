"""Embedding models in the catalog: their type, their prices, their routes, their aliases."""

from decimal import Decimal

import pytest

from app.catalog.errors import CatalogError, UnknownModel, WrongModelType
from app.catalog.registry import EMBEDDING_MODEL, build_catalog


def embedding(**overrides):
    entry = {
        "id": "e",
        "type": "embedding",
        "pricing": {"prompt": Decimal("0.02")},
        "routes": [{"upstream": "builtin"}],
    }
    entry.update(overrides)
    return entry


def chat(**overrides):
    entry = {
        "id": "c",
        "pricing": {"prompt": Decimal("0.1"), "completion": Decimal("0.2")},
        "routes": [{"upstream": "builtin"}],
    }
    entry.update(overrides)
    return entry


def test_an_embedding_model_is_priced_by_its_prompt_alone_and_listed_with_its_type():
    catalog = build_catalog({"models": [chat(), embedding()]})

    model = catalog.resolve("e", model_type=EMBEDDING_MODEL)

    assert model.pricing.prompt == Decimal("0.02") and model.pricing.completion == 0
    assert model.to_dict()["type"] == "embedding" and "max_output_tokens" not in model.to_dict()
    assert catalog.resolve("c").to_dict()["type"] == "chat"


def test_each_door_refuses_a_model_of_the_other_type_naming_it():
    catalog = build_catalog({"models": [chat(), embedding()]})

    with pytest.raises(WrongModelType, match="'e' is an embedding model"):
        catalog.resolve("e")
    with pytest.raises(WrongModelType, match="'c' is a chat model"):
        catalog.resolve("c", model_type=EMBEDDING_MODEL)


def test_aliases_resolve_to_their_model_and_are_not_listed_twice():
    catalog = build_catalog({"models": [embedding(aliases=["e-latest", "e-v1"])]})

    assert catalog.resolve("e-v1", model_type=EMBEDDING_MODEL).id == "e"
    assert [model.id for model in catalog.list()] == ["e"]
    with pytest.raises(UnknownModel):
        catalog.resolve("e-v2", model_type=EMBEDDING_MODEL)


def test_a_key_limited_to_a_model_may_use_it_by_an_alias():
    catalog = build_catalog({"models": [embedding(aliases=["e-latest"])]})

    model = catalog.resolve(
        "e-latest", may_use=lambda model_id: model_id == "e", model_type="embedding"
    )

    assert model.id == "e"


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"models": [embedding(type="rerank")]}, "type must be one of chat, embedding"),
        (
            {"models": [embedding(pricing={"prompt": 1, "completion": 1})]},
            "priced by prompt alone",
        ),
        ({"models": [embedding(pricing={})]}, "pricing.prompt is required"),
        ({"models": [embedding(capabilities=["tools"])]}, "unknown capabilities"),
        ({"models": [chat(capabilities=["dimensions"])]}, "unknown capabilities"),
        ({"models": [chat(aliases=["x"]), embedding(aliases=["x"])]}, "'x' is already"),
        ({"models": [chat(), embedding(aliases=["c"])]}, "'c' is already"),
        ({"models": [embedding(aliases="e2")]}, "aliases must be a list"),
        (
            {
                "upstreams": {"a": {"kind": "anthropic", "base_url": "https://a.example"}},
                "models": [embedding(routes=[{"upstream": "a"}])],
            },
            "upstreams of kind anthropic serve no embedding models",
        ),
    ],
)
def test_invalid_embedding_entries_name_the_problem(document, problem):
    with pytest.raises(CatalogError, match=problem):
        build_catalog(document, "cat.toml")
