# MedSegBenchmarker. `make quickstart` and `make test` each do all their own set-up (idempotent).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
export HF_HUB_OFFLINE := 1
export PYTHONUNBUFFERED := 1

.PHONY: setup quickstart test test-fast bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
	# torch first: torch 2.14.1 / torchvision 0.29.1 from the package registry, with their CUDA libraries (~6.7 GB venv; runs on CPU)
	$(BIN)/python -m pip install -q "torch==2.14.1" "torchvision==0.29.1" || $(BIN)/python -m pip install -q "torch>=2.4,<2.15" "torchvision>=0.19,<0.30"
	$(BIN)/python -m pip install -q -e ".[dev]"
	rm -f $(VENV)/.installed-* && touch $@

setup: $(STAMP)

quickstart: setup
	$(BIN)/msb run configs/study.yaml

test: setup
	$(BIN)/python -m pytest -q -ra --durations=15

test-fast: setup
	$(BIN)/python -m pytest -q -ra -m "not slow"

# every benchmark against its competitors (docs/performance.md); < 10 min on 2 cores
bench: setup
	$(BIN)/python scripts/bench_analysis.py
	$(BIN)/python scripts/bench_audit.py
	$(BIN)/python scripts/bench_metrics.py --pairs 30 --busi 10
	$(BIN)/python scripts/bench_eval.py
	$(BIN)/python scripts/bench_train.py

clean:
	rm -rf runs .pytest_cache
