"""torchao: NVFP4 quantization of an all-zero tensor decodes to NaN.

per_tensor_amax_to_scale returns amax / (448 * 6) with no guard for amax = 0, and
NVFP4Tensor.to_nvfp4 divides the block scales by it: an all-zero tensor gets per-tensor
scale 0, block scales 0 / 0 = NaN (scale byte 0xFF), and decodes to NaN instead of 0. The
calls are the ones torchao's NVFP4 inference workflow makes for a weight (tensor amax, then
per_tensor_amax_to_scale, then to_nvfp4).

Needs torchao, torch and numpy. Prints the expected and the actual encoding of one block of
16 zeros; exits 1 while the zeros decode to anything but 0 (or the scales are not finite and
positive), 0 once they decode to 0.
"""

import sys

import numpy as np
import torch
from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

# NVFP4, written out: value = e2m1(code) * e4m3(block scale) * per-tensor scale (float32).
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)  # codes 0-7; bit 3 is the sign


def e4m3(byte):
    """FP8 E4M3 (fn) decode: bias 7, subnormals when the exponent field is 0, 0x7F/0xFF NaN."""
    s, e, m = byte >> 7, (byte >> 3) & 0xF, byte & 7
    if e == 15 and m == 7:
        return float("nan")
    v = m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -v if s else v


def encode_block(x):
    """One block of 16: per-tensor scale amax / 2688 (1.0 where that is 0), block scale
    amax / (6 * scale) (1.0 where 0) clamped to [2^-9, 448] and rounded to E4M3, codes by
    round-to-nearest-even on the E2M1 grid."""
    amax = np.float32(np.abs(x).max())
    g = np.float32(amax / np.float32(6 * 448)) or np.float32(1.0)
    s = np.float32(amax / (np.float32(6) * g)) or np.float32(1.0)
    s = min(max(float(s), 2.0**-9), 448.0)
    byte = min(range(1, 0x7F), key=lambda b: (abs(e4m3(b) - s), b & 1))
    q = np.abs(x) / np.float32(np.float32(e4m3(byte)) * g)
    nearest = [min(range(8), key=lambda c: (abs(E2M1[c] - v), c & 1)) for v in q]  # ties: even
    codes = [c | (8 if w < 0 else 0) for c, w in zip(nearest, x, strict=True)]
    return g, byte, codes


x = np.zeros(16, np.float32)  # one block of zeros (a pruned weight row)
g, byte, codes = encode_block(x)
want = [float(E2M1[c & 7] * (-1 if c & 8 else 1) * e4m3(byte) * g) for c in codes]

w = torch.from_numpy(x).reshape(1, 16)
g2 = per_tensor_amax_to_scale(torch.max(torch.abs(w)))  # as the inference workflow does
q = NVFP4Tensor.to_nvfp4(w, 16, per_tensor_scale=g2)
byte2 = q.scale.view(torch.uint8).reshape(-1)[0].item()
codes2 = [int(b) >> k & 0xF for b in q.qdata.reshape(-1) for k in (0, 4)]
got = q.dequantize(torch.float32)


def line(g, byte, codes, values):
    return (
        f"per-tensor scale {float(g)!r}, scale byte {byte:#04x}, codes {sorted(set(codes))}, "
        f"decoded {sorted({repr(float(v)) for v in values})}"
    )


print("expected:", line(g, byte, codes, want))
print("actual:  ", line(g2.item(), byte2, codes2, got.reshape(-1).tolist()))
# fixed: zeros decode to 0 under a finite positive per-tensor scale and a scale byte that is
# neither negative nor NaN (the value of a valid byte does not matter for zeros)
fixed = bool((got == 0).all()) and 0 < g2.item() < float("inf") and byte2 < 0x7F
print(
    "fixed: an all-zero tensor decodes to 0" if fixed else "BUG: an all-zero tensor decodes to NaN"
)
sys.exit(0 if fixed else 1)
