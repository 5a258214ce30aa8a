# reconcile — the two commands a new user needs: `make demo` and `make test`.
PY      ?= python3
VENV    ?= .venv
BIN      = $(VENV)/bin
STAMP    = $(VENV)/.installed
PG_ADMIN ?= postgresql://postgres@127.0.0.1:5432/postgres

.PHONY: setup services test test-fast lint demo bench bench-full bench-profile chaos explore clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $(STAMP)

services:
	@bash scripts/services.sh

# pytest-xdist: TEST_WORKERS processes (most slow tests wait on worker processes, not the CPU);
# --dist loadfile keeps each file on one worker (test_worker_crash's fixed Redis db 13 and
# RabbitMQ vhost, test_broker_faults' vhost, module fixtures); --no-loadscope-reorder keeps the
# collection order, which tests/conftest.py starts with the slow files. (loadgroup's
# xdist_group does not group under pytest 9.2 with xdist 3.8: xdist renames item._nodeid.)
# TEST_WORKERS=0 runs in this process, one test at a time.
TEST_WORKERS ?= 3
test: setup services
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: setup
	$(BIN)/ruff check reconcile tests alembic examples
	$(BIN)/lint-imports --no-logo
	$(BIN)/mypy
	@site=$$(mktemp -d); $(BIN)/mkdocs build --strict --quiet --site-dir $$site; \
	  rc=$$?; rm -rf $$site; exit $$rc
	@tmp=$$(mktemp -d); \
	  db=lint_$$$$; \
	  psql "$(PG_ADMIN)" -qc "CREATE DATABASE $$db" && \
	  $(BIN)/alembic -x url=postgresql+psycopg://postgres@127.0.0.1:5432/$$db upgrade 0001:head --sql > $$tmp/m.sql && \
	  $(BIN)/squawk --reporter gcc $$tmp/m.sql && \
	  $(BIN)/alembic -x url=postgresql+psycopg://postgres@127.0.0.1:5432/$$db upgrade head && \
	  $(BIN)/alembic -x url=postgresql+psycopg://postgres@127.0.0.1:5432/$$db check; \
	  rc=$$?; psql "$(PG_ADMIN)" -qc "DROP DATABASE IF EXISTS $$db"; rm -rf $$tmp; exit $$rc

demo: setup
	$(BIN)/python -m reconcile.demo

# a seeded chaos run (a fresh seed each time; replay one with SEED=…): make chaos N=5000
# [DB_TZ=America/New_York] (the database's default TimeZone; not TZ, which the environment
# often sets) [NAIVE=1] (the platform's timestamps as timestamp without time zone)
# [POLICY=1/2,1/3] (the settlement policy's failure,cancel refund shares; drawn from the seed)
CHAOS_ARGS = --jobs $(or $(N),300) $(if $(SEED),--seed $(SEED)) \
	$(if $(DB_TZ),--db-timezone $(DB_TZ)) $(if $(filter-out 0,$(NAIVE)),--naive-timestamps) \
	$(if $(POLICY),--policy $(POLICY))
chaos: setup services
	$(BIN)/python -m reconcile.testing.chaos $(CHAOS_ARGS)

# the systematic interleaving explorer at full size (every scenario; `make test` runs a bounded
# set): make explore [SCENARIO=new:create/resolve_upstream] [PREEMPTIONS=2] [JUMPS=1]
explore: setup services
	$(BIN)/python -m reconcile.testing.explorer --preemptions $(or $(PREEMPTIONS),2) --jumps $(or $(JUMPS),1) $(if $(SCENARIO),--scenario $(SCENARIO))

# speed and scale, reported (never asserted): writes bench/results/latest.{json,md} and the
# PNGs beside them. Every figure is bounded to fit 15 minutes on a loaded 2-core host (≈ 14 min;
# latest.md prints each figure's wall time); `make bench ONLY=fig1,fig6` runs some.
bench: setup services
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	$(BIN)/python -m bench.run $(if $(ONLY),--only $(ONLY))

# the unbounded full-size variants: the drain waits for all 10,000, figure 3 waits up to 400 s
# per run, figure 6 also measures the default 300-s sweep interval (≈ 35–40 min)
bench-full: setup services
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	$(BIN)/python -m bench.run --full $(if $(ONLY),--only $(ONLY))

# cProfile of each missed aim's hot process: bench/results/profiles/*.txt + profiles.json,
# which latest.md links (≈ 3 min; run it before `make bench` so the report includes it)
bench-profile: setup services
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	$(BIN)/python -m bench.profile_run

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis reconcile.db* reconcile-media .reconcile-broker build dist *.egg-info
