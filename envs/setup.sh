#!/usr/bin/env bash
# Set up the embedded default from nothing: the Debian library perf_analyzer needs, a venv with
# pinned dependencies (torch==2.13.0 first: the CPU wheel), perf_analyzer from
# tritonclient==2.41.0's manylinux wheel in its own prefix, and this package (editable).
# uv installs (envs/dev.txt pins it; pip only installs uv): it resolves as pip does and links
# from its cache, so a setup with the cache warm takes under a minute, not three (docs/tests.md).
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
"$VENV/bin/pip" install -q --disable-pip-version-check "$(grep '^uv==' envs/dev.txt)"

# A pip setting (pip.conf or PIP_*; the last one pip lists wins): uv reads neither, so the
# indexes, wheel folders, constraints and certificates pip would use are handed to it.
pip_setting() {
    "$VENV/bin/pip" config list 2>/dev/null | sed -n "s/^[^=]*\.$1='\(.*\)'$/\1/p" | tail -n 1
}
UV=("$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python")
# pip reads every index for every package; uv's default stops at the first that has it
UV+=(--index-strategy unsafe-best-match)
for url in $(pip_setting index-url); do UV+=(--index-url "$url"); done
for url in $(pip_setting extra-index-url); do UV+=(--extra-index-url "$url"); done
for dir in $(pip_setting find-links); do UV+=(--find-links "$dir"); done
for file in $(pip_setting constraint); do UV+=(--constraint "$file"); done
cert=$(pip_setting cert)
[ -z "$cert" ] || export SSL_CERT_FILE="$cert"

"${UV[@]}" -U pip
"${UV[@]}" "torch==2.13.0"
"${UV[@]}" -c envs/constraints.txt -r envs/requirements.txt -r envs/dev.txt
# The SLURM executor without its numpy>=2.4.5 pin (see requirements.txt); it runs on numpy 1.26.
"${UV[@]}" --no-deps -c envs/constraints.txt snakemake-executor-plugin-slurm
# perf_analyzer: newer tritonclient wheels carry no binary; keep 2.41.0 apart from the client.
[ -x "$VENV/perf-analyzer/bin/perf_analyzer" ] ||
    "${UV[@]}" --no-deps --target "$VENV/perf-analyzer" "tritonclient==2.41.0"
"${UV[@]}" --no-deps -e .
"$VENV/bin/python" -c "import deploybench.tools as t; t.backend_directory(); print('tritonserver:', t.tritonserver_binary()); print('perf_analyzer:', t.perf_analyzer_binary())"
