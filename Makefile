# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.kernelfix-installed

# `make demo` and `make test` install the versions the suite is green with (the lock);
# `make test-latest` runs the suite against the newest releases, in a venv of its own.
CONSTRAINTS := constraints.txt
LATEST      ?= .venv-latest

# CPU-only machines get the CPU build of torch (a plain `pip install torch` would pull
# a multi-GB CUDA build); machines with an NVIDIA driver get the default build, which pins
# its own triton, so there the lock goes without its torch and triton lines. torch is
# installed first, so nothing else pulls in a CUDA build.
TORCH_CPU ?= torch==2.13.0
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
ifeq ($(HAS_GPU),yes)
TORCH := torch
LOCK  := $(VENV)/constraints-gpu.txt
else
TORCH := $(TORCH_CPU)
LOCK  := $(CONSTRAINTS)
endif

.PHONY: demo test test-all test-fast test-latest constraints lint bench clean

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	grep -v -E '^(torch|triton)==' $(CONSTRAINTS) > $(VENV)/constraints-gpu.txt
	$(BIN)/python -m pip install -q -c $(LOCK) $(TORCH)
	$(BIN)/python -m pip install -q -c $(LOCK) -e '.[dev,bench]'
	touch $(STAMP)

# The demo heals the two broken kernels of example_project with scripted answers from a
# replay cassette (no model needed). The test run itself fails: failing tests stay failed.
DEMO_CASSETTE := example_project/cassettes/demo.jsonl
DEMO_REPORT   := example_project/.kernelfix

demo: $(STAMP)
	@rm -rf $(DEMO_REPORT)
	@echo "== pytest example_project --kernelfix  (answers replayed from $(DEMO_CASSETTE))"
	@$(BIN)/python -m pytest example_project -q --tb=no -p no:cacheprovider \
		--kernelfix --kernelfix-model=replay:$(DEMO_CASSETTE) \
		|| echo "(pytest exit status $$?: the failing tests stay failed; healing is reported beside them)"
	@echo
	@echo "== the healed diff ($(DEMO_REPORT)/*.patch)"
	@cat $(DEMO_REPORT)/*.patch
	@$(BIN)/python -c "import json, sys; t = json.load(open('$(DEMO_REPORT)/report.json'))['totals']; \
		print(f\"== {t['healed']} of {t['bugs']} bugs healed; report: $(DEMO_REPORT)/report.md\"); \
		sys.exit(t['healed'] != 2)"

# Session tests (whole pytest runs and reruns in subprocesses) are ordered first and
# idle workers steal queued tests, so the longest do not form the tail; --durations
# shows where the time goes.
# The slow sessions (hangs waited out, the hostile suite, the same heal under xdist) are
# left to `make test-all`, which CI runs too when it has the time.
test: lint
	$(BIN)/python -m pytest -n 2 --dist worksteal --durations=25 -m "not slow" tests

# Everything, the slow sessions first.
test-all: lint
	$(BIN)/python -m pytest -n 2 --dist worksteal --durations=25 tests

# Unit tests only, no lint: the inner loop (under a minute on 2 cores).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist worksteal -m "not session" tests

# The same suite against the newest release of every dependency, without the lock, so
# drift is found on purpose (torch stays the CPU build on machines without a GPU).
test-latest:
	test -x $(LATEST)/bin/python || $(PYTHON) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install -q --upgrade pip
	$(LATEST)/bin/python -m pip install -q --upgrade $(TORCH)
	$(LATEST)/bin/python -m pip install -q --upgrade --upgrade-strategy eager \
		$(TORCH) -e '.[dev,bench]'
	$(LATEST)/bin/python -m pip freeze --exclude-editable > $(LATEST)/versions.txt
	@echo "== the versions under test: $(LATEST)/versions.txt (diff it with $(CONSTRAINTS))"
	$(LATEST)/bin/python -m pytest -n 2 --dist worksteal --durations=25 -m "not slow" tests

# Rewrite the lock from $(VENV) after `make test` is green there: its header comment is
# kept, then pip freeze without the project, torch's local label (+cpu) dropped.
constraints:
	{ sed '/^[^#]/,$$d' $(CONSTRAINTS); \
	  $(BIN)/python -m pip freeze --exclude-editable | sed -E 's/\+[a-z0-9.]+$$//'; \
	} > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)

lint: $(STAMP)
	$(BIN)/ruff check pytest_kernelfix tests benchmarks example_project
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/matcher_bench.py

clean:
	rm -rf $(VENV) $(LATEST) build dist *.egg-info .pytest_cache example_project/.kernelfix
