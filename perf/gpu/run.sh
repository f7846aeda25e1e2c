#!/usr/bin/env bash
# Run ON the lent GPU machine (device tool: `run` with carry [".whl"], after perf/gpu/wheels.sh
# here), one or more stages per call, each well inside a call's 10 minutes:
#
#   bash perf/gpu/run.sh check    hardware, CPU flags, every CUDA test of the suite
#   bash perf/gpu/run.sh resume   train doom_basic on CUDA for a while, then resume it
#   bash perf/gpu/run.sh envs     perf/env_fps.py: the simulator ceiling on every core
#   bash perf/gpu/run.sh sample   perf/sampler_fps.py on CUDA (inference, nothing trains)
#   bash perf/gpu/run.sh train    perf/train_fps.py on CUDA, fp32 and bf16
#   bash perf/gpu/run.sh infer    one inference call alone (perf/hot_path.py) by batch size,
#                                 and training with 1 policy worker against run.sh train's 2
#   bash perf/gpu/run.sh graphs   --policy_cuda_graphs: its tests, inference and training
#                                 against the eager acting step (the three parts alone:
#                                 graphs-train, graphs-infer, graphs-test)
#   bash perf/gpu/run.sh sf       Sample Factory 2.1.1 training doom_basic on this machine with
#                                 run.sh train's settings (needs .sfsite, perf/gpu/sf_site.sh)
#   bash perf/gpu/run.sh free     the pipeline's own cost: perf/sampler_fps.py with a policy that
#                                 does no model work, against perf/env_fps.py on the same cores
#   bash perf/gpu/run.sh ceiling  issue 42's H100 ratios: the free policy against bare DoomGames,
#                                 and sampling with the real policy (graphs, 2 policy workers)
#                                 against the fastrl envs alone, on the same cores
#   bash perf/gpu/run.sh pw       training with graphs: 2 against 3 policy workers (14 workers)
#                                 and 2 policy workers with 16 workers, side by side
#   bash perf/gpu/run.sh pin      --worker_cpu_affinity off against on, with 14 and with 16
#                                 workers (about 4 minutes)
#   bash perf/gpu/run.sh sde      a short CUDA run of --action_log_std sde with 2 policy workers
#   bash perf/gpu/run.sh bundle   pack everything under $OUT into one all.tgz (the device
#                                 tool brings back at most 8 files)
#
# Results land in $OUT (the device tool brings that folder back), one JSON per run and a
# log per stage. The image's python3 (itself a venv) holds CUDA torch; the carried wheels go
# into a --target folder on PYTHONPATH. (A venv made from that python with
# --system-site-packages would see the base interpreter's packages, not torch.)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/fastrl-gpu-out}
mkdir -p "$OUT"
SITE=/tmp/fastrl-gpu-site
if [ ! -d "$SITE/vizdoom" ]; then
    python3 -m pip install --quiet --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl
fi
PY=python3
export PYTHONPATH="$PWD:$SITE" PYTHONUNBUFFERED=1
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
        # Every test with "cuda" in its id (the CUDA cases skip everywhere else).
        # (The Hub's tests import huggingface_hub's httpx2, which the image lacks; none is CUDA.)
        "$PY" -m pytest -q -rs -p no:cacheprovider -k cuda --ignore=tests/test_hub.py \
            --ignore=tests/test_hub_review.py tests
    } 2>&1 | tee "$log"
    ;;
