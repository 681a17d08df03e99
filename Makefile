# Ductor coordinator processor. `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help venv tools up down status restart migrate topics setup lint format typecheck unit unit-pure pytest test wheel compile clean-compiled bench bench-latency bench-trees chaos demo clean k8s-rules

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,binary,ui]'
	touch $(STAMP)

venv: $(STAMP) ## create .venv and install the package with its dev tools (cached)

# kcat (Debian's package is still called kafkacat; it installs /usr/bin/kcat): a Kafka client
# that is not ours, used by the tests to write records the way an outside producer would.
# Kafka's own console producer is not an option: it lives in kafka-tools, which .infra lacks.
# promtool (in Debian's prometheus package): the tests check the alerting rules with it
# (`promtool check rules`, `promtool test rules`); without it they fail, they do not skip.
# The package comes with a Prometheus server whose service it would start: where no
# /usr/sbin/policy-rc.d says otherwise (containers usually have one), one that refuses every
# start is in place for the install, so no server starts, with systemd or without it.
# Chromium and its chromedriver (Debian's builds, which apt keeps at one version together):
# the real browser tests/integration/test_ui.py drives, headless, through selenium.
# curl: docs/usage.md's HTTP API block is run with it, as a user runs it.
TOOLS := kcat:kafkacat promtool:prometheus chromium:chromium chromedriver:chromium-driver curl:curl
tools: ## client tools the tests use (kcat, promtool, chromium, chromedriver), installed with apt-get when missing
	@for tool in $(TOOLS); do \
	  command=$${tool%%:*}; package=$${tool##*:}; \
	  command -v $$command >/dev/null && continue; \
	  [ $$package = kafkacat ] && command -v kafkacat >/dev/null && continue; \
	  if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	    echo "$$command is missing: install Debian's $$package package (apt-get install $$package)" >&2; \
	    exit 1; \
	  fi; \
	  echo "installing $$package with apt-get" >&2; \
	  policy=; \
	  if [ ! -e /usr/sbin/policy-rc.d ]; then \
	    policy=/usr/sbin/policy-rc.d; printf '#!/bin/sh\nexit 101\n' >$$policy; chmod 755 $$policy; \
	  fi; \
	  install="apt-get install -y -q $$package"; \
	  [ $$package = prometheus ] && install="$$install --no-install-recommends"; \
	  DEBIAN_FRONTEND=noninteractive $$install >/dev/null 2>&1 \
	    || { apt-get update -q && DEBIAN_FRONTEND=noninteractive $$install; }; \
	  status=$$?; [ -n "$$policy" ] && rm -f $$policy; \
	  [ $$status = 0 ] || exit 1; \
	done

up: venv ## start local Kafka and Postgres (installs them the first time; idempotent)
	$(PY) infra/local.py up

down: venv ## stop local Kafka and Postgres
	$(PY) infra/local.py down

status: venv ## say whether Kafka and Postgres are running
	$(PY) infra/local.py status

# MODE=immediate or kill crashes the service instead (see infra/local.py); `infra/local.py kill
# SERVICE` crashes one and leaves it down, for outage tests.
restart: venv ## restart SERVICE=kafka|postgres on its data (MODE=fast|immediate|kill)
	$(PY) infra/local.py restart $(SERVICE) --mode $(or $(MODE),fast)

migrate: venv ## apply the SQL migrations
	$(VENV)/bin/ductor migrate

topics: venv ## create the Kafka topics
	$(VENV)/bin/ductor topics create

setup: up migrate topics ## infra up, schema migrated, topics created

# infra/k8s/prometheus-rule.yaml is made from infra/prometheus/ductor-alerts.yml; a unit test
# fails when they differ.
k8s-rules: venv ## regenerate the Kubernetes PrometheusRule from the Prometheus alert rules
	$(PY) infra/prometheus_rule.py

lint: venv ## ruff lint and format check
	$(VENV)/bin/ruff check processor tests infra examples
	$(VENV)/bin/ruff format --check processor tests infra examples

format: venv ## apply ruff formatting and fixes
	$(VENV)/bin/ruff format processor tests infra examples
	$(VENV)/bin/ruff check --fix processor tests infra examples

typecheck: venv ## mypy --strict
	$(VENV)/bin/mypy

unit: venv ## the fast tests that need no services
	$(PY) -m pytest -q -m "not integration"

# Two phases: the tests that share nothing, three at a time (pytest-xdist; each process has a
# database of its own, each test its own topics; most of a test's time is spent waiting on the
# services, so a third process cut this phase from ~660 to ~450 s on the 2-core machine, all
# passing; a process that runs out of tests takes some of another's instead of idling behind
# its long ones: worksteal), then the serial ones alone (those that
# restart the shared services, start a cluster or build the package: tests/integration/
# fix_session.py marks them). Both phases run, and both must pass.
pytest: venv tools ## every test (needs `make up`)
	@status=0; \
	$(PY) -m pytest -q -ra --tb=short --durations=15 -n 3 --dist worksteal -m "not serial" || status=$$?; \
	$(PY) -m pytest -q -ra --tb=short --durations=15 -m serial || status=$$?; \
	exit $$status

# The unit tests again on the pure-Python modules, where the checkout is compiled (`make
# compile`): the fallback a source install without a compiler gets, and DUCTOR_PURE_PYTHON=1.
unit-pure: venv ## the fast tests on the pure-Python modules (DUCTOR_PURE_PYTHON=1)
	DUCTOR_PURE_PYTHON=1 DUCTOR_EXPECT_BUILD=pure $(PY) -m pytest -q -n 2 -m "not integration"

# The README's test command: install, bring the services up, lint, typecheck, test. The
# services come up (downloads and installs, on a fresh machine) while lint, typecheck, compile
# and the unit tests on the pure-Python modules run (DUCTOR_PURE_PYTHON=1 passes over the
# compiled modules as they land), and are stopped again afterwards unless they were already
# running before.
test: venv tools ## everything CI runs: infra up, lint, typecheck, compile, the unit tests on the pure build, all tests on the compiled one
	@was_up=0; $(PY) infra/local.py status >/dev/null 2>&1 && was_up=1; \
	up_log=$$(mktemp); $(PY) infra/local.py up >$$up_log 2>&1 & up_pid=$$!; \
	status=0; $(MAKE) --no-print-directory -j 2 --output-sync=target compile lint typecheck unit-pure \
	  || status=$$?; \
	wait $$up_pid; up_status=$$?; cat $$up_log; rm -f $$up_log; \
	[ $$up_status = 0 ] || exit 1; \
	if [ $$status = 0 ]; then \
	  DUCTOR_EXPECT_BUILD=compiled DUCTOR_TEST_DIST=$(CURDIR)/dist \
	    $(MAKE) --no-print-directory pytest || status=$$?; \
	fi; \
	if [ $$was_up = 0 ]; then $(PY) infra/local.py down; fi; \
	exit $$status

# The sdist, and the wheel built from it (so the sdist is known to be complete): what users
# install. tests/integration/test_wheel.py builds its own, the same way. It needs neither .venv
# nor the dev tools: `build` alone, in a virtualenv of its own ($(BUILD_VENV)), which builds in
# an isolated environment holding only pyproject.toml's [build-system] requirements. Its output
# (pip, setuptools, mypyc and the C compiler: thousands of lines) goes to $(BUILD_LOG), shown
# whole if the build fails; otherwise its last line and setup.py's own (`ductor build: ...`).
BUILD_VENV := .venv-build
BUILD_LOG := dist/build.log
$(BUILD_VENV)/.installed:
	$(PYTHON) -m venv $(BUILD_VENV)
	$(BUILD_VENV)/bin/python -m pip install --quiet --disable-pip-version-check 'build>=1.2,<2'
	touch $@

wheel: $(BUILD_VENV)/.installed ## build the sdist and the wheel into dist/ (quiet: its log is dist/build.log)
	@mkdir -p dist
	@$(BUILD_VENV)/bin/python -m build --outdir dist . >$(BUILD_LOG) 2>&1 \
	  || { cat $(BUILD_LOG); echo "make wheel: the build failed; its output: $(BUILD_LOG)" >&2; exit 1; }
	@grep '^ductor build: ' $(BUILD_LOG); tail -n 1 $(BUILD_LOG); echo "(its output: $(BUILD_LOG))"

# The compiled build (setup.py's COMPILED, by mypyc) of the checkout:
# the sdist and the wheel built from it into dist/ (`make wheel`'s recipe, rebuilt when a file
# of the package changed), and the wheel's compiled modules unpacked beside their sources, so
# that the tests and `python -m processor` run them. A source edited afterwards is imported
# instead of its stale build (processor/__init__.py says so). `make clean-compiled` undoes it.
PACKAGE_FILES := $(shell find processor schemas -type f -not -name '*.so' -not -name '*.pyc' 2>/dev/null) setup.py pyproject.toml README.md
dist/.built: $(PACKAGE_FILES) | $(STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist . >/dev/null
	touch $@

compile: dist/.built ## the compiled build: dist/ and its compiled modules in the checkout
	$(PY) -c "import sys, zipfile, glob; z = zipfile.ZipFile(glob.glob('dist/*.whl')[0]); \
	so = [n for n in z.namelist() if n.endswith('.so')]; \
	sys.exit('the wheel has no compiled module: see the build above') if not so else None; \
	z.extractall('.', so); print(f'{len(so)} compiled modules unpacked from the wheel')"

clean-compiled: ## remove the compiled modules from the checkout (dist/ stays)
	find processor -name '*.so' -delete

# CLUSTER=1 also runs the end-to-end and scaling phases on a local three-broker cluster.
bench: setup ## the benchmark: prints throughput, ratios, latency and memory figures
	$(PY) -m processor.tools.bench $(if $(CLUSTER),--cluster)

# RUNS=30: how many runs one at a time; PER_S=100: other runs started per second meanwhile.
bench-latency: setup ## idle latency alone: the 4-step workflow one run at a time, per hop
	$(PY) -m processor.tools.bench_latency $(or $(RUNS),30) $(PER_S)

# REV=a941da2 (any git revision); BENCH_TREES_ARGS="--processes 1 2 --rounds 6".
bench-trees: setup ## end to end, this checkout against REV, alternating rounds on fresh databases
	$(PY) -m processor.tools.bench_trees $(or $(REV),$(error set REV, e.g. make bench-trees REV=a941da2)) $(BENCH_TREES_ARGS)

# Options of the run: CHAOS_ARGS="--seed 3 --kills 80" (python -m processor.tools.chaos --help).
chaos: setup ## the chaos run: >= 50 kills, broker and Postgres restarts, a 30 s freeze; prints figures
	$(PY) -m processor.tools.chaos $(CHAOS_ARGS)

demo: venv ## the live demo: infra, two processors, a worker, thousands of runs
	$(VENV)/bin/ductor demo

clean: ## remove the virtualenv and caches (keeps .infra)
	rm -rf $(VENV) $(BUILD_VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis *.egg-info build dist
	find processor -name '*.so' -delete
