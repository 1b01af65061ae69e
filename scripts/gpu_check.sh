#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU and torch (≥ 2.9) + torchvision, print the bench table for fp32 / tf32 /
# fp16 / bf16 on the GPU profile (ResNet-18, 32×32, batch 512, channels_last; each arm's peak memory measured alone),
# the torch API check and the sync-debug check, and run `pytest -m gpu`. With --pipeline, also the pipeline itself:
# the wheels in .whl (scripts/gpu_wheels.sh) installed into a folder of their own, then a real `dvc repro` of two
# GPU profiles (ResNet-18 on synthetic 32×32 images: tensor cores; the digits data: a verdict), MLflow logging to
# one SQLite store, and the reports packed. Each step has a time limit; a failed step is reported and the next runs.
# Results in ${OUT:-.}: versions.txt, gpu_bench.json, gpu_sync_debug.json, gpu_pytest.txt and, with --pipeline,
# pipeline_<profile>.tar.gz (params, dvc.lock, reports/, each arm's JSON records) and mlflow.db: 7 files, room for
# the log (`… 2>&1 | tee $OUT/gpu_check.log`) within a GPU run's 8. GPU_CHECK_PROFILES picks profiles (default both).
# --new-arms, a second command of its own: the arms past autocast (bf16_pure / bf16_sr / bf16_kahan, fp8_tensorwise /
# fp8_rowwise: not yet run on a GPU) benched on vit_tiny, compiled (torchao's float8 recipe needs torch.compile), with
# fp32 and bf16 beside them, and their GPU test: versions.txt, gpu_bench_new_arms.json, gpu_pytest_new_arms.txt.
#   bash scripts/gpu_check.sh --pipeline               # on the GPU machine, from the repository root, .whl carried
#   bash scripts/gpu_check.sh --pipeline --device cpu  # the dry run: tiny sizes on CPU, on a simulated GPU machine
#   bash scripts/gpu_check.sh [--device cpu]           # bench, API and sync-debug checks, pytest -m gpu only
#   bash scripts/gpu_check.sh --new-arms [--device cpu] # the arms past autocast (wheels installed as for --pipeline)
# docs/gpu.md says how to run it through the GPU slot and what was measured.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
device=cuda pipeline=0 new_arms=0
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device="${2:?--device needs cuda or cpu}"; shift 2 ;;
    --pipeline) pipeline=1; shift ;;
    --new-arms) new_arms=1; shift ;;
    *) echo "usage: $0 [--pipeline | --new-arms] [--device cuda|cpu]" >&2; exit 2 ;;
  esac
done
out="${OUT:-.}"
mkdir -p "$out"
out=$(cd "$out" && pwd)
py="${PYTHON:-python3}"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=()
# step NAME SECONDS CMD...: run with a time limit; a failure is recorded, not fatal (one GPU slot, many answers).
step() {
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  if [ $rc -ne 0 ]; then
    failed+=("$name (exit $rc$([ $rc -eq 124 ] && echo ", over its ${limit} s"))")
    echo "== $name: FAILED (exit $rc) after $((SECONDS - t0)) s"
  else
    echo "== $name: done in $((SECONDS - t0)) s"
  fi
}

if [ "$pipeline" = 1 ] || [ "$new_arms" = 1 ]; then  # both need the pipeline's wheels (torchao, torch-optimi)
  if [ "$device" = cuda ]; then
    [ -d .whl ] || { echo "error: no .whl here: run scripts/gpu_wheels.sh on the CPU machine and carry .whl" >&2; exit 2; }
    site=/tmp/ampbench-site
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
      || { echo "error: installing .whl failed" >&2; exit 2; }
    export PYTHONPATH="$site"
    echo "installed $(ls .whl/*.whl | wc -l) wheels into $site"
    "$py" scripts/gpu_wheels.py verify-installed .whl  # the carried wheels' requirements against this machine's versions
  else
    echo "dry run on CPU: the wheel install is skipped; everything runs on a simulated GPU machine instead (a Python"
    echo "that imports only what the image has and what .whl carries: scripts/gpu_wheels.py simulate)"
    py=$("$py" scripts/gpu_wheels.py simulate "$scratch/view") || exit 2
  fi
fi
export PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}"

