# kiln entry points. `make setup` once per machine (root: installs Docker, debootstrap,
# docker-registry, the project, and builds kiln/base:bookworm); everything else after.
MODEL ?= tiny-moe
REGISTRY ?=
CHANNEL ?= experimental
PYTHON ?= python3
# the locked dev toolchain `make setup` installs (requirements/dev.lock): make's commands
# and the sessions nox starts run kiln, python, pytest, ruff and mypy from it
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: setup lock-dev demo build-image run smoke publish test lint check bench-build bench-cpu build-cuda clean-results

setup:
	./scripts/setup.sh

## re-resolve requirements/dev.lock after a change to a pyproject.toml's requirements (a unit
## test fails until this is run); then `make setup` installs it
lock-dev:
	@test -x .venv/bin/python || { echo "make lock-dev: no .venv here; run make setup first" >&2; exit 1; }
	python -m kiln_testkit.devlock

## the main job on the embedded default: build tiny-moe, serve it, prove it with the OpenAI client
demo: setup
	kiln smoke $(MODEL) --build

build-image:
	kiln build $(MODEL)

run:
	kiln run $(MODEL)

smoke:
	nox -s smoke -- $(MODEL)

publish:
	kiln publish $(MODEL) $(if $(REGISTRY),--registry $(REGISTRY)) --channel $(CHANNEL)

check:
	kiln check --all

## the tests CI runs (.ci/run): set-up, then the default nox sessions in order (lint, unit,
## integration, e2e with the kernels tier on its second worker), stopping at the first failure;
## lint and unit build nothing
## (kiln/base is built by the integration session)
test:
	./scripts/setup.sh --no-base
	nox

lint:
	nox -s lint

bench-build:
	nox -s bench_build

bench-cpu:
	nox -s bench_cpu

build-cuda:
	nox -s build_cuda

## forget smoke/publish records (per user: $KILN_STATE_DIR, else ~/.local/state/kiln); publish needs a new smoke
clean-results:
	d="$$(python3 -c 'from kiln.basics.paths import results_dir; print(results_dir())')" && [ -n "$$d" ] && rm -rf "$$d/smoke" "$$d/publish"
