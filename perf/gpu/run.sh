#!/usr/bin/env bash
# Run ON the lent GPU machine (device tool: `run` with carry [".whl"], after perf/gpu/wheels.sh
# here), one stage per call, each well inside a call's 10 minutes:
#
#   bash perf/gpu/run.sh check    hardware, CPU flags, the CUDA tests
#   bash perf/gpu/run.sh envs     perf/env_fps.py: the simulator ceiling on every core
#   bash perf/gpu/run.sh sample   perf/sampler_fps.py on CUDA (inference, nothing trains)
#   bash perf/gpu/run.sh train    perf/train_fps.py on CUDA, fp32 and bf16
#
# Results land in $OUT (the device tool brings that folder back), one JSON per run and a
# log per stage. The image's python3 holds CUDA torch; the carried wheels go into a venv that
# sees the image's packages.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/fastrl-gpu-out}
mkdir -p "$OUT"
VENV=/tmp/fastrl-gpu-venv
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv --system-site-packages "$VENV"
    "$VENV/bin/pip" install --quiet --no-index --no-deps .whl/*.whl
fi
PY="$VENV/bin/python"
export PYTHONPATH="$PWD"
CORES=$(nproc)
SECONDS_MEASURED=${SECONDS_MEASURED:-60}
stage=${1:-check}
log="$OUT/$stage.log"

case "$stage" in
check)
    {
        date -u
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
        lscpu | grep -E "Model name|^CPU\(s\)"
        echo "flags: $(grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
        "$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
        "$PY" -m pytest -q -p no:cacheprovider tests/test_staging.py tests/test_cuda.py
    } 2>&1 | tee "$log"
    ;;
envs)
    # The ceiling: random actions, every core busy, no inference or learning.
    for envs in 4 8; do
        "$PY" perf/env_fps.py --env doom_basic --num_workers "$CORES" \
            --num_envs_per_worker "$envs" --seconds 30 --warmup 10 \
            | tee -a "$log" | tail -1 > "$OUT/env_fps_${CORES}x${envs}.json"
    done
    ;;
sample)
    for workers in $((CORES - 2)) "$CORES"; do
        "$PY" perf/sampler_fps.py --env doom_basic --device cuda --num_workers "$workers" \
            --num_envs_per_worker 8 --num_policy_workers 2 --seconds "$SECONDS_MEASURED" \
            --warmup 20 2>&1 | tee -a "$log" | tail -1 > "$OUT/sampler_fps_${workers}x8.json"
    done
    ;;
train)
    for precision in fp32 bf16; do
        "$PY" perf/train_fps.py --env doom_basic --device cuda --precision "$precision" \
            --num_workers $((CORES - 2)) --num_envs_per_worker 8 --num_policy_workers 2 \
            --seconds "$SECONDS_MEASURED" --warmup 20 2>&1 | tee -a "$log" | tail -1 \
            > "$OUT/train_fps_${precision}.json"
    done
    ;;
*)
    echo "unknown stage '$stage': check, envs, sample or train" >&2
    exit 2
    ;;
esac
