#!/usr/bin/env bash
# Set up the embedded default from nothing: the Debian library perf_analyzer needs, a venv with
# pinned dependencies (torch==2.13.0 first: the CPU wheel), perf_analyzer from
# tritonclient==2.41.0's manylinux wheel in its own prefix, and this package (editable).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

if ! ldconfig -p 2>/dev/null | grep -q 'libb64.so.0d'; then
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends libb64-0d >/dev/null
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)
"${PIP[@]}" -U pip
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" -c envs/constraints.txt -r envs/requirements.txt -r envs/dev.txt
# The SLURM executor without its numpy>=2.4.5 pin (see requirements.txt); it runs on numpy 1.26.
"${PIP[@]}" --no-deps -c envs/constraints.txt snakemake-executor-plugin-slurm
# perf_analyzer: newer tritonclient wheels carry no binary; keep 2.41.0 apart from the client.
[ -x "$VENV/perf-analyzer/bin/perf_analyzer" ] ||
    "${PIP[@]}" --no-deps --target "$VENV/perf-analyzer" "tritonclient==2.41.0"
"${PIP[@]}" --no-deps -e .
"$VENV/bin/python" -c "import deploybench.tools as t; t.backend_directory(); print('tritonserver:', t.tritonserver_binary()); print('perf_analyzer:', t.perf_analyzer_binary())"
