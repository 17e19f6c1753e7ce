import pytest

from app import create_app
from app.catalog.errors import CatalogError
from app.extensions import db
from config.settings import ConfigurationError, normalize_database_url, settings_from_environment


def test_testing_config(app):
    assert app.config["TESTING"]
    assert "dev-chat" in app.extensions["catalog"].models


def test_development_defaults_live_in_the_instance_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("SECRET_KEY", raising=False)
    app = create_app("development", {"MODEL_CATALOG": "config/models.toml"})
    assert app.config["SQLALCHEMY_DATABASE_URI"].startswith("sqlite:///")
    assert app.config["SQLALCHEMY_DATABASE_URI"].endswith("instance/gateway.sqlite3")
    assert len(app.config["SECRET_KEY"]) > 40
    again = create_app("development", {"MODEL_CATALOG": "config/models.toml"})
    assert again.config["SECRET_KEY"] == app.config["SECRET_KEY"]


@pytest.mark.parametrize("missing", ["DATABASE_URL", "SECRET_KEY"])
def test_production_requires_its_secrets(monkeypatch, missing):
    monkeypatch.setenv("DATABASE_URL", "postgresql://db/x")
    monkeypatch.setenv("SECRET_KEY", "s" * 40)
    monkeypatch.delenv(missing)
    with pytest.raises(ConfigurationError, match=missing):
        create_app("production")


def test_paas_database_urls_are_accepted():
    assert normalize_database_url("postgres://u:p@h:5432/d") == "postgresql+psycopg://u:p@h:5432/d"
    assert normalize_database_url("postgresql://h/d") == "postgresql+psycopg://h/d"
    assert normalize_database_url("postgresql+psycopg2://h/d") == "postgresql+psycopg://h/d"
    assert normalize_database_url("postgresql+psycopg://h/d") == "postgresql+psycopg://h/d"
    assert normalize_database_url("sqlite:///x.db") == "sqlite:///x.db"
    assert settings_from_environment({"DATABASE_URL": "postgres://h/d"}) == {
        "SQLALCHEMY_DATABASE_URI": "postgresql+psycopg://h/d"
    }


def test_bad_numbers_in_the_environment_are_named():
    with pytest.raises(ConfigurationError, match="HOLD_TTL_SECONDS"):
        settings_from_environment({"HOLD_TTL_SECONDS": "soon"})
    with pytest.raises(ConfigurationError, match="DATABASE_POOL_SIZE"):
        settings_from_environment({"DATABASE_POOL_SIZE": "0"})


def test_the_pool_size_bounds_each_engine_without_overflow(tmp_path):
    app = create_app(
        "testing",
        {
            **settings_from_environment({"DATABASE_POOL_SIZE": "3"}),
            "SQLALCHEMY_DATABASE_URI": f"sqlite:///{tmp_path / 'pool.sqlite3'}",
            "MODEL_CATALOG": "tests/fixtures/models.toml",
        },
    )
    with app.app_context():
        pool = db.engine.pool
        assert (pool.size(), pool._max_overflow) == (3, 0)


def test_unknown_environment_name_is_refused():
    with pytest.raises(ConfigurationError, match="APP_ENV"):
        create_app("staging")


def test_a_broken_catalog_stops_the_app(tmp_path):
    catalog = tmp_path / "models.toml"
    catalog.write_text('[[models]]\nid = "x"\nroutes = [{ upstream = "builtin" }]\n')
    with pytest.raises(CatalogError, match="pricing is required"):
        create_app("testing", {"MODEL_CATALOG": str(catalog)})


def test_a_malformed_tool_or_tier_price_stops_the_app(tmp_path):
    catalog = tmp_path / "models.toml"
    catalog.write_text(
        '[[models]]\nid = "x"\nroutes = [{ upstream = "builtin" }]\n'
        "pricing = { prompt = 1, completion = 1, tiers = { priority = -2 } }\n"
    )
    with pytest.raises(CatalogError, match=r"models\[0\] \(x\): pricing.tiers.priority must be"):
        create_app("testing", {"MODEL_CATALOG": str(catalog)})


def test_rate_limits_default_per_key_and_can_be_turned_off():
    limited = create_app("testing")
    assert limited.config["RATE_LIMIT"] == "600 per minute"
    assert limited.config["RATELIMIT_ENABLED"] is True
    assert limited.config["RATELIMIT_STORAGE_URI"] == "memory://"
    unlimited = create_app("testing", {"RATE_LIMIT": "off", "REDIS_URL": "redis://r:6379/1"})
    assert unlimited.config["RATELIMIT_ENABLED"] is False
    assert unlimited.config["RATELIMIT_STORAGE_URI"] == "redis://r:6379/1"


def test_only_pages_outside_the_api_open_the_cookie_session(app):
    from flask import session
    from flask.sessions import NullSession

    with app.test_request_context("/v1/chat/completions", method="POST"):
        assert isinstance(session._get_current_object(), NullSession)
    with app.test_request_context("/signin"):
        session["seen"] = True
        assert not isinstance(session._get_current_object(), NullSession)
