#!/usr/bin/env bash
# The GPU kit's device command (benchmarks/gpu/README.md, "The kit"): in one call on a lent GPU
# machine, unpack the kit that benchmarks/gpu/kit/bundle.py made, record the machine, run TFT's
# `ts-trace` fp32 and fp16 end to end through the workflow (export, conversion, accuracy against
# the fp32 framework on the GPU, offline and online through tritonserver and perf_analyzer), then
# the in-process fp16 checks of FastPitch, nnU-Net and BERT, and leave what it made under $OUT.
#
#   bash benchmarks/gpu/kit/run.sh [GPU] [PRECISION ...]     (default: H100-pip fp32 fp16)
#
# Run from the repository root. Settings (environment):
#   OUT               where the results go (the device tool sets it; default ./kit-out)
#   PYTHON            the Python with PyTorch (default python3, the device image's)
#   KIT_ARCHIVE       the kit (default .gpukit/kit.tar.xz); KIT_DIR where it is unpacked
#   KIT_CONFIGFILES   more config files layered after benchmarks/gpu/kit/kit.yaml
#   KIT_IN_PROCESS    1: run benchmarks/gpu/torchscript_on_gpu.py too (default: 1 unless GPU=cpu),
#                     with KIT_IN_PROCESS_ARGS after its own (the tests: --device cpu ...)
#   KIT_DEADLINE_S    seconds the workflow may take (default 360), KIT_IN_PROCESS_S (100)
# $OUT gets run.log, kit.json, nvidia-smi.txt, environment.json, summary.txt,
# beside_published.md (the rows beside the published A100 ts-trace rows) and results.tar.gz.
# The CPU entry rehearses the same command here: `bash benchmarks/gpu/kit/run.sh cpu fp32`
# (tests/test_gpu_kit.py). Exit status: the workflow's (0 when every target was made).
set -uo pipefail

GPU=${1:-H100-pip}
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
KIT_DEADLINE_S=${KIT_DEADLINE_S:-360}
KIT_IN_PROCESS_S=${KIT_IN_PROCESS_S:-100}
if [ "$GPU" = cpu ]; then KIT_IN_PROCESS=${KIT_IN_PROCESS:-0}; else KIT_IN_PROCESS=${KIT_IN_PROCESS:-1}; fi
RUN_DIR=$PWD
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
started=$(date +%s)
say() { echo "[kit $(( $(date +%s) - started ))s] $*"; }

# 1. install: unpack the kit beside nothing else, check it was built for this Python
say "unpacking $KIT_ARCHIVE into $KIT_DIR"
[ -f "$KIT_ARCHIVE" ] || { say "no kit at $KIT_ARCHIVE: run benchmarks/gpu/kit/bundle.py first"; exit 2; }
rm -rf "$KIT_DIR" && mkdir -p "$KIT_DIR" && tar -xJf "$KIT_ARCHIVE" -C "$KIT_DIR" || exit 2
"$PYTHON" - "$KIT_DIR/kit.json" <<'EOF' || exit 2
import json, sys
built = json.load(open(sys.argv[1]))["python"]
here = f"{sys.version_info.major}.{sys.version_info.minor}"
if built != here:
    sys.exit(f"run.sh: the kit was built for Python {built}, this is {here} ({sys.executable}): "
             f"bundle.py --python {here}")
EOF
cp "$KIT_DIR/kit.json" "$OUT/kit.json"
export PYTHONPATH="$KIT_DIR/site:$RUN_DIR${PYTHONPATH:+:$PYTHONPATH}"
export DEPLOYBENCH_TRITON_ROOT="$KIT_DIR/pytriton/tritonserver"
export DEPLOYBENCH_PERF_ANALYZER="$KIT_DIR/perf-analyzer/bin/perf_analyzer"
export PYTHONUNBUFFERED=1

# 2. the machine and the software, before anything runs
say "recording the machine"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || echo "no nvidia-smi" > "$OUT/nvidia-smi.txt"
"$PYTHON" - "$OUT/environment.json" "$GPU" <<'EOF'
import json, platform, subprocess, sys
from importlib import metadata
from deploybench import tools
env = {"gpu_entry": sys.argv[2], "python": sys.version.split()[0], "machine": platform.platform()}
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
print(json.dumps(env))
EOF

# 3. the workflow: each precision's accuracy, offline and online CSVs
TARGETS=()
for p in "${PRECISIONS[@]}"; do
    for f in accuracy offline online; do TARGETS+=("results/tft/$GPU/ts-trace/$p/$f.csv"); done
done
CONFIGS=(benchmarks/gpu/kit/kit.yaml)
for c in ${KIT_CONFIGFILES:-}; do CONFIGS+=("$c"); done
say "snakemake ${TARGETS[*]}"
timeout --signal=TERM --kill-after=30 "$KIT_DEADLINE_S" "$PYTHON" -m snakemake "${TARGETS[@]}" \
    --profile profiles/local --scheduler greedy --keep-going --cores 4 \
    --resources gpu=1 triton_server=1 \
    --configfile "${CONFIGS[@]}"
status=$?
say "snakemake exit status $status"
RUNS=()
for p in "${PRECISIONS[@]}"; do RUNS+=("results/tft/$GPU/ts-trace/$p"); done
"$PYTHON" -m deploybench summary "${RUNS[@]}" > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
"$PYTHON" benchmarks/gpu/kit/beside_published.py . --gpu "$GPU" --precisions "${PRECISIONS[@]}" \
    > "$OUT/beside_published.md" 2>&1
cat "$OUT/beside_published.md"

# 4. in process: fp16 TorchScript of the other models on the GPU (no Triton)
IN_PROCESS=()
if [ "$KIT_IN_PROCESS" = 1 ]; then
    say "in-process fp16 checks: fastpitch bert nnunet"
    timeout --kill-after=15 "$((KIT_IN_PROCESS_S + 30))" "$PYTHON" \
        benchmarks/gpu/torchscript_on_gpu.py --models fastpitch bert nnunet \
        --out "$RUN_DIR/results/kit-in-process" --deadline-s "$KIT_IN_PROCESS_S" --iterations 20 \
        ${KIT_IN_PROCESS_ARGS:-}
    say "in-process exit status $?"
    IN_PROCESS=(results/kit-in-process)
fi

# 5. what comes back: the device returns at most 8 files, so the rest travels as one archive
say "packing results"
# (not the artifacts: a full-size TFT is tens of MB, and each file back is 16 MiB at most)
tar -czf "$OUT/results.tar.gz" --ignore-failed-read --exclude='*.pt' --exclude='*.onnx' \
    --exclude=__pycache__ "results/tft/$GPU" "logs/tft/$GPU" .snakemake/log "${IN_PROCESS[@]}" \
    2>/dev/null
ls -la "$OUT"
say "done"
exit $status
