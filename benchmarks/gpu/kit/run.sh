#!/usr/bin/env bash
# The GPU kit's device command (benchmarks/gpu/README.md, "The kit"): in one call on a lent GPU
# machine, check the machine in a minute (the canary), then run TFT's `ts-trace` end to end
# through the workflow, fp32 then fp16, each its own Snakemake run (export, conversion, accuracy
# against the fp32 framework on the GPU, offline and online through tritonserver and
# perf_analyzer), packing what is done after each, and leave it under $OUT.
#
#   bash benchmarks/gpu/kit/run.sh [GPU] [PRECISION ...]     (default: auto fp32 fp16)
#
# GPU: a `gpus` entry the kit sizes (H100-pip, H200-pip; cpu rehearses it here), or `auto`: the
# entry of the GPU nvidia-smi names. Run from the repository root. Settings (environment):
#   OUT               where the results go (the device tool sets it; default ./kit-out)
#   PYTHON            the Python with PyTorch (default python3, the device image's)
#   KIT_ARCHIVE       the kit (default .gpukit/kit.tar.xz); KIT_DIR where it is unpacked
#   KIT_CONFIGFILES   more config files layered after benchmarks/gpu/kit/kit.yaml
#   KIT_BUDGET_S      the whole call, at most (default 540: one call under the device's 600-s
#                     timeout_s; a machine's 15 minutes hold its start and one such call)
#   KIT_FIRST_SHARE_PCT  the first precision's share of what is left after the canary, when
#                     another follows (default 60: fp32, the column DLE's ts-trace rows compare with)
#   KIT_CANARY_S      the canary's deadline (default 60)
#   KIT_IN_PROCESS    1: run benchmarks/gpu/torchscript_on_gpu.py after the runs, in what is
#                     left of the budget (default 0: its numbers exist), with
#                     KIT_IN_PROCESS_ARGS after its own (the tests: --device cpu ...)
# Each precision's run gets its share of what is left of the budget (the first
# KIT_FIRST_SHARE_PCT %, the last all of it), less PACK_RESERVE_S per run to stop and pack; a
# run that ends early leaves its time to the next. A run still going when its share is up (or
# when this script gets SIGUSR1) is cut as SLURM's time limit cuts a job (share.sh): its
# measurement jobs keep the trials they finished (deploybench.partial), which are packed and
# shown marked PARTIAL, and the call goes on.
# $OUT gets run.log, environment.json (the kit, the software, the GPU and driver nvidia-smi
# names), nvidia-smi.txt, gpu-apps.csv (the GPU's compute processes during the first run's
# first offline point: the server on the GPU), canary.json, summary.txt, beside_published.md
# (the rows beside the published A100 ts-trace rows) and results.tar.gz (rewritten after each
# run).
# Exit status: 0 when every target was made; 2 a bad argument or kit; 3 the machine or the
# canary failed (the step is named, nothing else ran); 4 a run was cut at its share or not
# started for want of time (what was kept is said), nothing failed; else the first failing
# run's.
set -uo pipefail

GPU=${1:-auto}
shift || true
PRECISIONS=("$@")
[ ${#PRECISIONS[@]} -gt 0 ] || PRECISIONS=(fp32 fp16)
case "$GPU" in *[!A-Za-z0-9_-]*|"") echo "run.sh: bad GPU entry name '$GPU'" >&2; exit 2 ;; esac
for p in "${PRECISIONS[@]}"; do
    case "$p" in fp32|fp16) ;; *) echo "run.sh: bad precision '$p' (fp32, fp16)" >&2; exit 2 ;; esac
done

OUT=${OUT:-$PWD/kit-out}
PYTHON=${PYTHON:-python3}
KIT_ARCHIVE=${KIT_ARCHIVE:-.gpukit/kit.tar.xz}
KIT_DIR=${KIT_DIR:-/tmp/deploybench-kit}
KIT_BUDGET_S=${KIT_BUDGET_S:-540}
KIT_FIRST_SHARE_PCT=${KIT_FIRST_SHARE_PCT:-60}
KIT_CANARY_S=${KIT_CANARY_S:-60}
KIT_IN_PROCESS=${KIT_IN_PROCESS:-0}
PACK_RESERVE_S=25  # the cut's kill-after (15 s) and packing
CUT_STATUS=4
RUN_DIR=$PWD
KIT_HOME=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=benchmarks/gpu/kit/share.sh
source "$KIT_HOME/share.sh"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
started=$(date +%s)
elapsed() { echo $(( $(date +%s) - started )); }
say() { echo "[kit $(elapsed)s] $*"; }
stop() { say "STOPPED at step '$1': $2"; pack; exit 3; }
RUNS=()
IN_PROCESS=()
pack() {
    # not the artifacts: a full-size TFT is tens of MB, and each file back is 16 MiB at most
    [ -e "$RUN_DIR/results" ] || return 0
    tar -czf "$OUT/results.tar.gz.part" --ignore-failed-read --exclude='*.pt' \
        --exclude='*.onnx' --exclude=__pycache__ results/kit-canary "${RUNS[@]}" \
        "${RUNS[@]/#results/logs}" .snakemake/log "${IN_PROCESS[@]}" 2>/dev/null
    mv -f "$OUT/results.tar.gz.part" "$OUT/results.tar.gz"
}

