# dtq developer tasks. `make test` is the CI gate: install, lint, then every test (unit and
# integration; integration tests need PostgreSQL and Redis, which `.ci/run` starts).
#
#   make install   create .venv (python3 >= 3.11) and install dtq with its dev tools
#   make lint      ruff check, ruff format --check, mypy (--strict on src, relaxed on tests),
#                  import-linter
#   make test      install, lint, pytest
#   make dev       run `dtq dev`: API + reconciler + worker in memory on :8080
#
# Local CockroachDB + Redis (Docker): compose-up / compose-down / migrate, and a three-node
# cluster for failover drills: cluster-up / cluster-migrate / cluster-status / cluster-down.
#
#   make up        the whole stack in Docker (docker-compose.yml, profile "app"): builds the image,
#                  then crdb + redis healthy -> dtq migrate -> orchestrator healthy -> worker
#   make monitoring-up   the same plus Prometheus (:9090) and Grafana (:3000) with the dtq dashboard
#   make down      stop all of it (volumes kept; add `-v` to the compose command to wipe them)

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := test

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.dtq-installed

CRDB_DSN ?= postgresql://root@127.0.0.1:26257/defaultdb?sslmode=disable
CLUSTER_DSN := postgresql://root@127.0.0.1:26257,127.0.0.1:26258,127.0.0.1:26259/defaultdb?sslmode=disable
COMPOSE ?= docker compose
CLUSTER := $(COMPOSE) -f docker-compose.multinode.yml -p dtq-multinode

.PHONY: install lint test dev compose-up compose-down up monitoring-up down migrate \
	cluster-up cluster-migrate cluster-status cluster-down

install: $(STAMP)

# Re-install when the dependencies change; the stamp keeps `make test` from reinstalling each run.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "dtq needs Python >= 3.11; $(PYTHON) is $$($(PYTHON) -V 2>&1)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	@touch $@

lint: install
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/mypy
	$(BIN)/lint-imports

# Two pytest processes (pytest-xdist), each taking whole test files (`--dist loadfile`, so a
# module's fixtures, e.g. the SeaweedFS server, start once): most of the suite waits on
# subprocesses, PostgreSQL and Redis, so two processes fit 2 cores. Every test has its own
# database, key prefix and ports. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

test: install lint
	$(BIN)/pytest -q --durations=15 $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

dev: install
	$(BIN)/dtq dev

compose-up:
	$(COMPOSE) up -d

# `up -d` returns once each service's dependencies met their conditions, so the worker has
# started when it does; `docker compose --profile app ps` shows each service's health.
up:
	$(COMPOSE) --profile app up -d --build
	$(COMPOSE) --profile app ps

monitoring-up:
	$(COMPOSE) --profile app --profile monitoring up -d --build
	$(COMPOSE) --profile app --profile monitoring ps

down:
	$(COMPOSE) --profile app --profile monitoring down

compose-down:
	$(COMPOSE) down

migrate: install
	CRDB_DSN='$(CRDB_DSN)' $(BIN)/dtq migrate

cluster-up:
	$(CLUSTER) up -d

cluster-migrate: install
	CRDB_DSN='$(CLUSTER_DSN)' $(BIN)/dtq migrate

cluster-status:
	$(CLUSTER) exec crdb1 ./cockroach node status --insecure --host=crdb1:26257

cluster-down:
	$(CLUSTER) down -v

# --- benchmarks (benchmarks/README.md) ------------------------------------------------------------
# Need PostgreSQL on 127.0.0.1:5432 and Redis on 127.0.0.1:6379 (BENCH_DATABASE_URL, BENCH_REDIS_URL).
#   make bench         install the bench extra (peers, profilers), run every scenario and peer
#   make bench-quick   the same, 1 run and smaller sizes (a smoke test, ~2 minutes)
#   make bench-micro   pytest-benchmark micro-benchmarks of the pure parts (no services)
#   make bench-backlog a million-task backlog (opt-in, several minutes): submit, reconcile,
#                      drain and memory at 1,000,000 tasks vs 10,000 (BACKLOG_TASKS=100000 for less)

.PHONY: bench bench-install bench-quick bench-micro bench-backlog

bench-install: install
	$(BIN)/python -m pip install --quiet -e ".[dev,bench]"

bench: bench-install
	$(BIN)/python -m benchmarks.run

bench-quick: bench-install
	$(BIN)/python -m benchmarks.run --quick

BACKLOG_TASKS ?= 1000000

bench-backlog: bench-install
	$(BIN)/python -m benchmarks.backlog --tasks $(BACKLOG_TASKS)

bench-micro: install
	$(BIN)/pytest benchmarks/micro -q -p no:cacheprovider --benchmark-sort=name \
		--benchmark-columns=min,median,mean,ops
