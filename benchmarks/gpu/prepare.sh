#!/usr/bin/env bash
# Prepare a run on a lent NVIDIA GPU machine (run this HERE, from any directory).
#
# That machine has torch, triton, numpy, ml_dtypes, hypothesis, pytest and transformers but
# nothing of ours, and it cannot download. This builds our pure-Python packages (nvfp4-core,
# nvfp4-triton, nvfp4-cuda, nvfp4-conformance) as wheels into .whl/ at the repository root
# (ignored by git) for the device tool to carry; run.sh installs them there.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
rm -rf .whl
mkdir .whl
python3 -m pip wheel -q --no-deps -w .whl \
    ./packages/nvfp4-core ./packages/nvfp4-triton ./packages/nvfp4-cuda ./conformance
ls -l .whl
echo "now: device run(command='bash benchmarks/gpu/run.sh', carry=['.whl'], timeout_s=560)"
