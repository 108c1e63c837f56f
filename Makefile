# StreamLake: exactly-once Kafka -> Delta on Spark, run by Airflow.
# `make test` and `make run` each do the whole set-up first (idempotent).
SHELL := /bin/bash
VENV  := .venv
BIN   := $(VENV)/bin
export PYSPARK_PYTHON := $(abspath $(BIN)/python)
export PYSPARK_DRIVER_PYTHON := $(abspath $(BIN)/python)

.PHONY: setup test test-fast test-scenarios profile-test run stop bench lock lock-jars clean

setup:
	@bash scripts/setup.sh

# Two pytest-xdist workers: the Airflow platform files (the live platform, the `airflow dags
# test` scenarios) one after the other in one, every other file a unit of its own spread over
# both (tests/conftest.py groups them). PYTEST_WORKERS=0: one process, everything in order.
# One test: .venv/bin/pytest tests/test_x.py::test_y
PYTEST_WORKERS ?= 2

# --durations: the slowest tests at the end of every run (where make test's time goes).
# Everything but the long scenarios (-m scenario: make test-scenarios; README, Tests).
test: setup
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 -m "not scenario"

# The long multi-process scenarios: a pipeline on S3 computed by a two-worker Spark cluster
# through every command, the DAGs of a job on S3, a rescale on a cluster, the supervisor's
# failure-rate give-up, two roots' runs and backfills. make test + make test-scenarios = every test.
test-scenarios: setup
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=10 -m scenario

# make test under a CPU profile by kind of process (JVMs, Spark's Python helpers, Airflow,
# the browser...): bench/results/make_test_cpu.md, .json, .png.
profile-test: setup
	$(BIN)/python bench/cpu_profile.py -- $(MAKE) test

# Before every commit (about 3 minutes): unit tests, definitions, DAGs and forms, views, CLI,
# the generator, one small end-to-end run of the demo pipeline (the list: tests/conftest.py).
test-fast: setup
	$(BIN)/pytest -m fast --durations=10

# LAKE=s3: the lake (every pipeline's tables, the platform's own) on a local S3 server
# (s3://lake), with a home of its own (.streamlake-s3) so it never mixes with the local lake's jobs.
LAKE ?= local
S3_HOME := $(CURDIR)/.streamlake-s3

# Then the metrics exporter (127.0.0.1:9464) and Prometheus (127.0.0.1:9090, monitoring/): a port
# in use or a Prometheus that does not start is one line, and the rest of the platform runs. On
# S3 the exporter gets the lake's settings from lake.env (written by `streamlake platform --lake s3`).
run: setup
ifeq ($(LAKE),s3)
	STREAMLAKE_HOME=$${STREAMLAKE_HOME:-$(S3_HOME)} $(BIN)/streamlake platform --lake s3
	-@. "$${STREAMLAKE_HOME:-$(S3_HOME)}/lake.env" && $(BIN)/streamlake metrics start
else
	$(BIN)/streamlake platform --lake $(LAKE)
	-@$(BIN)/streamlake metrics start
endif

stop:
	@if [ -x $(BIN)/streamlake ]; then $(BIN)/streamlake stop; else echo "nothing to stop (no .venv)"; fi
	@if [ -x $(BIN)/streamlake ] && [ -z "$$STREAMLAKE_HOME" ] && [ -d $(S3_HOME)/run ]; then \
		STREAMLAKE_HOME=$(S3_HOME) $(BIN)/streamlake stop; fi

bench: setup
	$(BIN)/python bench/ingest_bench.py
	$(BIN)/python bench/latency_bench.py
	$(BIN)/python bench/latency_bench.py --rate 200 --skip-one-record --name latency_200
	$(BIN)/python bench/latency_bench.py --definition pipelines/orders.yaml --skip-one-record --name latency_orders
	$(BIN)/python bench/backfill_bench.py
	$(BIN)/python bench/check_bench.py
	$(BIN)/python bench/operations_bench.py
	$(BIN)/python bench/object_store_bench.py
	$(BIN)/python bench/s3_proof_bench.py
	$(BIN)/python bench/spark_python_bench.py
	$(BIN)/python bench/peer_bench.py
	$(BIN)/python bench/summary.py

# Re-resolve the full lock after changing requirements.txt.
lock:
	rm -rf .lockenv && python3 -m venv .lockenv && .lockenv/bin/pip install -q -r requirements.txt \
	  && { echo "# Full lock of the environment requirements.txt resolves to (pip freeze)."; \
	       echo "# Regenerate: make lock"; .lockenv/bin/pip freeze; } > constraints.txt && rm -rf .lockenv

# Re-resolve a jar set's lock (jars/<set>.sha256) after changing its pom (jars/<set>.pom.xml),
# from Maven Central; SET=kafka for one set, every set by default. `make setup` installs it.
SET ?=
lock-jars:
	bash scripts/jars.sh lock $(SET)

clean: stop
	rm -rf .streamlake bench/work
