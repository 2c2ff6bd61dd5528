# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.kernelfix-installed

# CPU-only machines get the CPU build of torch (a plain `pip install torch` would pull
# a multi-GB CUDA build); machines with an NVIDIA driver get the default build.
TORCH_CPU ?= torch==2.13.0
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)

.PHONY: demo test test-fast lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
ifeq ($(HAS_GPU),yes)
	$(BIN)/python -m pip install -q torch
else
	$(BIN)/python -m pip install -q $(TORCH_CPU)
endif
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
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
test: lint
	$(BIN)/python -m pytest -n 2 --dist worksteal --durations=25 tests

# Unit tests only, no lint: the inner loop (under a minute on 2 cores).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist worksteal -m "not session" tests

lint: $(STAMP)
	$(BIN)/ruff check pytest_kernelfix tests benchmarks example_project
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/matcher_bench.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache example_project/.kernelfix
