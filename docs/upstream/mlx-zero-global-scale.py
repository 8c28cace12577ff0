"""MLX: mx.quantize(mode="nvfp4") with global_scale = 0 (the amax of an all-zero tensor)
writes negative scale bytes 0xFE (E4M3 -448).

MLX decodes an nvfp4 tensor with global_scale / (6 * 448) and takes global_scale from its
caller, who passes the tensor's amax (mlx-lm's _quantize_experts: mx.max(mx.abs(w))). For an
all-zero tensor that is 0: the block scale 0 / 0 is NaN, clamped to 448 with the NaN's sign,
so every scale byte is 0xFE and the zeros decode to -0.0 under a per-tensor scale of 0.

Needs mlx and numpy. Prints the expected and the actual encoding of two blocks of zeros;
exits 1 while a scale byte is negative or NaN, 0 once it is not.
"""

import sys

import mlx.core as mx
import numpy as np


# NVFP4, written out: value = e2m1(code) * e4m3(block scale) * per-tensor scale (float32).
def e4m3(byte):
    """FP8 E4M3 (fn) decode: bias 7, subnormals when the exponent field is 0, 0x7F/0xFF NaN."""
    s, e, m = byte >> 7, (byte >> 3) & 0xF, byte & 7
    if e == 15 and m == 7:
        return float("nan")
    v = m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -v if s else v


x = np.zeros((1, 32), np.float32)  # two blocks of zeros (an all-zero expert or row)
# Expected: the per-tensor scale amax / (6 * 448) is 0, so it takes the fallback 1.0; each
# block scale amax / (6 * 1.0) is 0 and takes 1.0 as well (E4M3 byte 0x38); each zero is
# E2M1 code 0, which decodes to 0 * 1.0 * 1.0 = 0.0.
g, want_bytes, want = 1.0, [0x38, 0x38], [0.0] * x.size

kw = {"group_size": 16, "bits": 4, "mode": "nvfp4"}
xm = mx.array(x)
gs = mx.max(mx.abs(xm))  # the global_scale MLX's callers pass: the amax, here 0
wq, scales = mx.quantize(xm, global_scale=gs, **kw)[:2]
got = mx.dequantize(wq, scales, global_scale=gs, dtype=mx.float32, **kw)
bytes2 = [int(b) for b in np.array(scales).reshape(-1)]
g2 = float(np.array(gs)) / (6 * 448)  # the per-tensor scale MLX decodes with


def line(g, scale_bytes, values):
    return (
        f"per-tensor scale {float(g)!r}, scale bytes {[f'{b:#04x}' for b in scale_bytes]} "
        f"({sorted({e4m3(b) for b in scale_bytes})}), "
        f"decoded {sorted({repr(float(v)) for v in values})}"
    )


print("expected:", line(g, want_bytes, want))
print("actual:  ", line(g2, bytes2, np.array(got).reshape(-1).tolist()))
fixed = all(b < 0x7F for b in bytes2)  # no negative (bit 7) and no NaN scale byte
print("fixed: no negative or NaN scale byte" if fixed else "BUG: negative scale bytes for zeros")
sys.exit(0 if fixed else 1)
