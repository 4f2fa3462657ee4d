#!/usr/bin/env bash
# The driver: a venv that only plans the DAG and submits jobs (`make driver`), for a login node
# where envs/setup.sh cannot run (no apt or sudo, a glibc too old for pytriton). pip only:
# Snakemake, its SLURM executor, pyyaml, jsonschema (envs/driver.txt) and this package without
# its dependencies. No torch, TensorFlow, pytriton or tritonclient: each rule's work runs in its
# image (profiles/slurm). But each SLURM job starts with this venv's Snakemake on its node, which
# then runs the rule in the image (snakemake-interface-executor-plugins, RemoteExecutor.
# get_python_executable: sys.executable while software deployment is on a shared file system, the
# default): keep the venv, like the checkout and the working directory, on a file system the
# compute nodes see at the same path.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-driver}
PYTHON=${PYTHON:-python3}

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    found=$("$PYTHON" --version 2>&1 || echo "no $PYTHON")
    cat >&2 <<EOF
envs/driver.sh: needs Python >= 3.11 (Snakemake 9); $PYTHON is: $found.
Get one, then run again with PYTHON=<it>, e.g.:
  module load python/3.11        # an environment module (module avail python lists them)
  PYTHON=python3.11 bash envs/driver.sh
or, without admin rights, with uv (https://docs.astral.sh/uv/):
  uv python install 3.11
  PYTHON=\$(uv python find 3.11) bash envs/driver.sh
EOF
    exit 1
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)
"${PIP[@]}" -U pip
# With their dependencies (the SLURM plugin's numpy and pandas among them): no numpy<2 pin here.
# --no-compile: Python compiles what Snakemake imports when it first runs; byte-compiling every
# file of numpy and pandas up front doubles the install time (more on a networked home).
"${PIP[@]}" --no-compile -r envs/driver.txt
"${PIP[@]}" --no-deps -e .
echo "driver: snakemake $("$VENV/bin/snakemake" --version) in $VENV;" \
    "$("$VENV/bin/python" -c 'import deploybench.planning.run_plan, snakemake_executor_plugin_slurm as s; print("deploybench.planning.run_plan and", s.__name__, "import")')"