resume)
    dir=/tmp/fastrl-gpu-resume
    rm -rf "$dir"
    for leg in 1 2; do
        "$PY" train.py --env doom_basic --experiment resume --train_dir "$dir" --device cuda \
            --num_workers 4 --num_envs_per_worker 8 --train_for_seconds 25 --seed 1 2>&1 \
            | tee -a "$log" | grep -E "error|Error|resum|precision|device|summary" || true
        cp "$dir/resume/summary.json" "$OUT/resume_summary_$leg.json" || true
    done
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
infer)
    # An inference call cost 2.6-4.9 ms whatever its batch (56-224 envs) on an H100
    # (perf/log/RESULTS.md, 2026-11-26 afternoon): fewer, larger calls may serve more. The
    # profile of batch 112 says where a call's time goes (host issuing against device).
    for batch in 56 112 224; do
        prof=()
        [ "$batch" = 112 ] && prof=(--profile "$OUT/infer_profile_$batch.txt")
        "$PY" perf/hot_path.py --env doom_basic --device cuda --repeats 40 \
            --infer_batch "$batch" --precision fp32 "${prof[@]}" 2>&1 | tee -a "$log" \
            | tail -1 > "$OUT/hot_path_${batch}.json"
    done
    # Training with 1 and 2 policy workers, side by side in one call.
    for pw in 1 2; do
        "$PY" perf/train_fps.py --env doom_basic --device cuda --precision fp32 \
            --num_workers $((CORES - 2)) --num_envs_per_worker 8 --num_policy_workers "$pw" \
            --seconds "$SECONDS_MEASURED" --warmup 20 2>&1 | tee -a "$log" | tail -1 \
            > "$OUT/train_fps_fp32_${pw}pw.json"
    done
    ;;
graphs|graphs-test|graphs-infer|graphs-train)
    # --policy_cuda_graphs: its CUDA tests, then one inference call and training with 1 and
    # 2 policy workers against the eager acting step, side by side in one call.
    if [ "$stage" = graphs ] || [ "$stage" = graphs-train ]; then
        limit=()  # the machine's limit is the same for all four: measured after the first
        for run in "1 False" "1 True" "2 False" "2 True"; do
            set -- $run
            "$PY" perf/train_fps.py "${limit[@]}" --env doom_basic --device cuda --precision fp32 \
                --num_workers $((CORES - 2)) --num_envs_per_worker 8 --num_policy_workers "$1" \
                --policy_cuda_graphs "$2" --seconds "$SECONDS_MEASURED" --warmup 20 2>&1 \
                | tee -a "$log" | tail -1 > "$OUT/train_fps_fp32_${1}pw_graphs_${2}.json"
            limit=(--no_limit)
        done
    fi
    if [ "$stage" = graphs ] || [ "$stage" = graphs-infer ]; then
        for batch in ${BATCHES:-56 112 224}; do
            for graphs in False True; do
                prof=()
                [ "$batch" = 112 ] && [ "$graphs" = True ] \
                    && prof=(--profile "$OUT/infer_profile_${batch}_graphs.txt")
                "$PY" perf/hot_path.py --env doom_basic --device cuda --repeats 40 \
                    --infer_batch "$batch" --precision fp32 --policy_cuda_graphs "$graphs" \
                    "${prof[@]}" 2>&1 | tee -a "$log" | tail -1 \
                    > "$OUT/hot_path_${batch}_graphs_${graphs}.json"
            done
        done
    fi
    if [ "$stage" = graphs ] || [ "$stage" = graphs-test ]; then
        "$PY" -m pytest -q -rs -p no:cacheprovider -k "graphed" tests/test_graphed.py \
            tests/test_cuda.py 2>&1 | tee -a "$log" || true
    fi
    ;;
sf)
    # Sample Factory 2.1.1 (pins numpy<2, gymnasium<1) from .sfsite: its packages unpacked
    # (perf/gpu/sf_site.sh) and a numpy 1.26 wheel installed here. Settings as run.sh train's:
    # CORES - 2 workers x 8 envs, 2 splits, batches of 1,024, rollout 32, its other defaults
    # (one policy worker). Its --train_for_seconds does not stop it: SIGINT does. Its FPS
    # counts frames with frameskip 4, as ours does; the "60 sec" figure is read at the end.
    NP=/tmp/fastrl-sf-numpy
    [ -d "$NP/numpy" ] || "$PY" -m pip install --quiet --no-index --no-deps --no-compile \
        --target "$NP" .sfsite/numpy-*.whl
    rm -rf /tmp/fastrl-sf
    PYTHONPATH="$NP:$PWD/.sfsite/site:$SITE" timeout -s INT -k 20 "${SF_SECONDS:-100}" \
        "$PY" -m sf_examples.vizdoom.train_vizdoom --env=doom_basic --experiment=sf \
        --train_dir=/tmp/fastrl-sf --device=gpu --seed=1 --num_workers=$((CORES - 2)) \
        --num_envs_per_worker=8 --worker_num_splits=2 --batch_size=1024 --rollout=32 \
        --policy_workers_per_policy="${SF_POLICY_WORKERS:-1}" > "$log" 2>&1 || true
    # Its VizDoom engines outlive a SIGINT (shared/SF_BASELINE.md): end them before the next
    # stage, whose runs they would slow.
    sleep 5; pkill -9 -x vizdoom || true; sleep 1
    grep -E "Fps is" "$log" | tail -3 || true
    grep -E "Error|Traceback" "$log" | head -5 || true
    ;;
