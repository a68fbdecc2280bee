# Groundskeeper: two commands on a fresh machine.
#   make dev   local AWS (moto; DynamoDB Local for DynamoDB) from infra/template.yaml, demo data, Dagster UI on 127.0.0.1:3000
#   make test  create .venv if missing, install the project with its dev extra, ruff, the whole suite (CI runs it)
#   make test-fast  the inner loop: the suite without its slow tiers (cluster, cli, ecs, dynamodb_local, slow)
#   make ui-test  drive make dev's UI in headless Chromium (not part of make test)
#   make cluster  the cluster profile on this machine: PostgreSQL, RabbitMQ, 2 Celery workers, daemon, UI

# Python 3.11+: PYTHON if given, else python3.11 if it is on PATH, else python3 (checked to be 3.11+ below)
PYTHON ?= $(shell command -v python3.11 >/dev/null 2>&1 && echo python3.11 || echo python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# 3 xdist workers on 2 cores: the cluster's tests (one worker, mostly waiting on their processes) run
# beside two workers for the rest; the suite is mostly waits, not CPU (about 1.5 cores busy)
PYTEST_WORKERS ?= 3
# --dist loadgroup comes from pyproject.toml: an xdist_group's tests share one worker (tests/suite_plugin.py checks it)
PYTEST := $(PY) -m pytest -n $(PYTEST_WORKERS)
FAST_TIER := not (cluster or cli or ecs or dynamodb_local or slow)

.PHONY: dev test test-fast lint install bench clean ui-test cluster

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 || { echo "make: needs Python 3.11+, and $(PYTHON) is missing or older: install python3.11 or pick one with PYTHON=/path/to/python3.12 make $@"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# A test whose tool is missing (npm for DynamoDB Local, RabbitMQ, PostgreSQL) is skipped with one line at
# the end naming the tool; .ci/run sets GROUNDSKEEPER_NO_SKIPS=1, under which it fails instead.
# PYTEST_ARGS: more pytest options, e.g. PYTEST_ARGS=--durations=10 make test
test: lint
	$(PYTEST) -q $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PYTEST) -q -m "$(FAST_TIER)"

dev: $(STAMP)
	$(PY) -m infra.local

# DAGSTER_PG_URL (default: an embedded PostgreSQL), CELERY_BROKER_URL (default: the local RabbitMQ)
cluster: $(STAMP)
	$(PY) -m infra.cluster

# Debian's chromium (playwright's own browser download is not used): sudo apt-get install chromium
ui-test: $(STAMP)
	@test -x /usr/bin/chromium || { echo "make ui-test needs Debian's chromium: sudo apt-get install chromium"; exit 1; }
	$(PY) -m pip install --quiet -e '.[dev,ui]'
	$(PY) tests/ui/browser_check.py

bench: $(STAMP)
	$(PY) benchmarks/definitions_load.py

clean:
	rm -rf .groundskeeper .pytest_cache .ruff_cache
