#!/usr/bin/env bash
# The checks issues 14 and 15 leave for a GPU, for a machine with no network (the device
# tool's). Here first: `bash tools/device_wheels.sh` (fills .whl/). There, one call per group
# (a call may run 10 minutes; the times are one H100's, 2026-11-24):
#   bash tools/gpu_check.sh engine tests          # carry .whl; ~300 s (engine 150, tests 150)
#   bash tools/gpu_check.sh sync run              # ~330 s (the first warm start on a fresh
#                                                 # machine takes 60 s of the first of them)
#   bash tools/gpu_check.sh learn real            # ~250 s (real: a 0.36B model through
#                                                 # asyncrl run, hf_static; ENGINES="hf_static
#                                                 # hf_cached" adds the slow one, ~150 s more)
#   bash tools/gpu_check.sh fp32                  # the same in float32 (the dtypes before bf16)
#   bash tools/gpu_check.sh cpu                   # ~230 s: bench learn on the host's CPUs alone
#   bash tools/gpu_check.sh cputhreads            # ~230 s: the same, each async role on 7 threads
#   bash tools/gpu_check.sh overlap               # 20 steps of a 0.36B model (256 tokens), async
#                                                 # (c) then colocated sync, one GPU
#   bash tools/gpu_check.sh handoff tests run     # ~400 s: the handoff bar, the GPU tests, make run
# With 15 minutes of device time a session, in this order: tests, learn, sync, cpu, run.
# The device tool gives a machine back 30 s after a call: send the next group at once.
# Installs the carried wheels and asyncrl (editable, no build isolation), then runs each step
# under its own time limit, its output in $OUT/<step>.log (or runs/gpu-check/), and goes on
# after a failed step; the last lines say which passed. No step: tests engine sync run learn
# real fp32 (handoff, cpu, cputhreads and overlap only when named).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu-check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

if ! "$PY" -c "import asyncrl.producers, confluent_kafka, pydantic" 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
        .whl/*.whl ||
        { echo "no wheels in .whl/: run tools/device_wheels.sh first and carry .whl"; exit 1; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
fi
"$PY" - <<'EOF' | tee "$OUT/env.log"
import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__)
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "")
EOF

step() {  # step NAME SECONDS COMMAND...: run it, log it, note how it ended
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*"
    local t0=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$OUT/$name.log"
    echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$OUT/summary.log"
}

keep_logs() {  # keep_logs RUN_ID: its processes' logs as top-level files, the log and
    # checkpoints dropped (the device tool returns few files, none deeper than a few folders)
    local d="$OUT/$1"
    for f in "$d"/logs/*.log; do [ -f "$f" ] && cp "$f" "$OUT/$1-$(basename "$f")"; done
    rm -rf "$d/log" "$d/checkpoints" "$d/logs"
}
keep_logs_of() {  # keep_logs_of PREFIX: keep_logs of every run in $OUT named PREFIX-*
    for d in "$OUT/$1"-*/; do [ -d "$d" ] && keep_logs "$(basename "$d")"; done
}

run_tests() {  # every GPU-marked test, then the engines' and the run's on the GPU's side
    step tests 300 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests
}
run_engine() {  # issue 14's bar: 0.5B shape, batch 256, 256 new tokens, >= 20x hf
    step engine-500M 400 "$PY" -m asyncrl bench engine --shapes 500M --batch 256 \
        --prompt-len 64 --new-tokens 256 "output_dir=$OUT"  # --profile: hf_cached's ran > 300 s
    step engine-demo 90 "$PY" -m asyncrl bench engine --shapes demo --new-tokens 128 \
        "output_dir=$OUT"
}
run_handoff() {  # issue 14's handoff bar alone (~150 s): where its time goes with the weights
    # flat (as the roles keep them on a GPU) and apart, then bench sync's transfers without
    # its whole-sync half, the in-place rows side by side
    step phases 90 "$PY" tools/handoff_phases.py --shape 500M --device cuda
    step phases-apart 90 "$PY" tools/handoff_phases.py --shape 500M --device cuda --apart
    step transfer 200 "$PY" -c "from rich.console import Console
from asyncrl.bench.sync import sync
sync(None, ['output_dir=$OUT'], Console(width=180), device='cuda', pause_resume=False)"
}
run_sync() {  # where an in-place handoff's time goes; CUDA IPC handoffs (in place, slots) vs a
    # device-to-device copy (>= 0.5 of it at 0.5B), checksums
    # (the whole-sync half warm-starts the demo policy first: 60 s on a fresh machine)
    step phases 60 "$PY" tools/handoff_phases.py --shape 500M --device cuda
    step sync 300 "$PY" -m asyncrl bench sync --device cuda "output_dir=$OUT"
    keep_logs_of sync-pause
}
run_run() {  # `make run`'s job with both roles on the GPU, then its log's invariants
    step run 200 "$PY" -m asyncrl run run_id=gpu-demo actor_rollout_ref.rollout.device=auto \
        trainer.device=auto "output_dir=$OUT"
    step audit 60 "$PY" -m asyncrl audit gpu-demo "--output-dir=$OUT"
    keep_logs gpu-demo
}
run_learn() {  # issue 15 on a GPU: time to 0.9, colocated vs async (c), (d), (d in flight)
    step learn 330 "$PY" -m asyncrl bench learn actor_rollout_ref.rollout.device=auto \
        trainer.device=auto "output_dir=$OUT"
    keep_logs_of learn
}