free)
    "$PY" perf/sampler_fps.py --env doom_basic --device cuda --num_workers $((CORES - 2)) \
        --num_envs_per_worker 8 --num_policy_workers 2 --seconds "$SECONDS_MEASURED" \
        --warmup 10 --free_policy --against_env 2>&1 | tee -a "$log" | tail -1 \
        > "$OUT/free_policy_$((CORES - 2))x8.json"
    ;;
ceiling)
    "$PY" perf/sampler_fps.py --env doom_basic --device cuda --num_workers $((CORES - 2)) \
        --num_envs_per_worker 8 --num_policy_workers 2 --seconds "$SECONDS_MEASURED" \
        --warmup 10 --free_policy --against_env bare 2>&1 | tee -a "$log" | tail -1 \
        > "$OUT/free_policy_bare_$((CORES - 2))x8.json"
    "$PY" perf/sampler_fps.py --env doom_basic --device cuda --num_workers $((CORES - 2)) \
        --num_envs_per_worker 8 --num_policy_workers 2 --policy_cuda_graphs True \
        --seconds "$SECONDS_MEASURED" --warmup 15 --against_env 2>&1 | tee -a "$log" \
        | tail -1 > "$OUT/sampling_graphs_$((CORES - 2))x8.json"
    ;;
pw)
    for run in "$((CORES - 2)) 2" "$((CORES - 2)) 3" "$CORES 2"; do
        set -- $run
        "$PY" perf/train_fps.py --no_limit --env doom_basic --device cuda --precision fp32 \
            --num_workers "$1" --num_envs_per_worker 8 --num_policy_workers "$2" \
            --policy_cuda_graphs True --seconds "$SECONDS_MEASURED" --warmup 20 2>&1 \
            | tee -a "$log" | tail -1 > "$OUT/train_fps_graphs_${1}w_${2}pw.json"
    done
    ;;
pin)
    # --worker_cpu_affinity on this host (2026-11-28: +9.7% on 2 cores, not yet measured here):
    # free against pinned, with the usual CORES - 2 workers (which auto leaves free) and with a
    # worker on every core (which auto pins), alternated, graphs and 2 policy workers.
    for run in "$((CORES - 2)) off" "$((CORES - 2)) on" "$CORES off" "$CORES on"; do
        set -- $run
        "$PY" perf/train_fps.py --no_limit --env doom_basic --device cuda --precision fp32 \
            --num_workers "$1" --num_envs_per_worker 8 --num_policy_workers 2 \
            --policy_cuda_graphs True --worker_cpu_affinity "$2" \
            --seconds "${SECONDS_PIN:-30}" --warmup 20 2>&1 \
            | tee -a "$log" | tail -1 > "$OUT/train_fps_${1}w_pin_${2}.json"
    done
    ;;
sde)
    # The held noise (fastrl/sampling/sde.py) shared by two policy workers, on CUDA.
    rm -rf /tmp/fastrl-sde
    "$PY" train.py --env MountainCarContinuous-v0 --experiment sde --train_dir /tmp/fastrl-sde \
        --device cuda --num_policy_workers 2 --train_for_env_steps 30000 --seed 1 2>&1 \
        | tee "$log" | grep -E "Error|error|summary|return" | tail -5 || true
    cp /tmp/fastrl-sde/sde/summary.json "$OUT/sde_summary.json" || true
    ;;
bundle)
    (cd "$OUT" && tar czf /tmp/fastrl-all.tgz --exclude all.tgz . && rm -rf ./* \
        && mv /tmp/fastrl-all.tgz all.tgz && ls -l)
    ;;
*)
    echo "unknown stage '$stage': check, resume, envs, sample, train, infer, graphs," \
        "graphs-train, graphs-infer, graphs-test, sf, free, ceiling, pw, sde or bundle" >&2
    exit 2
    ;;
esac
