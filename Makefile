# The two commands of the README: `make run` serves, `make test` runs the whole suite.
# Both set up the virtualenv in .venv first, installing only what changed; `make test`
# also installs the Debian packages the tests drive (as root, with apt-get) when missing.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export FLASK_APP := wsgi
# Debian packages the test suite needs beyond Python; each is installed only if missing.
DEBIAN_PACKAGES ?= chromium curl nodejs nginx pgbouncer postgresql redis-server valgrind
NODE_CLIENTS := tests/clients/node tests/clients/responses_node tests/clients/messages_node \
	tests/clients/gemini_node

.PHONY: run test lint system node-clients docs

$(VENV)/.runtime: requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -r requirements.txt
	touch $@

$(VENV)/.dev: $(VENV)/.runtime requirements-dev.txt
	$(BIN)/pip install --disable-pip-version-check -q -r requirements-dev.txt
	touch $@

system:
	@missing=$$(for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:" $$missing; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	fi

# The npm clients the tests drive, each directory pinned by its package-lock.json:
# openai-node (tests/clients/node), Codex CLI and the Vercel AI SDK (responses_node), the
# Anthropic SDK and Claude Code (messages_node).
# Debian's nodejs comes without npm (NodeSource's has it): add Debian's only if missing.
node-clients: system
	@command -v npm >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q npm
	for dir in $(NODE_CLIENTS); do \
		(cd $$dir && npm ci --no-audit --no-fund --loglevel=error) || exit 1; \
	done

run: $(VENV)/.runtime
	$(BIN)/flask db upgrade
	$(BIN)/flask demo setup
	$(BIN)/gunicorn -c config/gunicorn.conf.py wsgi:app

lint: $(VENV)/.dev
	$(BIN)/ruff check .

test: lint system node-clients
	$(BIN)/pytest

# The documentation site (mkdocs.yml), served as it is edited; the tests build it strict.
docs: $(VENV)/.dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve -a 127.0.0.1:8001
