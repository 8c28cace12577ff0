"""The deviations the conformance suite has found in engines, each with the spec rule it
breaks (the newest registry, ``spec/1.5/deviations.toml``, read by id), a
one-line reading and, per engine, a minimal reproducer that uses only that engine's own
API (no nvfp4 code).

The engines matrix (:mod:`nvfp4_engines.matrix`) files every failed test of a certificate
under the first deviation of that engine (one with a reproducer for it) whose ``pattern``
matches the test's message; a failure no deviation matches is listed as "unclassified" with
its message. A reading ends, where it is not plain, by saying whether real checkpoints meet
the deviation or only malformed (degenerate) input does. The package's tests run
every reproducer and check that it still shows what it describes: when an engine fixes one,
that test fails and the entry must go.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Final

from nvfp4 import deviation_registry as registry

__all__ = ["DEVIATIONS", "Deviation", "classify"]


@dataclass(frozen=True)
class Deviation:
    """One way an engine departs from the spec.

    Attributes:
        key: its id in the newest registry (``spec/1.5/deviations.toml``), which
            holds the spec rule it breaks (:attr:`rule`).
        pattern: a regular expression searched in a failed test's ``"<nodeid> <message>"``.
        reading: what the engine does instead, naming the engine's functions (the
            registry's ``differs`` says it in general terms).
        reproducers: engine name -> a few lines of Python using only that engine's API; run
            as a script, it prints a line starting ``DEVIATION:`` (or dies, where ``crashes``
            names the engine).
        crashes: engines whose reproducer ends the process (a segmentation fault).
    """

    key: str
    pattern: str
    reading: str
    reproducers: dict[str, str]
    crashes: frozenset[str] = field(default_factory=frozenset)

    @property
    def rule(self) -> str:
        """The spec rule, with its version and section: the registry's ``rule``."""
        return _declared()[self.key].rule


@functools.lru_cache(maxsize=1)
def _declared() -> dict[str, registry.Deviation]:
    """The newest deviation registry by id."""
    return {d.id: d for d in registry.deviations()}


_GGML_LIBS = """\
import ctypes, glob, os, llama_cpp
lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
base = ctypes.CDLL(glob.glob(lib + "/libggml-base.so")[0], mode=ctypes.RTLD_GLOBAL)
cpu = ctypes.CDLL(glob.glob(lib + "/libggml-cpu.so")[0], mode=ctypes.RTLD_GLOBAL)
"""

_GGML_QUANTIZE = """\
base.ggml_quantize_chunk.restype = ctypes.c_size_t
base.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
"""

_TORCH_BLOCK = """\
import torch
codes = torch.full((1, 8), 0x33, dtype=torch.uint8)  # 16 codes 0x3: e2m1 1.5
scale = torch.tensor([[0x33]], dtype=torch.uint8).view(torch.float8_e4m3fn)  # E4M3 0.6875
g = torch.tensor(0.1)  # the decode global, float32
spec = (torch.tensor(1.5) * torch.tensor(0.6875)) * g  # code x scale is exact: one rounding
"""

_ONE_ROUNDING = """\
if v != spec:
    print(f"DEVIATION: 1.5 x 0.6875 x 0.1 decodes to {v.item()!r}; spec: {spec.item()!r}")
"""

#: The end of a zero_amax_global reproducer: ``g`` the engine's global of an all-zero block,
#: ``byte`` its scale byte.
_ZERO_BLOCK_GLOBAL = """\
if g.item() == 0.0 or byte > 0x7E:  # spec: global 1.0, scale byte 0x38 (1.0), codes 0
    print(f"DEVIATION: an all-zero block: global {g.item()}, scale byte {byte:#x}")
"""

