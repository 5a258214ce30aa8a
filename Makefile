# reconcile — the two commands a new user needs: `make demo` and `make test`.
PY      ?= python3
VENV    ?= .venv
BIN      = $(VENV)/bin
STAMP    = $(VENV)/.installed
PG_ADMIN ?= postgresql://postgres@127.0.0.1:5432/postgres

.PHONY: setup services test test-fast lint demo bench bench-full bench-profile bench-peers bench-peers-profile chaos explore clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $(STAMP)

services:
	@bash scripts/services.sh

# pytest-xdist: TEST_WORKERS processes, more than the 2 cores (most slow tests wait on worker
# processes and servers, not the CPU: on this 2-core machine 4 workers took 716 s where 3 took 826);
# --dist loadfile keeps each file on one worker (test_worker_crash's fixed Redis db 13 and
# RabbitMQ vhost, test_broker_faults' vhost, module fixtures); --no-loadscope-reorder keeps the
# collection order, which tests/conftest.py starts with the slow files. (loadgroup's
# xdist_group does not group under pytest 9.2 with xdist 3.8: xdist renames item._nodeid.)
# TEST_WORKERS=0 runs in this process, one test at a time.
TEST_WORKERS ?= 4
test: setup services
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

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
# [POLL_MODE=batch] (RECONCILE_POLL_MODE in every process; the run sends beat's poll_due ticks)
CHAOS_ARGS = --jobs $(or $(N),300) $(if $(SEED),--seed $(SEED)) \
	$(if $(DB_TZ),--db-timezone $(DB_TZ)) $(if $(filter-out 0,$(NAIVE)),--naive-timestamps) \
	$(if $(POLICY),--policy $(POLICY)) $(if $(POLL_MODE),--poll-mode $(POLL_MODE))
chaos: setup services
	$(BIN)/python -m reconcile.testing.chaos $(CHAOS_ARGS)

# the systematic interleaving explorer at full size (every scenario; `make test` runs a bounded
# set): make explore [SCENARIO=new:create/resolve_upstream] [PREEMPTIONS=2] [JUMPS=1]
explore: setup services
	$(BIN)/python -m reconcile.testing.explorer --preemptions $(or $(PREEMPTIONS),2) --jumps $(or $(JUMPS),1) $(if $(SCENARIO),--scenario $(SCENARIO))

# speed and scale, reported (never asserted): writes bench/results/latest.{json,md} and the
# PNGs beside them. Every figure is bounded to fit 20 minutes on a loaded 2-core host (≈ 18 min;
# latest.md prints each figure's wall time); `make bench ONLY=fig1,fig6` runs some. Figure 10 is
# the peers benchmark, bounded: 500 jobs, a quiet host, no recovery run (≈ 4 min).
bench: setup services
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	$(BIN)/python -m bench.run $(if $(ONLY),--only $(ONLY))

# the unbounded full-size variants: the drain waits for all 10,000, figure 3 waits up to 400 s
# per run, figure 6 also measures the default 300-s sweep interval (≈ 35–40 min)
bench-full: setup services
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	$(BIN)/python -m bench.run --full $(if $(ONLY),--only $(ONLY))

# the peers benchmark in full: plain Celery, reconcile (chain and batch poll modes) and DBOS on
# one workload, 500 and 2,000 jobs, a quiet and a saturated host (a CPU burner per core), each
# system's recovery after SIGKILL of every worker, the machine limits; writes
# bench/results/peers.{json,md}; exits 1 when a job did not complete or a ledger is unbalanced.
# As long as it needs (≈ 1 h): run it on a quiet machine
bench-peers: setup services
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	$(BIN)/python -m bench.peers.run --jobs 500,2000 --saturated

# where each peer's worker CPU goes (py-spy, GIL samples, the whole run) at 2,000 jobs, by
# layer and by phase: bench/results/profiles/peers_workers.{json,md} (≈ 4 min)
bench-peers-profile: setup services
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	$(BIN)/python -m bench.peers.profile

# cProfile of each missed aim's hot process: bench/results/profiles/*.txt + profiles.json,
# which latest.md links (≈ 3 min; run it before `make bench` so the report includes it)
bench-profile: setup services
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	$(BIN)/python -m bench.profile_run

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis reconcile.db* reconcile-media .reconcile-broker build dist *.egg-info
