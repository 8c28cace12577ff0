#!/usr/bin/env bash
# Prepare a run on a lent NVIDIA GPU machine (run this HERE, from any directory).
#
# That machine has torch, triton, numpy, ml_dtypes, hypothesis, pytest, attrs and
# transformers but nothing of ours, and it cannot download. This builds our pure-Python
# packages (nvfp4-core, nvfp4-triton, nvfp4-cuda, nvfp4-conformance) as wheels into .whl/ at
# the repository root (ignored by git) for the device tool to carry, with what they require
# and the machine's image lacks (carried.txt: jsonschema, with which the suite checks every
# certificate it writes, and its dependencies), built for the machine's Python
# (DEVICE_PYTHON, default 3.12: the image's python3 is 3.12.3). run.sh installs them there.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
py="${DEVICE_PYTHON:-3.12}"
rm -rf .whl
mkdir .whl
python3 -m pip wheel -q --no-deps -w .whl \
    ./packages/nvfp4-core ./packages/nvfp4-triton ./packages/nvfp4-cuda ./conformance
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl \
    --python-version "$py" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 \
    $(grep -v '^#' benchmarks/gpu/carried.txt)
ls -l .whl
echo "now: device run(command='bash benchmarks/gpu/run.sh', carry=['.whl'], timeout_s=560)"
