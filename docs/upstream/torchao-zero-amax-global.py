"""torchao: NVFP4 quantization of an all-zero tensor decodes to NaN.

per_tensor_amax_to_scale returns amax / (448 * 6) with no guard for amax = 0, and
NVFP4Tensor.to_nvfp4 divides the block scales by it: an all-zero tensor gets per-tensor
scale 0, block scales 0 / 0 = NaN (scale byte 0xFF), and decodes to NaN instead of 0. The
calls are the ones torchao's NVFP4 inference workflow makes for a weight (tensor amax, then
per_tensor_amax_to_scale, then to_nvfp4).

Needs torchao and torch. Prints the expected and the actual encoding of one block of 16
zeros; exits 1 while the zeros decode to anything but 0 (or the scales are not finite and
positive), 0 once they decode to 0.
"""

import sys

import torch
from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

# NVFP4, written out: value = e2m1(code) * e4m3(block scale) * per-tensor scale (float32).
# A block of 16 zeros: the per-tensor scale amax / (6 * 448) is 0, so it takes the fallback
# 1.0; the block scale amax / (6 * 1.0) is 0 and takes 1.0 as well (E4M3 byte 0x38); each
# zero is E2M1 code 0, which decodes to 0 * 1.0 * 1.0 = 0.0.
EXPECTED = "per-tensor scale 1.0, scale byte 0x38, codes [0], decoded ['0.0']"

w = torch.zeros((1, 16))  # one block of zeros (a pruned weight row)
g = per_tensor_amax_to_scale(torch.max(torch.abs(w)))  # as the inference workflow does
q = NVFP4Tensor.to_nvfp4(w, 16, per_tensor_scale=g)
byte = q.scale.view(torch.uint8).reshape(-1)[0].item()
codes = sorted({int(b) >> k & 0xF for b in q.qdata.reshape(-1) for k in (0, 4)})
got = q.dequantize(torch.float32)
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
