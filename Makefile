# headrace developer commands. The README's quickstart is `make demo` and `make test`;
# both create the project-local .venv on first use (and again when a pyproject.toml changes).
# Three distributions, installed editable in one pip command (so that headrace's `spark` extra
# resolves to the local plugin): headrace, the Spark plugin and the benchmarks.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test fast lint typecheck docs bench anchors clean

$(STAMP): pyproject.toml plugins/headrace_spark/pyproject.toml bench/pyproject.toml \
		framework/headrace/protocol/_speedups.c framework/headrace/jetstream/_direct_tail.c
	@scripts/check-prereqs $(PYTHON)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev,spark]' -e plugins/headrace_spark -e bench
	@touch $@

## The main job: JetStream orders -> pipeline -> Spark parquet in ./headrace-demo, checked.
demo: $(STAMP)
	$(BIN)/headrace demo

## The whole test suite: real nats-server processes, fuzzing, slow tests included. A failed
## test runs once more; one that passes then is listed under FLAKES (tests/conftest.py).
test: $(STAMP)
	HYPOTHESIS_PROFILE=ci $(BIN)/pytest --reruns 1

## The fast set, for the edit-test loop (under a minute).
fast: $(STAMP)
	$(BIN)/pytest -q -m "not slow and not spark"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

typecheck: $(STAMP)
	$(BIN)/mypy

## The documentation site (guides and API reference) into ./site, strict: a broken link fails.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

## Same-run comparisons with the peers (bench/README.md). The consume benchmark's --anchors
## builds libnats (apt-get install libnats-dev) and installs nats.js (npm) as `make anchors` does;
## headrace and the anchors pull the same window, at the ADR-37 default (1000) and at 10000.
## `bench spark` reads the stream through the jetstream Spark data source (streaming and
## batch) against the pipeline into SparkSink; `bench publish` async publishes against nats-py, nats.js
## and libnats' js_PublishAsync; `bench range-read` compares a source task's
## batched Direct Gets with consumers (no Spark); `bench windows` counts 1M clicks per user and
## minute through a window operator against Bytewax (a dependency of bench/).
bench: $(STAMP)
	$(BIN)/headrace bench core
	$(BIN)/headrace bench consume --anchors --buffer 1000
	$(BIN)/headrace bench consume --anchors --buffer 10000
	$(BIN)/headrace bench publish --anchors
	$(BIN)/headrace bench pipeline
	$(BIN)/headrace bench e2e
	$(BIN)/headrace bench scale
	$(BIN)/headrace bench spark
	$(BIN)/headrace bench range-read
	$(BIN)/headrace bench windows

## The peers' own figures on this machine (nats-py, nats.js, libnats), for context.
## The peers' anchor programs: $(HEADRACE_ANCHORS), not part of this repository.
HEADRACE_ANCHORS ?= ../shared/anchors
anchors: $(STAMP)
	@test -x "$(HEADRACE_ANCHORS)/run" || { echo "make anchors: no anchor programs in $(HEADRACE_ANCHORS) (set HEADRACE_ANCHORS)"; exit 2; }
	"$(HEADRACE_ANCHORS)/run" --python $(BIN)/python

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis site
