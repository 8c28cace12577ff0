"""NVIDIA ModelOpt: NVFP4 quantization of an all-zero tensor decodes to NaN.

NVFP4QTensor.quantize takes the per-tensor scale as amax / (6 * 448) with no guard for
amax = 0: an all-zero tensor gets per-tensor scale 0, every block scale 0 / 0 = NaN (scale
byte 0xFF) and codes 0x7, so it decodes to NaN instead of 0.

Needs nvidia-modelopt and torch. Prints the expected and the actual encoding of one block of
16 zeros; exits 1 while the zeros decode to anything but 0 (or the scales are not finite and
positive), 0 once they decode to 0.
"""

import sys

import torch
from modelopt.torch.quantization.qtensor import NVFP4QTensor

# NVFP4, written out: value = e2m1(code) * e4m3(block scale) * per-tensor scale (float32).
# A block of 16 zeros: the per-tensor scale amax / (6 * 448) is 0, so it takes the fallback
# 1.0; the block scale amax / (6 * 1.0) is 0 and takes 1.0 as well (E4M3 byte 0x38); each
# zero is E2M1 code 0, which decodes to 0 * 1.0 * 1.0 = 0.0.
EXPECTED = "per-tensor scale 1.0, scale byte 0x38, codes [0], decoded ['0.0']"

x = torch.zeros((1, 16))  # one block of zeros (a pruned weight row)
q, scale, g = NVFP4QTensor.quantize(x, 16)
byte = scale.view(torch.uint8).item()
packed = q._quantized_data.reshape(-1)  # two codes a byte, the low nibble first
codes = sorted({int(b) >> k & 0xF for b in packed for k in (0, 4)})
got = q.dequantize(torch.float32, scale=scale, double_scale=g, block_sizes={-1: 16})
decoded = sorted({repr(v) for v in got.reshape(-1).tolist()})

print("expected:", EXPECTED)
print(
    f"actual:   per-tensor scale {g.item()!r}, scale byte {byte:#04x}, codes {codes}, "
    f"decoded {decoded}"
)
# fixed: zeros decode to 0 under a finite positive per-tensor scale and a scale byte that is
# neither negative nor NaN (the value of a valid byte does not matter for zeros)
fixed = bool((got == 0).all()) and 0 < g.item() < float("inf") and byte < 0x7F
print(
    "fixed: an all-zero tensor decodes to 0" if fixed else "BUG: an all-zero tensor decodes to NaN"
)
sys.exit(0 if fixed else 1)
