# The two commands of the README: `make run` serves, `make test` runs the whole suite.
# Both set up the virtualenv in .venv first, installing only what changed.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export FLASK_APP := wsgi

.PHONY: run test lint

$(VENV)/.runtime: requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -r requirements.txt
	touch $@

$(VENV)/.dev: $(VENV)/.runtime requirements-dev.txt
	$(BIN)/pip install --disable-pip-version-check -q -r requirements-dev.txt
	touch $@

run: $(VENV)/.runtime
	$(BIN)/flask db upgrade
	$(BIN)/flask demo setup
	$(BIN)/gunicorn -c config/gunicorn.conf.py wsgi:app

lint: $(VENV)/.dev
	$(BIN)/ruff check .

test: lint
	$(BIN)/pytest
