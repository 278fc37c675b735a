# The two set-up commands of the README:
#   make serve   installs what is needed and starts the service on its embedded defaults
#   make test    installs what is needed and runs the whole test suite (what CI runs)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: serve test install install-dev lint typecheck pytest test-typescript deploy-test bench clean

$(BIN)/python:
	@echo "== creating the virtualenv $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Each install runs again only when pyproject.toml changed since it last succeeded.
install: $(VENV)/.installed-server

install-dev: $(VENV)/.installed-dev
	bash scripts/ensure-postgres.sh
	bash scripts/ensure-chromium.sh

# Not --quiet: the first install takes a minute or two, and pip's lines show it advancing.
$(VENV)/.installed-server: pyproject.toml | $(BIN)/python
	@echo "== installing genhook and its dependencies into $(VENV) (a minute or two the first time)"
	$(BIN)/python -m pip install --progress-bar on -e '.[server]'
	@echo "== installed; starting the service"
	touch $@

# The tests also run the local-model engine on tiny pipelines: the diffusers extra, with torch
# pinned so pip takes the wheel it finds (a CPU build in PIP_FIND_LINKS, or pip's cache)
# rather than the newest multi-GB CUDA build from the index. TORCH_SPEC=torch keeps any.
TORCH_SPEC ?= torch==2.13.0

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[server,dev,otel,diffusers]' '$(TORCH_SPEC)'
	touch $@ $(VENV)/.installed-server

# make serve ARGS=--dev: webhooks to a receiver on this machine (genhook serve --help)
serve: install
	$(BIN)/genhook serve $(ARGS)

lint:
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

typecheck:
	$(BIN)/mypy

# Two test processes, each file kept in one of them (a module's live service is started
# once); PYTEST_WORKERS=0 runs the suite in this process alone.
PYTEST_WORKERS ?= 2

pytest:
	$(BIN)/python -m pytest -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile --durations=30

# The TypeScript SDK (sdks/typescript): tsc --strict, then Node's test runner, whose tests
# start this checkout's service with the venv's Python.
test-typescript: install-dev
	bash scripts/ensure-node.sh
	cd sdks/typescript && npm ci --no-audit --no-fund --silent \
		&& GENHOOK_PYTHON=$(abspath $(BIN)/python) npm test --silent

test: install-dev lint typecheck pytest test-typescript

# The container image built for real (podman from Debian's packages) and deploy/compose.yaml
# run from it with podman-compose (docs/deploy.md#testing-the-image); apart from `make test`,
# CI runs it after.
deploy-test: install
	PYTHON=$(abspath $(BIN)/python) bash scripts/deploy-test.sh

bench: install-dev
	$(BIN)/python benchmarks/submit.py
	$(BIN)/python benchmarks/image_edit.py
	$(BIN)/python benchmarks/webhook_delivery.py
	$(BIN)/python benchmarks/verify.py
	$(BIN)/python benchmarks/watch.py
	$(BIN)/python benchmarks/video.py
	$(BIN)/python benchmarks/upstream.py
	$(BIN)/python benchmarks/hostile_bodies.py
	$(BIN)/python benchmarks/audio.py
	$(BIN)/python benchmarks/task_api.py
	$(BIN)/python benchmarks/webhook_fairness.py
	$(BIN)/python benchmarks/idle.py
	$(BIN)/python benchmarks/e2e_latency.py
	$(BIN)/python benchmarks/nsfw_threshold.py
	$(BIN)/python benchmarks/console.py
	$(BIN)/python benchmarks/blob_store.py
	$(BIN)/python benchmarks/metrics.py
	$(BIN)/python benchmarks/task_overhead.py
	$(BIN)/python benchmarks/pg_ping.py
	$(BIN)/python benchmarks/complete_txn.py
	$(BIN)/python benchmarks/faults.py
	$(BIN)/python benchmarks/batching.py
	$(BIN)/python benchmarks/local_models.py
	$(BIN)/python benchmarks/tracing.py
	$(BIN)/python benchmarks/predictor.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
