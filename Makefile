# Entry points. `make demo`: set up from nothing and run the main job on the embedded default;
# `make test`: set up, lint, and run the test suite (what CI runs: .ci/run).
VENV ?= .venv
STAMP := $(VENV)/.installed

# Python writes its bytecode cache (__pycache__) in every command here: a machine that sets
# PYTHONDONTWRITEBYTECODE=1 (this one does) makes each process compile again every module it
# imports, and a run or the tests start hundreds (importing snakemake, pandas, torch and altair
# took 11-12 s that way against 5 s from the cache; docs/tests.md "Where the time goes").
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup driver demo test test-fast test-under-load lint bench clean locks

setup: $(STAMP)

$(STAMP): envs/setup.sh envs/requirements.txt envs/constraints.txt envs/dev.txt pyproject.toml
	VENV=$(VENV) bash envs/setup.sh
	touch $@

# `make driver`: a login node's venv ($(DRIVER_VENV)) that only plans and submits with
# profiles/slurm: Snakemake, its SLURM executor and this package; pip only (no apt, sudo, torch,
# TensorFlow or pytriton), any Linux with Python >= 3.11 (PYTHON=...; see envs/driver.sh).
DRIVER_VENV ?= .venv-driver
driver:
	VENV=$(DRIVER_VENV) bash envs/driver.sh

# The default target at the demo's sizing (config/demo.yaml): the run, its charts and report
# page (reports/targets/), then its summary.
demo: setup
	$(VENV)/bin/snakemake --profile profiles/local --configfile config/demo.yaml
	$(VENV)/bin/deploybench summary

# The hash-pinned locks of the container images (envs/containers/<image>.lock) from their
# requirements and images: settings in config/config.yaml (needs PyPI; deploybench/locks.py).
locks: setup
	$(VENV)/bin/python -m deploybench.locks

# envs/test-packages.sh: Debian packages for the tests (SLURM and munge for tests/test_slurm.py,
# debootstrap for tests/test_image_rehearsal.py, chromium for tests/test_browser.py).
# Two pytest-xdist workers, a module whole on one (its module fixtures set up once) and in the
# collected order (the smoke run's modules last, tests/conftest.py); the shared smoke run is one
# for both. Two, not one a core: a SLURM cluster and the smoke run are one each (docs/tests.md).
test: setup lint
	bash envs/test-packages.sh
	$(VENV)/bin/pytest -ra --durations=25 -n 2 --dist loadfile --no-loadscope-reorder

# The inner loop: the unit tests, no real process started (under 3 minutes; docs/tests.md)
test-fast: setup
	$(VENV)/bin/pytest -q -m "not e2e and not slow and not rehearsal" --durations=10

# `make test` with LOAD (default 1) CPU-burning processes beside it, as when another job shares
# the machine (tests/load.py; docs/tests.md#under-load). The system python3: no venv yet.
LOAD ?= 1
test-under-load:
	python3 -m tests.load --burners $(LOAD) -- $(MAKE) test

# Style, types and the documentation site (docs/, mkdocs.yml: a broken link, anchor or nav entry
# is a finding); any finding fails (and so fails `make test` and CI before the tests run).
# mkdocs without --quiet: it hides the warnings that --strict counts (mkdocs 1.6), so none fails.
lint: setup
	$(VENV)/bin/snakemake --lint
	$(VENV)/bin/snakefmt --check Snakefile rules
	$(VENV)/bin/ruff check deploybench scripts tests benchmarks envs
	$(VENV)/bin/ruff format --check deploybench scripts tests benchmarks envs
	$(VENV)/bin/mypy deploybench
	$(VENV)/bin/mkdocs build --strict

clean:
	rm -rf results logs .snakemake
