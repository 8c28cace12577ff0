"""ggml (CPU backend): ggml_mul_mat_id uses an expert id outside [0, n_as) unchecked.

ggml_compute_forward_mul_mat_id groups the rows by expert id with
`assert(i02 >= 0 && i02 < n_as)`, which a release build (NDEBUG) compiles out, then writes
matrix_row_counts[i02] and the row mapping at that id: for i02 = n_as that is past the end
of the counts array, and the row itself is never computed, so the output keeps whatever
its memory held. Shown with NVFP4 experts (GGML_TYPE_NVFP4 = 40); the grouping does not
depend on the weight type.

Needs numpy and ggml's shared libraries: those of libggml-python (import libggml) or of
llama-cpp-python (import llama_cpp), or libggml-base.so and libggml-cpu.so in the folder
GGML_LIB_DIR names. Prints the expected
and the actual output row; exits 1 while the row of an id outside [0, E) is left
unwritten (not zero), 0 once it is zero or the graph refuses the id.
"""

import ctypes
import glob
import os
import sys

import numpy as np

lib = os.environ.get("GGML_LIB_DIR")
if not lib:
    try:  # libggml-python's prebuilt libraries
        import libggml

        lib = os.path.join(os.path.dirname(libggml.__file__), "lib64")
    except ImportError:  # or the copies llama-cpp-python bundles
        import llama_cpp

        lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
base = ctypes.CDLL(glob.glob(lib + "/libggml-base.so")[0], mode=ctypes.RTLD_GLOBAL)
cpu = ctypes.CDLL(glob.glob(lib + "/libggml-cpu.so")[0], mode=ctypes.RTLD_GLOBAL)
vp, i64 = ctypes.c_void_p, ctypes.c_int64


class Init(ctypes.Structure):  # struct ggml_init_params
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", vp), ("no_alloc", ctypes.c_bool)]


for name, res, args in [
    ("ggml_init", vp, [Init]),
    ("ggml_new_tensor_2d", vp, [vp, ctypes.c_int, i64, i64]),
    ("ggml_new_tensor_3d", vp, [vp, ctypes.c_int, i64, i64, i64]),
    ("ggml_get_data", vp, [vp]),
    ("ggml_mul_mat_id", vp, [vp, vp, vp, vp]),
    ("ggml_graph_compute_with_ctx", ctypes.c_int, [vp, vp, ctypes.c_int]),
    ("ggml_new_graph", vp, [vp]),
    ("ggml_build_forward_expand", None, [vp, vp]),
]:
    fn = getattr(base, name, None) or getattr(cpu, name)
    fn.restype, fn.argtypes = res, args

# NVFP4, written out: a 36-byte GGML_TYPE_NVFP4 super-block holds 4 E4M3 scale bytes and 32
# bytes of E2M1 codes (64 weights). All bytes 0: scale 0, code 0 (E2M1 0.0), so every weight
# decodes to 0.0 and every valid row of x @ w[e]^T is 0.0.
E, N, K = 2, 8, 64
want = [0.0] * N  # the row of an id outside [0, E): zero (or the id refused)

cpu.ggml_cpu_init()
ctx = base.ggml_init(Init(1 << 24, None, False))
w = base.ggml_new_tensor_3d(ctx, 40, K, N, E)  # NVFP4 experts [E, N, K]
x = base.ggml_new_tensor_3d(ctx, 0, K, 1, 1)  # F32 activations, one token
ids = base.ggml_new_tensor_2d(ctx, 26, 1, 1)  # I32 expert ids
ctypes.memset(base.ggml_get_data(w), 0, E * N * (K // 64) * 36)
ctypes.memset(base.ggml_get_data(x), 0, K * 4)
ctypes.c_int32.from_address(base.ggml_get_data(ids)).value = E  # outside [0, E)
y = base.ggml_mul_mat_id(ctx, w, x, ids)
out = np.ctypeslib.as_array((ctypes.c_float * N).from_address(base.ggml_get_data(y)))
out[:] = 7.0  # what the output's memory held before the call
graph = base.ggml_new_graph(ctx)
base.ggml_build_forward_expand(graph, y)
status = cpu.ggml_graph_compute_with_ctx(ctx, graph, 1)

print(f"expected: row of expert id {E} (E = {E}): {want}")
print(f"actual:   row of expert id {E} (E = {E}): {out.tolist()} (compute status {status})")
bad = status == 0 and out.tolist() != want
print("BUG: the row is left unwritten" if bad else "fixed: the row is zero or the id refused")
sys.exit(1 if bad else 0)
