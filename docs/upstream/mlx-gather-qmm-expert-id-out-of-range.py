"""MLX: mx.gather_qmm(mode="nvfp4") uses an expert id outside [0, E) unchecked.

rhs_indices selects one expert of w [E, N, K] per row. An id of E or more wraps around to
another expert, and an id of 2^32 - 1 (-1 as int32) reads the expert before w's first
byte: memory outside w. Neither raises. Here w is a view of experts 1 and 2 of a stack of
three, so the memory before it is expert 0 and what the read returns is known.

Needs mlx and numpy. Prints the expected and the actual rows; exits 1 while an id outside
[0, E) returns a row that is not zero without an error, 0 once such ids raise or give zeros.
"""

import sys

import mlx.core as mx
import numpy as np

# NVFP4, written out: value = e2m1(code) * e4m3(block scale) * per-tensor scale (float32).
# A block of 16 equal values v with per-tensor scale 1.0 gets block scale v / 6 (exact for
# the values below: an E4M3 power of two) and code 6 (E2M1 6.0), so it decodes to v exactly.
K = 64
levels = [1.5, 3.0, 6.0]  # experts 0, 1, 2 of the stack; w holds experts 1 and 2 (E = 2)
x = np.ones((1, K), np.float32)
row = {e: float(np.float32(K * levels[e + 1])) for e in range(2)}  # x @ w[e].T, every column
want = {0: row[0], 1: row[1], 2: 0.0, 2**32 - 1: 0.0}  # an id outside [0, E): a zero row

kw = {"group_size": 16, "bits": 4, "mode": "nvfp4"}
stack = mx.stack([mx.full((4, K), v) for v in levels])  # [3, N = 4, K]
wq, scales = mx.quantize(stack, **kw)[:2]
mx.eval(wq, scales)
w, s = wq[1:], scales[1:]  # E = 2: a view that starts one expert into the stack
got, raised = {}, {}
for i in want:
    try:
        ids = mx.array([i], mx.uint32)
        y = mx.gather_qmm(mx.array(x)[None], w, s, rhs_indices=ids, transpose=True, **kw)
        got[i] = float(np.array(y).reshape(-1)[0])
    except Exception as exc:  # a fix may refuse such ids
        raised[i] = f"{type(exc).__name__}: {exc}"

print("expected:", ", ".join(f"id {i} -> {v!r}" for i, v in want.items()), "(E = 2)")
print("actual:  ", ", ".join(f"id {i} -> {got.get(i, raised.get(i))!r}" for i in want))
bad = [i for i in (2, 2**32 - 1) if i in got and got[i] != 0.0]
print("BUG: ids outside [0, 2) read other experts" if bad else "fixed: such ids raise or give 0")
sys.exit(1 if bad else 0)