{
  DEVICE="$device" "$py" - <<'PY'
import os, platform
import torch
print(f"torch {torch.__version__}, Python {platform.python_version()}, source {os.environ.get('AMPBENCH_SOURCE', 'unknown')}")
if os.environ["DEVICE"] == "cuda":
    assert torch.cuda.is_available(), "no CUDA device visible to torch"
    p = torch.cuda.get_device_properties(0)
    print(f"GPU: {p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB; "
          f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
else:
    print("dry run on CPU: tiny sizes; timings and memory mean nothing here")
PY
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "== torch API check: every torch/torchvision name the pipeline's code uses, resolved in this torch"
  "$py" scripts/torch_api_check.py | tail -1
} 2>&1 | tee "$out/versions.txt"

if [ "$new_arms" = 1 ]; then
  if [ "$device" = cuda ]; then  # every arm compiled alike, no time budget: compilation dominates, steps are ms
    new_sizes=(--model vit_tiny --image-size 32 --channels 3 --batch-size 256 --steps 20 --rounds 2 --window 5
               --warmup-steps 5 --compile --arm-budget none)
  else
    new_sizes=(--model mlp --image-size 8 --channels 1 --batch-size 16 --steps 6 --rounds 2 --window 2
               --warmup-steps 2)
  fi
  echo "== bench: arms past autocast (pure bf16: nearest, stochastic rounding, Kahan summation; float8 Linear layers:"
  echo "   tensorwise ≥ CC 8.9, rowwise ≥ CC 9.0), bf16 autocast beside them; state B/param: weights + grads + optimizer"
  step bench-new-arms 420 "$py" -m ampbench.bench --device "$device" "${new_sizes[@]}" --no-mlflow \
    --arms fp32,bf16,bf16_pure,bf16_sr,bf16_kahan,fp8_tensorwise,fp8_rowwise --overhead-arms fp32 \
    --json "$out/gpu_bench_new_arms.json"
  echo "== pytest -m gpu: the arms past autocast, compiled, on this GPU"
  step pytest-new-arms 150 bash -c "'$py' -m pytest -q -m gpu -p no:cacheprovider tests/test_arms_past_autocast.py \
    2>&1 | tee '$out/gpu_pytest_new_arms.txt' | tail -3"
  if [ ${#failed[@]} -gt 0 ]; then
    echo "== gpu_check --new-arms: ${#failed[@]} step(s) failed: ${failed[*]}"
    exit 1
  fi
  echo "== gpu_check --new-arms: every step passed"
  exit 0
fi

if [ "$device" = cuda ]; then
  sizes=(--model resnet18 --image-size 32 --channels 3 --batch-size 512 --steps 30 --rounds 3 --window 10
         --warmup-steps 10 --channels-last --arm-budget none)
else
  sizes=(--model small_cnn --width 4 --image-size 8 --channels 3 --batch-size 16 --steps 6 --rounds 2 --window 2
         --warmup-steps 2)
fi

echo "== bench: GPU profile (goals: fp16/bf16 ≥ 4× fp32 and ≥ 1.7× tf32 in samples/s; memory ≤ 0.7× fp32;"
echo "   pipeline loop ≤ 1.03× the bare loop for every arm)"
step bench 240 "$py" -m ampbench.bench --device "$device" "${sizes[@]}" --no-mlflow \
  --arms fp32,tf32,fp16,bf16 --overhead-arms fp32,tf32,fp16,bf16 --json "$out/gpu_bench.json"

if [ "$device" = cuda ]; then
  echo "== sync-debug: steady-state steps of every arm under torch.cuda.set_sync_debug_mode('error')"
  step sync-debug 90 "$py" -m ampbench.bench --device cuda --model resnet18 --image-size 32 --batch-size 128 \
    --steps 12 --rounds 1 --window 4 --warmup-steps 2 --sync-debug --no-mlflow --arms fp32,tf32,fp16,bf16 \
    --overhead-arms fp16 --arm-budget none --json "$out/gpu_sync_debug.json" >/dev/null \
    && echo "sync-debug: PASSED (no implicit host-device sync in steady-state steps)"
else
  echo "== sync-debug: skipped (CUDA only)"
fi

echo "== pytest -m gpu (the test files that need only what the GPU machine has)"
# No cache dir: the checkout may be read-only.
step pytest 150 bash -c "'$py' -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py tests/test_bench.py \
  tests/test_precision.py 2>&1 | tee '$out/gpu_pytest.txt' | tail -3"

if [ "$pipeline" = 1 ]; then
  # One SQLite store for both profiles, outside the copies (what an MLflow UI opens afterwards).
  export MLFLOW_TRACKING_URI="sqlite:///$scratch/mlflow.db" AMPBENCH_ARTIFACT_LOCATION="$scratch/mlartifacts"
  export AMPBENCH_PYTHON=$(command -v "$py") GIT_PYTHON_REFRESH=quiet PYTHONUNBUFFERED=1
  for profile in ${GPU_CHECK_PROFILES:-resnet18 digits}; do
    echo "== pipeline: dvc repro, profile $profile on $device"
    work="$scratch/$profile"
    step "copy $profile" 60 "$py" scripts/gpu_profile.py "$profile" "$device" "$repo" "$work"
    [ -d "$work" ] || continue
    # The copy has no .git (none travels to the GPU machine): DVC without a git repository, said here.
    (cd "$work" && "$py" -m dvc config core.no_scm true && echo "DVC runs without git here (core.no_scm)")
    limit=$([ "$profile" = resnet18 ] && echo 240 || echo 180)
    step "dvc repro $profile" "$limit" bash -c "cd '$work' && '$py' -m dvc repro > '$work/repro.log' 2>&1 \
      || { tail -40 '$work/repro.log'; exit 1; }"
    # The recommendation and the verdict table (the rest is in the packed report).
    [ -f "$work/reports/report.md" ] && awk '/^Why each verdict/ {exit} {print}' "$work/reports/report.md"
    (cd "$work" && tar -czf "$out/pipeline_$profile.tar.gz" params.yaml repro.log \
      $(ls -d dvc.lock reports 2>/dev/null) $(find models -name '*.json' 2>/dev/null))
  done
  [ -f "$scratch/mlflow.db" ] && cp "$scratch/mlflow.db" "$out/mlflow.db"
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "== gpu_check: ${#failed[@]} step(s) failed: ${failed[*]}"
  exit 1
fi
echo "== gpu_check: every step passed"
