# Entry points. `make demo`: set up from nothing and run the main job on the embedded default;
# `make test`: set up and run the test suite (what CI runs).
VENV ?= .venv
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint bench clean

setup: $(STAMP)

$(STAMP): envs/setup.sh envs/requirements.txt envs/constraints.txt envs/dev.txt pyproject.toml
	VENV=$(VENV) bash envs/setup.sh
	touch $@

demo: setup
	$(VENV)/bin/snakemake --profile profiles/local

# envs/slurm.sh: Debian's SLURM and munge for the tests' one-node cluster (tests/test_slurm.py)
test: setup
	bash envs/slurm.sh
	$(VENV)/bin/pytest -ra --durations=25

lint: setup
	$(VENV)/bin/snakemake --lint
	$(VENV)/bin/snakefmt --check Snakefile rules
	$(VENV)/bin/ruff check deploybench scripts tests benchmarks

clean:
	rm -rf results logs .snakemake
