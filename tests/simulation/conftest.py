"""The simulation's seeds and steps (``--seed``, ``--steps``), and a database to break."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from flask import Flask
from flask_migrate import upgrade

from app import create_app
from app.extensions import db
from tests.conftest import TEST_CATALOG, _fresh_postgres_database

DEFAULT_SEEDS = (1, 2, 3, 4)
DEFAULT_STEPS = 500


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run ``seed``-taking tests once per default seed, or only with ``--seed``."""
    if "seed" in metafunc.fixturenames:
        seed = metafunc.config.getoption("--seed")
        metafunc.parametrize("seed", DEFAULT_SEEDS if seed is None else [seed])


@pytest.fixture
def steps(request: pytest.FixtureRequest) -> int:
    """Steps of each run: ``--steps``, or enough for the default run to stay short."""
    return request.config.getoption("--steps") or DEFAULT_STEPS


@pytest.fixture
def schedule_file(tmp_path) -> str:
    """Where a failed run writes its whole schedule."""
    return tmp_path / "schedule.txt"


@pytest.fixture
def disposable_app(database_url: str, tmp_path) -> Iterator[Flask]:
    """The app on a database of its own, for runs against a ledger broken on purpose.

    The session's database must stay consistent for the other tests' audits.
    """
    if database_url.startswith("sqlite"):
        yield _migrated_app(f"sqlite:///{tmp_path / 'disposable.sqlite3'}")
        return
    for url in _fresh_postgres_database(os.environ["TEST_DATABASE_URL"]):
        app = _migrated_app(url)
        yield app
        with app.app_context():
            # Its connections must be closed before the database can be dropped.
            db.engine.dispose()


def _migrated_app(url: str) -> Flask:
    app = create_app("testing", {"SQLALCHEMY_DATABASE_URI": url, "MODEL_CATALOG": TEST_CATALOG})
    with app.app_context():
        upgrade()
    return app