run_cpu() {  # issue 15's CPU bar where cores are not scarce: the 2-core machine's bench learn
    # on the device host's 16 CPUs, no GPU (colocated with 1 or 16 threads, the async roles one
    # thread each, the broker a core of its own): does async win when the two roles do not
    # share two cores? (docs/benchmarks.md, "the two cores are nearly full")
    step cpu-learn 300 env CUDA_VISIBLE_DEVICES= "$PY" -m asyncrl bench learn --seeds 3 \
        "output_dir=$OUT"
    keep_logs_of learn
}
run_cputhreads() {  # the same with each async role on 7 of the 16 CPUs (2026-11-27: on one
    # thread each the trainer was the slower side, the colocated loop 1.5x faster on 16 threads)
    step cpu-learn-threads 300 env CUDA_VISIBLE_DEVICES= "$PY" -m asyncrl bench learn --seeds 3 \
        trainer.torch_threads=7 actor_rollout_ref.rollout.torch_threads=7 "output_dir=$OUT"
    keep_logs_of learn
}

real_run() {  # real_run NAME ENGINE OVERRIDES...: a model-sized workload, both roles on the GPU
    local name=$1 engine=$2
    shift 2
    "$PY" tools/random_checkpoint.py --shape "${SHAPE:-500M}" --out /tmp/real-model || return
    "$PY" -m asyncrl export-data --out /tmp/real-data >/dev/null || return
    step "$name" 240 "$PY" -m asyncrl run "run_id=$name" "output_dir=$OUT" \
        actor_rollout_ref.model.path=/tmp/real-model \
        data.train_files=/tmp/real-data/train.parquet data.val_files=/tmp/real-data/val.parquet \
        data.max_response_length=256 "trainer.total_training_steps=${REAL_STEPS:-20}" \
        trainer.target_accuracy=null trainer.test_freq=0 trainer.save_freq=10 \
        actor_rollout_ref.rollout.device=auto trainer.device=auto \
        "actor_rollout_ref.rollout.name=$engine" actor_rollout_ref.actor.use_dynamic_bsz=true "$@"
    "$PY" tools/step_times.py "$OUT/$name/metrics.jsonl" | tee -a "$OUT/summary.log"
    keep_logs "$name"
}
run_overlap() {  # issue 15 where generation is real work: the same 20 steps of the random
    # model (256-token responses), async (c) through `asyncrl run` (real_run), then the colocated
    # loop, both on the one GPU; its last line gives its gen and train rates at step 20
    real_run overlap-async hf_static
    step overlap-colocated 300 "$PY" -m asyncrl.consumers.colocated \
        actor_rollout_ref.model.path=/tmp/real-model \
        data.train_files=/tmp/real-data/train.parquet data.val_files=/tmp/real-data/val.parquet \
        data.max_response_length=256 "trainer.total_training_steps=${REAL_STEPS:-20}" \
        trainer.target_accuracy=null trainer.test_freq=0 trainer.device=auto \
        actor_rollout_ref.rollout.name=hf_static actor_rollout_ref.actor.use_dynamic_bsz=true
}
run_real() {  # where a step's time goes, per engine (bf16 on both sides: the dtypes' auto)
    for engine in ${ENGINES:-hf_static}; do real_run "real-$engine" "$engine"; done
}
run_fp32() {  # the same as real-hf_static in float32 on both sides: what bf16 bought
    real_run real-fp32 hf_static actor_rollout_ref.actor.fsdp_config.dtype=float32 \
        actor_rollout_ref.rollout.dtype=float32
}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests engine sync run learn real fp32)
for s in "${steps[@]}"; do
    case $s in
        tests | engine | handoff | sync | run | learn | real | fp32 | cpu | cputhreads | overlap)
            "run_$s" ;;
        *) echo "unknown step $s (tests, engine, handoff, sync, run, learn, real, fp32, cpu," \
            "cputhreads, overlap)"
            exit 2 ;;
    esac
done
echo "== summary"
cat "$OUT/summary.log"