# 1. the tools the kit relies on, before anything is unpacked (the kit is unpacked by Python's
# tarfile: no xz needed)
say "checking the tools"
missing=()
for tool in tar gzip timeout setsid "$PYTHON"; do
    command -v "$tool" > /dev/null || missing+=("$tool")
done
[ ${#missing[@]} -eq 0 ] || stop tools "not on PATH: ${missing[*]}"
if [ "$GPU" != cpu ]; then
    command -v nvidia-smi > /dev/null || stop machine "no nvidia-smi: this machine shows no GPU"
    nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || stop machine "nvidia-smi failed: $(tail -2 "$OUT/nvidia-smi.txt")"
    gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    if [ "$GPU" = auto ]; then
        case "$gpu_name" in
            *H200*) GPU=H200-pip ;;
            *H100*) GPU=H100-pip ;;
            *) stop machine "no kit entry for the GPU '$gpu_name' (H100-pip, H200-pip): name one" ;;
        esac
        say "GPU '$gpu_name': entry $GPU"
    fi
else
    echo "no GPU: the cpu entry" > "$OUT/nvidia-smi.txt"
    echo "# no GPU: the cpu entry, no compute processes to list" > "$OUT/gpu-apps.csv"
fi
[ "$GPU" != auto ] || stop machine "auto needs a GPU: name the entry"

# 2. install: unpack the kit beside nothing else, check it was built for this Python
say "unpacking $KIT_ARCHIVE into $KIT_DIR"
[ -f "$KIT_ARCHIVE" ] || { say "no kit at $KIT_ARCHIVE: run benchmarks/gpu/kit/bundle.py first"; exit 2; }
rm -rf "$KIT_DIR" && mkdir -p "$KIT_DIR" || exit 2
"$PYTHON" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
    "$KIT_ARCHIVE" "$KIT_DIR" || stop unpack "unpacking $KIT_ARCHIVE failed (above)"
"$PYTHON" - "$KIT_DIR/kit.json" <<'EOF' || exit 2
import json, sys
built = json.load(open(sys.argv[1]))["python"]
here = f"{sys.version_info.major}.{sys.version_info.minor}"
if built != here:
    sys.exit(f"run.sh: the kit was built for Python {built}, this is {here} ({sys.executable}): "
             f"bundle.py --python {here}")
EOF
export PYTHONPATH="$KIT_DIR/site:$RUN_DIR${PYTHONPATH:+:$PYTHONPATH}"
export DEPLOYBENCH_TRITON_ROOT="$KIT_DIR/pytriton/tritonserver"
export DEPLOYBENCH_PERF_ANALYZER="$KIT_DIR/perf-analyzer/bin/perf_analyzer"
export PYTHONUNBUFFERED=1

