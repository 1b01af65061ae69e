#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU, torch and torchvision (nothing else of ours installed), print the
# bench table for fp32 / tf32 / fp16 / bf16 on the GPU profile (ResNet-18, 32×32, batch 512, channels_last) and
# run the sync-debug check. Finishes in a few minutes. Results: ${OUT:-.}/gpu_bench.json, gpu_sync_debug.json.
# Run from the repository root:  bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
py="${PYTHON:-python3}"

"$py" - <<'PY'
import torch
assert torch.cuda.is_available(), "no CUDA device visible to torch"
p = torch.cuda.get_device_properties(0)
print(f"GPU: {p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB; "
      f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
PY

echo "== bench: GPU profile (goals: fp16/bf16 ≥ 4× fp32 and ≥ 1.7× tf32 in samples/s; memory ≤ 0.7× fp32;"
echo "   pipeline loop ≤ 1.03× the bare loop for every arm)"
"$py" -m ampbench.bench --device cuda --model resnet18 --image-size 32 --channels 3 --batch-size 512 \
  --steps 30 --rounds 3 --window 10 --warmup-steps 10 --channels-last --no-mlflow \
  --arms fp32,tf32,fp16,bf16 --overhead-arms fp32,tf32,fp16,bf16 --json "$out/gpu_bench.json"

echo "== sync-debug: steady-state steps of every arm under torch.cuda.set_sync_debug_mode('error')"
"$py" -m ampbench.bench --device cuda --model resnet18 --image-size 32 --batch-size 128 --steps 12 \
  --rounds 1 --window 4 --warmup-steps 2 --sync-debug --no-mlflow --arms fp32,tf32,fp16,bf16 \
  --overhead-arms fp16 --json "$out/gpu_sync_debug.json" >/dev/null
echo "sync-debug: PASSED (no implicit host-device sync in steady-state steps)"