DEVIATIONS: Final[tuple[Deviation, ...]] = (
    Deviation(
        key="ggml_no_global",
        pattern=r"quantize_activations: global 1\.0, the reference's is",
        reading="ggml_quantize_chunk takes no global (GGUF's .scale is the converter's): it "
        "encodes x as if the global were 1.0, so a block beyond 6 x 448 = 2688 saturates and "
        "a small one loses its codes to the scale's floor",
        reproducers={
            "ggml": _GGML_LIBS
            + _GGML_QUANTIZE
            + """\
x = (ctypes.c_float * 64)(*([10000.0] * 64))
out = (ctypes.c_uint8 * 36)()
base.ggml_quantize_chunk(40, x, out, 0, 1, 64, None)  # GGML_TYPE_NVFP4: no global argument
if out[0] == 0x7E:  # scale 448, code 6: 10000.0 decodes to 2688.0
    print("DEVIATION: 10000.0 quantized with scale byte 0x7e and no global: decodes to 2688")
""",
        },
    ),
    Deviation(
        key="k_multiple_of_64",
        pattern=r"K for GGUF NVFP4: expected a multiple of 64",
        reading="GGUF / ggml store NVFP4 rows in super-blocks of 64 elements (4 scales + 32 "
        "code bytes), so a tensor with K % 64 != 0 (K = 16, 32, 48, 272, 288 ...) has no "
        "GGUF form at all",
        reproducers={
            "gguf-py": """\
from gguf.constants import GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape
try:
    quant_shape_to_byte_shape((7, 32), GGMLQuantizationType.NVFP4)  # N = 7, K = 32
except ValueError as exc:
    print("DEVIATION:", exc)
""",
            "ggml": _GGML_LIBS
            + """\
base.ggml_blck_size.restype = ctypes.c_int64
blck = base.ggml_blck_size(40)  # GGML_TYPE_NVFP4
if blck != 16:
    print(f"DEVIATION: ggml_blck_size(GGML_TYPE_NVFP4) = {blck}: a row of K = 32 has no ggml form")
""",
        },
    ),
    Deviation(
        key="q8_nonfinite_block",
        pattern=r"expected np\.float16\(nan\)|rows holding NaN/Inf in x must give NaN",
        reading="ggml's Q8_0 quantizer (quantize_row_q8_0) takes amax with fmaxf, which skips "
        "NaN, and divides by an Inf amax: d comes out finite or Inf, and the NaN / Inf of x "
        "never reaches the output row",
        reproducers={
            "ggml": _GGML_LIBS
            + """\
class Traits(ctypes.Structure):  # struct ggml_type_traits_cpu
    _fields_ = [("from_float", ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p,
                 ctypes.c_int64)), ("vec_dot", ctypes.c_void_p), ("vec_dot_type", ctypes.c_int),
                ("nrows", ctypes.c_int64)]
cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(Traits)
cpu.ggml_cpu_init()
x = (ctypes.c_float * 32)(*([float("nan")] + [1.0] * 31))
block = (ctypes.c_uint8 * 34)()  # block_q8_0: float16 d, then 32 int8 codes
cpu.ggml_get_type_traits_cpu(8).contents.from_float(x, block, 32)  # GGML_TYPE_Q8_0
import struct
d = struct.unpack("<e", bytes(block[:2]))[0]
if d == d:
    print(f"DEVIATION: Q8_0 block of a NaN and 31 ones: d = {d} (spec: NaN)")
""",
        },
    ),
    Deviation(
        key="out_of_range_expert_id",
        pattern=r"is outside \[0, \d+\)",
        reading="the engine uses the id unchecked: MLX reads the expert stack out of bounds "
        "(a segmentation fault in the suite), ggml counts the row at that index (an "
        "out-of-bounds write) and leaves the row unwritten; the adapters refuse such ids",
        reproducers={
            "mlx-native": """\
import mlx.core as mx
w, s = mx.quantize(mx.ones((2, 8, 32)), group_size=16, bits=4, mode="nvfp4")  # E = 2
x = mx.ones((1, 1, 32))
y = mx.gather_qmm(x, w, s, None, rhs_indices=mx.array([1 << 20], mx.uint32), transpose=True,
                  group_size=16, bits=4, mode="nvfp4")  # reads expert 2^20
if (y != 0).any().item():  # or a segmentation fault first
    print("DEVIATION: row of expert id 2^20 (E = 2) is not zero:", y[0, 0, :4])
""",
            "ggml": _GGML_LIBS
            + """\
vp, i64 = ctypes.c_void_p, ctypes.c_int64
class Init(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", vp), ("no_alloc", ctypes.c_bool)]
for f, r, a in [("ggml_init", vp, [Init]), ("ggml_new_tensor_2d", vp, [vp, ctypes.c_int, i64, i64]),
                ("ggml_new_tensor_3d", vp, [vp, ctypes.c_int, i64, i64, i64]),
                ("ggml_get_data", vp, [vp]), ("ggml_mul_mat_id", vp, [vp, vp, vp, vp]),
                ("ggml_graph_compute_with_ctx", ctypes.c_int, [vp, vp, ctypes.c_int]),
                ("ggml_new_graph", vp, [vp]), ("ggml_build_forward_expand", None, [vp, vp])]:
    fn = getattr(base, f, None) or getattr(cpu, f)
    fn.restype, fn.argtypes = r, a
cpu.ggml_cpu_init()
ctx = base.ggml_init(Init(1 << 24, None, False))
w = base.ggml_new_tensor_3d(ctx, 40, 64, 8, 2)  # NVFP4 experts [E = 2, N = 8, K = 64], zeros
x = base.ggml_new_tensor_3d(ctx, 0, 64, 1, 1)  # F32 activations, one token
ids = base.ggml_new_tensor_2d(ctx, 26, 1, 1)  # I32 expert ids
ctypes.memset(base.ggml_get_data(w), 0, 2 * 8 * 36)
ctypes.c_int32.from_address(base.ggml_get_data(ids)).value = 2  # = E: outside [0, 2)
y = base.ggml_mul_mat_id(ctx, w, x, ids)
out = (ctypes.c_float * 8).from_address(base.ggml_get_data(y))
out[:] = [7.0] * 8  # what the output memory held before
graph = base.ggml_new_graph(ctx)
base.ggml_build_forward_expand(graph, y)
cpu.ggml_graph_compute_with_ctx(ctx, graph, 1)
if list(out) != [0.0] * 8:
    print("DEVIATION: the row of expert id 2 (E = 2) is left unwritten:", list(out))
""",
        },
        crashes=frozenset({"mlx-native"}),
    ),
    Deviation(
        key="mlx_k_multiple_of_32",
        pattern=r"\[reshape\] Cannot reshape array of size \d+ into shape",
        reading="MLX's nvfp4 kernels handle scales in pairs of blocks: K = 16, 48, 272 ... "
        "(an odd number of blocks) raise a reshape error in mx.quantize and mx.dequantize "
        "(mx.quantized_matmul takes them)",
        reproducers={
            "mlx-native": """\
import mlx.core as mx
try:
    mx.quantize(mx.ones((3, 48)), group_size=16, bits=4, mode="nvfp4")  # K = 48: 3 blocks
except ValueError as exc:
    print("DEVIATION:", exc)
""",
        },
    ),
    Deviation(
        key="mlx_negative_zero_code",
        pattern=r"boundary disagreements in \d+ random elements",
        reading="mx.quantize(mode='nvfp4') writes +0 (code 0) for negatives that round to zero "
        "(3.5 % of random float32 elements), beyond [quantize] others = 1e-05",
        reproducers={
            "mlx-native": """\
import mlx.core as mx
x = mx.array([[6.0] + [-0.1] * 31])  # blocks with amax 6 (scale 1.0); -0.1 rounds to zero
w, s = mx.quantize(x, group_size=16, bits=4, mode="nvfp4")
code = (w[0, 0].item() >> 4) & 0xF  # element 1
if code != 8:
    print(f"DEVIATION: -0.1 encoded as code {code} (+0); spec: 8 (-0)")
""",
        },
    ),
    Deviation(
        key="mlx_low_precision",
        # T4's qmm cases, and T7's row- and column-parallel qmm (each rank's qmm is the same
        # call), in float16 / bfloat16
        pattern=r"qmm .*(float16|bfloat16): max\|err\|/max\|ref\||"
        r"test_(row|column)_parallel_qmm(_cancelling)?\[tp\d+-\w+-(float16|bfloat16)\]",
        reading="mx.quantized_matmul computes in x's dtype and returns float16 / bfloat16 "
        "before the decode global can be applied: float16 overflows to inf, and both miss "
        "the W4A16 tolerance",
        reproducers={
            "mlx-native": """\
import mlx.core as mx
w, s = mx.quantize(mx.full((1, 64), 2688.0), group_size=16, bits=4, mode="nvfp4")  # 6 x 448
x = mx.ones((1, 64), mx.float16)
y = mx.quantized_matmul(x, w, s, transpose=True, group_size=16, bits=4, mode="nvfp4")
if not mx.isfinite(y).all().item():  # 64 x 2688 = 172032 > float16's 65504, before any global
    print("DEVIATION: float16 quantized_matmul of an unscaled sum 172032:", y.item())
""",
        },
    ),
    Deviation(
        key="mlx_degenerate_global",
        pattern=r"global_scale at \(\): expected finite and > 0|scale byte at \(\d+, \d+\): "
        r"expected 0x00\.\.0x7E|subnormal_amax.*scale byte 0x7E, the reference's is 0x7[0-9A-E]",
        reading="mx.quantize decodes with global_scale / 2688 as given, without the spec's "
        "1.0 for a zero quotient: an all-zero tensor (or one whose amax / 2688 underflows) "
        "gets a 0 global and scale bytes 0xFE, which no decoder reads back; with the smallest "
        "subnormal global its block scales saturate at 0x7E",
        reproducers={
            "mlx-native": """\
import mlx.core as mx
x = mx.zeros((1, 32))
w, s = mx.quantize(x, group_size=16, bits=4, mode="nvfp4", global_scale=mx.max(mx.abs(x)))
if max(s.tolist()[0]) > 0x7E:  # the amax MLX asks for is 0 here
    print("DEVIATION: scale bytes of an all-zero block:", [hex(v) for v in s.tolist()[0]])
""",
        },
    ),
    Deviation(
        key="mlx_nonfinite_block",
        pattern=r"holds NaN/Inf; it must get scale byte 0x7F and codes 0",
        reading="mx.quantize gives such a block a finite scale (0x7E, the 448 clamp) and "
        "finite codes for its finite values: the NaN / infinity disappears from the product",
        reproducers={
            "mlx-native": """\
import mlx.core as mx
x = mx.array([[float("nan")] + [1.0] * 31])
w, s = mx.quantize(x, group_size=16, bits=4, mode="nvfp4", global_scale=mx.array(1.0))
if s[0, 0].item() != 0x7F:
    print(f"DEVIATION: scale byte of a block holding a NaN: {s[0, 0].item():#x} (spec: 0x7f)")
""",
        },
    ),
    Deviation(
        key="scale_byte_zero",
        pattern=r"has scale byte 0x00, the reference's is 0x",
        reading="the engine writes scale byte 0x00 for an all-zero block and for a block "
        "whose scale is at most 2^-10, half the smallest E4M3 subnormal (no 1.0, no clamp)",
        reproducers={
            "ggml": _GGML_LIBS
            + _GGML_QUANTIZE
            + """\
x = (ctypes.c_float * 64)(*([0.0] * 16 + [6 * 2**-11] + [0.0] * 47))  # scales 0 and 2^-11
out = (ctypes.c_uint8 * 36)()  # one super-block: 4 scale bytes, 32 code bytes
base.ggml_quantize_chunk(40, x, out, 0, 1, 64, None)  # GGML_TYPE_NVFP4, global 1.0
if 0 in list(out[:2]):  # spec: 0x38 (1.0) and 0x01 (2^-9)
    print("DEVIATION: scale bytes of a zero block and of a block with scale 2^-11:", list(out[:2]))
""",
            "mlx-native": """\
import mlx.core as mx
kw = {"group_size": 16, "bits": 4, "mode": "nvfp4", "global_scale": mx.array(2688.0)}
x = mx.array([[0.0] * 16 + [6 * 2**-11] + [0.0] * 15])  # decode global 1: scales 0 and 2^-11
s = mx.quantize(x, **kw)[1][0].tolist()
if 0 in s:  # spec: 0x38 (1.0) and 0x01 (2^-9)
    print("DEVIATION: scale bytes of a zero block and of a block with scale 2^-11:", s)
""",
        },
    ),
    Deviation(
        key="mlx_float16_encoder",
        pattern=r"float16_input\].*scale byte 0x[0-9A-Fa-f]+, the reference's is",
        reading="mx.quantize computes the block scale in x's dtype: a float16 block whose "
        "scale lies just above an E4M3 midpoint gets the byte below (the same values as "
        "float32 get the right one)",
        reproducers={
            "mlx-native": """\
import mlx.core as mx
g = mx.array(1000.0)  # MLX's global_scale (an amax): decode global 1000 / 2688
x = [[1.6044921875] + [0.0] * 31]  # scale 1.6044921875 / 6 * 2.688 = 0.71881 > midpoint 0.71875
kw = {"group_size": 16, "bits": 4, "mode": "nvfp4", "global_scale": g}
s16 = mx.quantize(mx.array(x, mx.float16), **kw)[1][0, 0].item()
s32 = mx.quantize(mx.array(x, mx.float32), **kw)[1][0, 0].item()
if s16 != s32:  # E4M3 0x33 = 0.6875, 0x34 = 0.75
    print(f"DEVIATION: one float16 block: scale byte {s16:#x}; the same values as float32: {s32:#x}")
""",
        },
    ),
    Deviation(
        key="scale_times_global_first",
        pattern=r"dequantize.* -> (dequant_)?float32: \d+ of \d+ elements differ",
        reading="the engine multiplies the block scale by the global first (one float32 "
        "rounding), then by the code (a second): about 1 in 12 float32 values is 1 ulp off "
        "(codes 1.5 and 3); bfloat16 / float16 outputs mostly hide it. Real checkpoints",
        reproducers={
            "modelopt": _TORCH_BLOCK
            + """\
from modelopt.torch.quantization.qtensor import NVFP4QTensor
q = NVFP4QTensor(torch.Size([1, 16]), torch.float32, codes)
v = q.dequantize(torch.float32, scale=scale, double_scale=g, block_sizes={-1: 16})[0, 0]
"""
            + _ONE_ROUNDING,
            "torchao": _TORCH_BLOCK
            + """\
from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor
v = NVFP4Tensor(codes, scale, 16, torch.float32, g).dequantize(torch.float32)[0, 0]
"""
            + _ONE_ROUNDING,
        },
    ),
    Deviation(
        key="ct_bfloat16_decompress",
        pattern=r"dequantize.* -> (dequant_)?float(32|16): \d+ of \d+ elements differ",
        reading="NVFP4PackedCompressor.decompress unpacks to bfloat16 (unpack_fp4_from_uint8's "
        "default) and returns a bfloat16 weight whatever the checkpoint's dtype: float32 "
        "and float16 reads keep only bfloat16's 8 significant bits. Real checkpoints",
        reproducers={
            "compressed-tensors": _TORCH_BLOCK
            + """\
from compressed_tensors.compressors.nvfp4 import NVFP4PackedCompressor
from compressed_tensors.quantization import preset_name_to_scheme
sd = {"weight_packed": codes, "weight_scale": scale, "weight_global_scale": 1 / g.reshape(1)}
w = NVFP4PackedCompressor.decompress(sd, preset_name_to_scheme("NVFP4", ["Linear"]))["weight"]
if w.dtype != torch.float32 and w[0, 0].float() != spec:
    print(f"DEVIATION: decompressed as {w.dtype}: {w[0, 0].item()!r}; float32 spec: {spec.item()!r}")
""",
        },
    ),
    Deviation(
        key="zero_amax_global",
        pattern=r"global 0\.0, the reference's is 1\.0",
        reading="the engine's global is amax / 2688 with no 1.0 for a zero quotient "
        "(ModelOpt's weights_scaling_factor_2, torchao's per_tensor_amax_to_scale): an "
        "all-zero tensor (or one whose amax / 2688 underflows) gets global 0 and block scales "
        "0 / 0 = NaN (ModelOpt: scale byte 0xFF and codes 0x7). Malformed input only (an "
        "all-zero or subnormal tensor)",
        reproducers={
            "modelopt": """\
import torch
from modelopt.torch.quantization.qtensor import NVFP4QTensor
q, scale, g = NVFP4QTensor.quantize(torch.zeros((1, 16)), 16)  # the global left to ModelOpt
byte = scale.view(torch.uint8).item()
"""
            + _ZERO_BLOCK_GLOBAL,
            "torchao": """\
import torch
from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale
x = torch.zeros((1, 16))
g = per_tensor_amax_to_scale(torch.max(torch.abs(x)))  # as torchao's nvfp4_linear takes it
byte = NVFP4Tensor.to_nvfp4(x, 16, per_tensor_scale=g).scale.view(torch.uint8).item()
"""
            + _ZERO_BLOCK_GLOBAL,
        },
    ),
    Deviation(
        key="nonfinite_amax_global",
        pattern=r"global nan, the reference's is",
        reading="the engine takes the amax with torch.max over every value (ModelOpt's "
        "reduce_amax, torchao's nvfp4_linear): one NaN makes the global NaN and every block's "
        "scale NaN, so the whole tensor decodes to NaN, not only the NaN's block. Malformed "
        "input only (a tensor holding NaN)",
        reproducers={
            "modelopt": """\
import torch
from modelopt.torch.quantization.qtensor import NVFP4QTensor
x = torch.tensor([[float("nan")] + [1.0] * 31])  # block 0 holds the NaN, block 1 is finite
q, scale, g = NVFP4QTensor.quantize(x, 16)
if g.isnan().item():  # spec: global 1 / 2688, block 1 scale byte 0x7E, codes 0x2
    print(f"DEVIATION: global {g.item()}, scale bytes {scale.view(torch.uint8).tolist()}")
""",
            "torchao": """\
import torch
from torchao.prototype.mx_formats.nvfp4_tensor import per_tensor_amax_to_scale
x = torch.tensor([[float("nan")] + [1.0] * 31])  # block 0 holds the NaN, block 1 is finite
g = per_tensor_amax_to_scale(torch.max(torch.abs(x)))  # as torchao's nvfp4_linear takes it
if g.isnan().item():  # spec: 1 / 2688, the amax of the finite values over 2688
    print(f"DEVIATION: global of a tensor holding one NaN: {g.item()}")
""",
        },
    ),
    Deviation(
        key="ct_nonfinite_global_one",
        pattern=r"global 1\.0, the reference's is",
        reading="generate_gparam takes min / max over every value and replaces a NaN or "
        "infinite ENCODE global by 1.0: a tensor holding NaN / Inf, or one whose 2688 / amax "
        "overflows, is encoded with global 1.0 and its finite blocks lose their range. "
        "Malformed input only (non-finite or subnormal tensors)",
        reproducers={
            "compressed-tensors": """\
import torch
from compressed_tensors.quantization.utils import generate_gparam
x = torch.tensor([float("nan"), 1.0, -2.0])
lo, hi = torch.aminmax(x)  # the observer's min / max
gs = generate_gparam(lo, hi)  # the ENCODE global
if gs.item() == 1.0:  # spec: decode 2 / 2688, ENCODE 1344
    print(f"DEVIATION: ENCODE global of [nan, 1, -2]: {gs.item()} (spec: 1344)")
""",
        },
    ),
    Deviation(
        key="ct_encode_global",
        pattern=r"global [-+0-9.e]+, the reference's is",
        reading="compressed-tensors keeps the ENCODE global 2688 / amax (generate_gparam, "
        "computed in x's dtype) and decodes with its reciprocal: the decode global is 1 "
        "float32 ulp off for float32 x and carries bfloat16 / float16 rounding (up to 0.4 %) "
        "for narrow x; a static input scale's reciprocal round trip is 1 ulp off. Real "
        "checkpoints",
        reproducers={
            "compressed-tensors": """\
import torch
from compressed_tensors.quantization.utils import generate_gparam
amax = torch.tensor(1.1015625, dtype=torch.bfloat16)  # max |x| of a bfloat16 tensor
gs = generate_gparam(-amax, amax)  # the ENCODE global, what llm-compressor stores
decode = torch.tensor(1.0) / gs  # what a reader decodes with
spec = torch.tensor(1.1015625) / 2688  # amax / 2688 in float32
if decode.item() != spec.item():
    print(f"DEVIATION: amax 1.1015625 (bfloat16): decode global {decode.item()!r}, "
          f"spec {spec.item()!r}")
""",
        },
    ),
    Deviation(
        key="ct_zero_scale_eps",
        pattern=r"has scale byte 0x20, the reference's is 0x(38|01)",
        reading="calculate_qparams rounds the block scale to E4M3 and replaces a 0 by "
        "E4M3's epsilon 0.125 (byte 0x20): an all-zero block gets 0x20, not 0x38, and a "
        "block whose scale is below 2^-10 gets 0x20, not 0x01, so its values quantize to 0. "
        "Real checkpoints (zero blocks decode to 0 either way; tiny blocks are lost)",
        reproducers={
            "compressed-tensors": """\
import torch
from compressed_tensors.quantization import preset_name_to_scheme
from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp
args = preset_name_to_scheme("NVFP4", ["Linear"]).input_activations
scale, _ = compute_dynamic_scales_and_zp(
    torch.zeros((1, 16)), args, module=None, global_scale=torch.tensor([1.0]))
byte = scale.to(torch.float8_e4m3fn).view(torch.uint8).item()
if byte != 0x38:
    print(f"DEVIATION: an all-zero block gets scale {scale.item()} (byte {byte:#x}); spec 0x38")
""",
        },
    ),
    Deviation(
        key="torchao_no_float16",
        pattern=r"torch\.float16 not supported",
        reading="NVFP4Tensor.to_nvfp4 asserts that x is bfloat16 or float32: float16 "
        "activations and weights cannot be quantized. Real models (float16 ones)",
        reproducers={
            "torchao": """\
import torch
from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor
try:
    NVFP4Tensor.to_nvfp4(torch.ones((1, 16), dtype=torch.float16))
except AssertionError as exc:
    print("DEVIATION: float16 x refused:", exc)
""",
        },
    ),
    Deviation(
        key="torchao_scale_floor",
        pattern=r"has scale byte 0x08, the reference's is 0x",
        reading="nvfp4_quantize clamps block scales to [finfo(float8_e4m3fn).tiny = 2^-6, "
        "448] with no 1.0 for zero: an all-zero block gets 0x08 (spec 0x38) and a block whose "
        "scale lies in [0, 2^-6) gets 0x08, not its subnormal byte, so its codes are coarser. "
        "Real checkpoints (blocks 3 x 10^4 below the tensor's amax; zero blocks decode to 0 "
        "either way)",
        reproducers={
            "torchao": """\
import torch
from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor
x = torch.zeros((1, 32))
x[0, 16] = 6.0  # block 0 all zero, block 1 amax 6: scale 1.0 under global 1
q = NVFP4Tensor.to_nvfp4(x, 16, per_tensor_scale=torch.tensor(1.0))
b = q.scale.view(torch.uint8)[0].tolist()
if b[0] != 0x38:
    print(f"DEVIATION: scale bytes {[hex(v) for v in b]}; spec 0x38 for the zero block")
""",
        },
    ),
    Deviation(
        key="torchao_reciprocal_scale",
        pattern=r"subnormal_amax_global_2\^-149\].*not a boundary disagreement",
        reading="nvfp4_quantize multiplies x by (1 / per_tensor_scale) / scale instead of "
        "dividing by scale * global: with a subnormal global the reciprocal loses bits and "
        "codes land off the spec's rounding. Malformed input only (subnormal globals)",
        reproducers={
            "torchao": """\
import torch
from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor
x = torch.tensor([[1.471363387541058e-42, -1.4531465075048353e-42, -1.6451243971173352e-42,
                   -1.793662034335766e-42, 1.615697129366514e-42, 3.5032461608120427e-43,
                   2.3541814200656927e-43, 9.234556879900544e-43, 1.6913672464400542e-42,
                   1.1911036946760945e-42, -1.554039996936222e-42, -1.0355595651360398e-42,
                   1.678755560261131e-42, -1.6507295909746345e-42, 4.8064537326341226e-43,
                   -1.793662034335766e-42]])
q = NVFP4Tensor.to_nvfp4(x, 16, per_tensor_scale=torch.tensor(2.0**-149))  # scale byte 0x75
code = q.qdata[0, 0].item() >> 4  # element 1
if code != 14:  # x / (e4m3(0x75) * 2^-149) = -4.24...: spec code 14 (-4.0)
    print(f"DEVIATION: element 1 gets code {code}; spec 14 (-4.0)")
""",
        },
    ),
    Deviation(
        key="partials_in_activation_dtype",
        pattern=r"test_row_parallel_qmm.*row-parallel sum max\|y - ref\| / max\|ref\|",
        reading="F.linear on an NVFP4Tensor weight (the weight-only path) returns x's dtype: in "
        "a row-parallel layer each rank's partial is rounded to float16 / bfloat16 before the "
        "all-reduce, so where the ranks' partials cancel the sum keeps x's format's error "
        "(spec 1.5's bound: gamma_w * sum |p_r|). Real models served with tensor parallelism",
        reproducers={
            "torchao": """\
import torch
from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor
w = NVFP4Tensor.to_nvfp4(torch.randn(4, 32), 16, per_tensor_scale=torch.tensor(0.01))
x = torch.randn(2, 32, dtype=torch.bfloat16)
y = torch.nn.functional.linear(x, w.to(x.dtype))  # the weight-only path: one rank's partial
if y.dtype != torch.float32:
    print(f"DEVIATION: the partial of x {x.dtype} comes back as {y.dtype}, before the all-reduce")
""",
        },
    ),
)


def classify(message: str, nodeid: str = "", engine: str = "") -> Deviation | None:
    """The first deviation whose pattern matches ``"<nodeid> <message>"`` of a failed test
    (a pattern may name the case), or ``None``. With ``engine`` (an adapter name), only the
    deviations with a reproducer for that engine count: one engine's failure is never filed
    under another engine's reading."""
    text = f"{nodeid} {message or ''}"
    for d in DEVIATIONS:
        if engine and engine not in d.reproducers:
            continue
        if re.search(d.pattern, text):
            return d
    return None
