#!/usr/bin/env bash
# One device call on a lent NVIDIA GPU machine: everything the GPU backends need measured, in an order
# that keeps the most valuable results if time runs out. Prepare with prepare.sh, then
#
#     device run(command="bash benchmarks/gpu/run.sh", carry=[".whl"], timeout_s=560)
#
# Steps (each under its own timeout; results under $OUT, at most 8 files):
#   1. the machine: nvidia-smi, torch / triton versions, availability() of the cuda backend;
#   2. benchmarks/cuda_kernels.py: decode bandwidth vs a device copy, prefill vs bf16
#      torch.matmul (and W4A4 on Blackwell), MoE gather; it checks every path against the
#      reference before timing (-> cuda_kernels.json, cuda_kernels.md);
#   3. conformance-cuda T0-T5 on the GPU (T6 needs the SmolLM2 wheel, ~90 MB, more than a
#      call may carry) -> conformance-cuda-gpu.json / .md.
# Copy the files back into benchmarks/results/ and docs/benchmark_results/, then write the
# measured crossovers into packages/nvfp4-cuda/src/nvfp4_cuda/dispatch.py.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/nvfp4-gpu-out}"
mkdir -p "$OUT"
unset TRITON_INTERPRET

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    || { echo "install failed: run benchmarks/gpu/prepare.sh and carry .whl"; exit 3; }
export PYTHONPATH=/tmp/site

{
    date -u
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv
    python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
    python3 -c "import nvfp4; b = nvfp4.get_backend('cuda'); print(b.availability())"
} 2>&1 | tee "$OUT/machine.txt"

timeout 300 python3 benchmarks/cuda_kernels.py \
    --out "$OUT/cuda_kernels.json" --summary "$OUT/cuda_kernels.md" 2>&1 | tee "$OUT/benchmark.log"
echo "benchmark exit: ${PIPESTATUS[0]}" | tee -a "$OUT/benchmark.log"

timeout 200 python3 -m nvfp4_conformance run --backend cuda \
    --certificate "$OUT/conformance-cuda-gpu.json" -- --nvfp4-tiers T0,T1,T2,T3,T4,T5 -q 2>&1 \
    | tail -40 | tee "$OUT/conformance.log"
echo "conformance exit: ${PIPESTATUS[0]}" | tee -a "$OUT/conformance.log"