# 3. the machine and the software, before anything runs
say "recording the machine"
"$PYTHON" - "$OUT/environment.json" "$GPU" "$KIT_DIR/kit.json" <<'EOF' || stop environment "see above"
import datetime, json, platform, subprocess, sys
from importlib import metadata
from deploybench import provenance, tools
env = {"gpu_entry": sys.argv[2], "python": sys.version.split()[0], "machine": platform.platform()}
env["date"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
env["kit"] = json.load(open(sys.argv[3]))
# what labels the rows: the GPUs nvidia-smi names, with their driver
env["nvidia_smi"] = provenance.gpus()
for name in ("torch", "numpy", "onnxruntime", "onnx", "pandas", "snakemake", "tritonclient"):
    try:
        env[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        env[name] = None
import torch
env["cuda"] = torch.version.cuda
env["cuda_available"] = torch.cuda.is_available()
env["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
env["tritonserver"] = str(tools.tritonserver_binary())
pa = subprocess.run([str(tools.perf_analyzer_binary()), "--version"], capture_output=True,
                    text=True, env=tools.perf_analyzer_environment(), check=False)
env["perf_analyzer_version"] = (pa.stdout + pa.stderr).strip()[-200:]
env["perf_analyzer_rc"] = pa.returncode
json.dump(env, open(sys.argv[1], "w"), indent=1)
print(json.dumps({k: v for k, v in env.items() if k != "kit"}))
EOF

# 4. the canary: the kit's server and perf_analyzer, FP32 and FP16, on this device
DEVICE=gpu
[ "$GPU" = cpu ] && DEVICE=cpu
say "canary on $DEVICE (${KIT_CANARY_S} s at most)"
mkdir -p results
timeout --signal=TERM --kill-after=10 "$KIT_CANARY_S" "$PYTHON" -m deploybench canary \
    --device "$DEVICE" --out results/kit-canary --deadline-s "$((KIT_CANARY_S - 5))"
canary=$?
cp results/kit-canary/canary.json "$OUT/canary.json" 2>/dev/null
if [ $canary -ne 0 ]; then
    failed=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["failed_step"])' \
        results/kit-canary/canary.json 2>/dev/null)
    stop "canary ${failed:-(stopped at ${KIT_CANARY_S} s)}" "exit status $canary; see canary.json, results/kit-canary/"
fi

# The GPU's compute processes while the first offline point is measured (its perf_analyzer log
# has begun): evidence that the server ran on the GPU, three snapshots a second apart.
gpu_apps() {
    local perf_log=$1 taken=0
    while [ $taken -lt 3 ]; do
        if [ -s "$perf_log" ]; then
            echo "# $(date -u +%FT%TZ) the first offline point of $2 (nvidia-smi --query-compute-apps)"
            nvidia-smi --query-compute-apps=timestamp,gpu_uuid,pid,process_name,used_gpu_memory \
                --format=csv 2>&1
            taken=$((taken + 1))
        fi
        sleep 1
    done >> "$OUT/gpu-apps.csv"
}

# What a cut run kept: each scenario's finished points (deploybench.partial).
kept_points() {
    "$PYTHON" - "$1" <<'EOF'
import sys
from pathlib import Path
from deploybench.partial import finished_points, partial_path, planned_points, read
for scenario in ("offline", "online"):
    csv = Path(sys.argv[1]) / f"{scenario}.csv"
    if csv.exists():
        print(f"  {scenario}: complete")
        continue
    kept = read(partial_path(csv))
    done = [f"batch {p[0]['batch']} conc. {p[0]['concurrency']}" for p in finished_points(kept)]
    print(f"  {scenario}: {len(done)} of {planned_points(kept) or '?'} points kept"
          + (f" ({', '.join(done)})" if done else ""))
EOF
}

# 5. the workflow: each precision its own run (accuracy, offline, online), packed after each
CONFIGS=(benchmarks/gpu/kit/kit.yaml)
for c in ${KIT_CONFIGFILES:-}; do CONFIGS+=("$c"); done
status=0
remaining=${#PRECISIONS[@]}
for p in "${PRECISIONS[@]}"; do
    left=$(( KIT_BUDGET_S - $(elapsed) - PACK_RESERVE_S * remaining ))
    share=$left
    [ "$remaining" -eq 1 ] || share=$(( left * KIT_FIRST_SHARE_PCT / 100 ))
    remaining=$(( remaining - 1 ))
    if [ "$share" -lt 30 ]; then
        say "$p: not run, ${share} s left of the ${KIT_BUDGET_S} s budget"
        [ $status -ne 0 ] || status=$CUT_STATUS
        continue
    fi
    run="results/tft/$GPU/ts-trace/$p"
    RUNS+=("$run")
    apps=
    if [ "$GPU" != cpu ] && [ ${#RUNS[@]} -eq 1 ]; then
        gpu_apps "logs/tft/$GPU/ts-trace/$p/offline.perf_analyzer.log" "$run" &
        apps=$!
    fi
    say "snakemake $run (${share} s at most)"
    run_with_share "$share" "$PYTHON" -m snakemake \
        "$run/accuracy.csv" "$run/offline.csv" "$run/online.csv" \
        --profile profiles/local --scheduler greedy --keep-going --cores 4 \
        --resources gpu=1 triton_server=1 --configfile "${CONFIGS[@]}"
    code=$?
    [ -z "$apps" ] || kill "$apps" 2>/dev/null
    if [ "$CUT" = 1 ]; then
        say "$p: CUT at its share (${share} s), snakemake exit status $code; kept:"
        kept_points "$run"
        code=$CUT_STATUS
    else
        say "$p: snakemake exit status $code"
    fi
    [ $status -ne 0 ] || status=$code
    "$PYTHON" -m deploybench summary "${RUNS[@]}" > "$OUT/summary.txt" 2>&1
    "$PYTHON" benchmarks/gpu/kit/beside_published.py . --gpu "$GPU" --precisions "${PRECISIONS[@]}" \
        > "$OUT/beside_published.md" 2>&1
    pack
done
cat "$OUT/summary.txt" "$OUT/beside_published.md" 2>/dev/null

# 6. in process, if asked: fp16 TorchScript of the other models on the GPU (no Triton)
if [ "$KIT_IN_PROCESS" = 1 ]; then
    left=$(( KIT_BUDGET_S - $(elapsed) - PACK_RESERVE_S ))
    if [ "$left" -ge 30 ]; then
        say "in-process fp16 checks: fastpitch bert nnunet (${left} s at most)"
        timeout --kill-after=15 "$left" "$PYTHON" \
            benchmarks/gpu/torchscript_on_gpu.py --models fastpitch bert nnunet \
            --out "$RUN_DIR/results/kit-in-process" --deadline-s "$((left - 20))" --iterations 20 \
            ${KIT_IN_PROCESS_ARGS:-}
        say "in-process exit status $?"
        IN_PROCESS=(results/kit-in-process)
        pack
    else
        say "in-process checks: not run, ${left} s left of the budget"
    fi
fi
ls -la "$OUT"
say "done"
exit $status
