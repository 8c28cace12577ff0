"""MLX: mx.quantized_matmul(mode="nvfp4") with float16 x overflows to inf where the product
is small.

mx.quantized_matmul takes no global_scale (MLX decodes an nvfp4 tensor with
global_scale / (6 * 448); mx.dequantize takes it, mx.gather_qmm takes it on the GPU only)
and returns x's dtype. The caller must multiply by the per-tensor scale afterwards, but in
float16 the unscaled sum, up to 2688 times the true one, has already overflowed: a weight
of ones quantized with global_scale = 1 (its amax) times x of ones, K = 64, gives inf where
the product is 64.

Needs mlx and numpy. Prints the expected and the actual product; exits 1 while it is not
64, 0 once it is.
"""

import sys

import mlx.core as mx
import numpy as np

# NVFP4, written out: value = e2m1(code) * e4m3(block scale) * per-tensor scale (float32).
# w = 1.0 everywhere: per-tensor scale g = amax / (6 * 448) = 1 / 2688, block scale
# 1 / (6 * g) = 448 (E4M3 0x7E), code 6 (E2M1 6.0): every weight decodes to 6 * 448 * g = 1.
K = 64
g = np.float32(1.0) / np.float32(6 * 448)
w_decoded = np.float32(6.0) * np.float32(448.0) * g
want = np.float16(np.float32(K) * w_decoded)  # float32 accumulation, one cast to float16
unscaled = np.float32(K) * np.float32(6.0 * 448.0)  # the sum before the per-tensor scale

kw = {"group_size": 16, "bits": 4, "mode": "nvfp4"}
amax = mx.array(1.0)
wq, scales = mx.quantize(mx.ones((1, K)), global_scale=amax, **kw)[:2]
x = mx.ones((1, K), mx.float16)
try:  # a fix may add global_scale (mx.dequantize has it)
    y = mx.quantized_matmul(x, wq, scales, transpose=True, global_scale=amax, **kw)
except (TypeError, ValueError):  # what a caller must do now: the per-tensor scale after
    y = mx.quantized_matmul(x, wq, scales, transpose=True, **kw)
    y = (y.astype(mx.float32) * (amax / (6 * 448))).astype(mx.float16)
got = np.array(y).reshape(-1)[0]

print(f"expected: {float(want)!r} (float16; the unscaled sum {float(unscaled)!r} exceeds 65504)")
print(f"actual:   {float(got)!r}")
fixed = bool(got == want)
print("fixed: the product is 64" if fixed else "BUG: float16 overflow before the global scale")
sys.exit(0 if fixed else 1)
