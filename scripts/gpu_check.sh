#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU, torch (≥ 2.9) and torchvision (nothing else of ours installed), print
# the bench table for fp32 / tf32 / fp16 / bf16 on the GPU profile (ResNet-18, 32×32, batch 512, channels_last),
# each arm's peak memory measured alone, and run the sync-debug check. Finishes in a few minutes.
# Results in ${OUT:-.}: versions.txt, gpu_bench.json, gpu_sync_debug.json (CUDA only), gpu_pytest.txt.
#   bash scripts/gpu_check.sh                # on the GPU machine, from the repository root
#   bash scripts/gpu_check.sh --device cpu   # the dry run: tiny sizes on CPU, so the script cannot rot unnoticed
set -euo pipefail
cd "$(dirname "$0")/.."
device=cuda
if [ "${1:-}" = "--device" ]; then device="${2:?--device needs cuda or cpu}"; fi
out="${OUT:-.}"
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
py="${PYTHON:-python3}"

DEVICE="$device" "$py" - <<'PY' | tee "$out/versions.txt"
import os, platform
import torch
print(f"torch {torch.__version__}, Python {platform.python_version()}")
if os.environ["DEVICE"] == "cuda":
    assert torch.cuda.is_available(), "no CUDA device visible to torch"
    p = torch.cuda.get_device_properties(0)
    print(f"GPU: {p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB; "
          f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
else:
    print("dry run on CPU: tiny sizes; timings and memory mean nothing here")
PY

if [ "$device" = cuda ]; then
  sizes=(--model resnet18 --image-size 32 --channels 3 --batch-size 512 --steps 30 --rounds 3 --window 10
         --warmup-steps 10 --channels-last)
else
  sizes=(--model small_cnn --width 4 --image-size 8 --channels 3 --batch-size 16 --steps 6 --rounds 2 --window 2
         --warmup-steps 2)
fi

echo "== bench: GPU profile (goals: fp16/bf16 ≥ 4× fp32 and ≥ 1.7× tf32 in samples/s; memory ≤ 0.7× fp32;"
echo "   pipeline loop ≤ 1.03× the bare loop for every arm)"
"$py" -m ampbench.bench --device "$device" "${sizes[@]}" --no-mlflow \
  --arms fp32,tf32,fp16,bf16 --overhead-arms fp32,tf32,fp16,bf16 --json "$out/gpu_bench.json"

if [ "$device" = cuda ]; then
  echo "== sync-debug: steady-state steps of every arm under torch.cuda.set_sync_debug_mode('error')"
  "$py" -m ampbench.bench --device cuda --model resnet18 --image-size 32 --batch-size 128 --steps 12 \
    --rounds 1 --window 4 --warmup-steps 2 --sync-debug --no-mlflow --arms fp32,tf32,fp16,bf16 \
    --overhead-arms fp16 --json "$out/gpu_sync_debug.json" >/dev/null
  echo "sync-debug: PASSED (no implicit host-device sync in steady-state steps)"
else
  echo "== sync-debug: skipped (CUDA only)"
fi

echo "== pytest -m gpu (the test files that need only what the GPU machine has)"
# No cache dir: the checkout may be read-only. pipefail: a failing test fails the check.
"$py" -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py tests/test_bench.py tests/test_precision.py \
  2>&1 | tee "$out/gpu_pytest.txt" | tail -3

echo "== pipeline train + evaluate on CUDA: skipped (the stages need mlflow, pydantic and dvc, which the GPU machine"
echo "   lacks; mlflow alone is 69 MB installed, more than the 64 MiB a run carries, so they are not carried)"
