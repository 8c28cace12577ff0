"""``compressed-tensors``: the ``nvfp4-pack-quantized`` code of compressed-tensors (the
format of llm-compressor and vLLM checkpoints), as its users run it on CPU.

What the engine has, and the kernel each becomes:

* ``NVFP4PackedCompressor.decompress({weight_packed, weight_scale, weight_global_scale},
  scheme)`` with the ``NVFP4`` preset scheme -> :meth:`dequantize`: the decompressor a
  checkpoint loader runs (``unpack_fp4_from_uint8``, then ``dequantize`` with the ENCODE
  global ``weight_global_scale``, which compressed-tensors divides by). It returns
  bfloat16 whatever the checkpoint (its unpack dtype); that is cast to the asked dtype;
* the quantizer of the ``NVFP4`` scheme's activation arguments -> :meth:`quantize_activations`
  (the contract's only NVFP4 encoder: the spec's encoder rule is the same for weights and
  activations): the global is compressed-tensors' own ``generate_gparam(min, max)`` of x
  (the ENCODE global ``448 * 6 / amax``, what llm-compressor's observer stores as
  ``input_global_scale``) when the scale is dynamic, and a static input scale ``s`` goes in
  as its ``input_global_scale`` (:func:`nvfp4.layouts.compressed_tensors.input_global_scale_from_input_scale`);
  the block scales are ``compute_dynamic_scales_and_zp`` (the ``dynamic="local"`` path of
  the scheme's activations), and the codes and scale bytes are
  ``NVFP4PackedCompressor.compress`` of x with them (``quantize`` then ``pack_fp4_to_uint8``
  on CPU).

What it lacks is absent, not filled in: compressed-tensors has no NVFP4 matmul
(``CompressedLinear`` is gone; vLLM runs these checkpoints), so no ``qmm`` / ``gather_qmm``.

The tensors compressed-tensors reads are those of
:func:`nvfp4.layouts.compressed_tensors.to_compressed_tensors` (the codes and scale bytes
unchanged, the global as its correctly rounded reciprocal). The decompressor takes one
2-D tensor, as a checkpoint stores one per projection and per expert: a fused tensor is
handed over one partition at a time and an expert stack one expert at a time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Final

from nvfp4.backend import Frontend
from nvfp4.fusion import unfuse, unstack_experts
from nvfp4.layouts.compressed_tensors import (
    WEIGHT_GLOBAL_SCALE,
    WEIGHT_PACKED,
    WEIGHT_SCALE,
    decode_global,
    input_global_scale_from_input_scale,
    to_compressed_tensors,
)
from nvfp4.planes import NVFP4Planes
from nvfp4.spec import BLOCK_SIZE

from . import _torch
from ._common import (
    EngineKernels,
    activation_planes,
    cached_probe,
    require,
)

__all__ = ["DISTRIBUTION", "NAME", "CompressedTensorsKernels", "CtWeight", "backend"]

NAME: Final = "compressed-tensors"
DISTRIBUTION: Final = "compressed-tensors"
INSTALL: Final = "pip install 'compressed-tensors>=0.20'"
#: The preset scheme whose weights and activations are NVFP4 (W4A4).
SCHEME: Final = "NVFP4"


@dataclass(frozen=True)
class CtWeight:
    """A prepared weight: compressed-tensors state dicts (torch tensors), one per partition
    and, within it, one per expert (``experts`` is None for a 2-D weight)."""

    parts: tuple[tuple[dict[str, Any], ...], ...]
    experts: int | None


def _check() -> str:
    planes = _quantize(_engine(), _torch.torch().ones((1, BLOCK_SIZE)), None)
    _decompress(_engine(), to_compressed_tensors(planes))
    return _torch.cpu_device(DISTRIBUTION)


_probe = cached_probe("compressed-tensors", DISTRIBUTION, INSTALL, "its NVFP4 compressor", _check)


@dataclass(frozen=True)
class _Engine:
    compressor: Any
    scheme: Any
    generate_gparam: Any
    compute_dynamic_scales_and_zp: Any


@functools.lru_cache(maxsize=1)
def _engine() -> _Engine:
    from compressed_tensors.compressors.nvfp4 import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.utils import (
        compute_dynamic_scales_and_zp,
        generate_gparam,
    )

    return _Engine(
        NVFP4PackedCompressor,
        preset_name_to_scheme(SCHEME, ["Linear"]),
        generate_gparam,
        compute_dynamic_scales_and_zp,
    )


def _ready() -> _Engine:
    require(NAME, _probe())
    return _engine()


def _decompress(e: _Engine, tensors: dict[str, Any]) -> Any:
    sd = {k: _torch.from_numpy(v) for k, v in tensors.items()}
    return e.compressor.decompress(sd, e.scheme)["weight"]


def _quantize(e: _Engine, x: Any, input_scale: float | None) -> NVFP4Planes:
    torch = _torch.torch()
    if input_scale is None:  # the observer's min / max of x, then compressed-tensors' global
        lo, hi = torch.aminmax(x)
        g = e.generate_gparam(lo, hi)
    else:
        g = _torch.tensor(input_global_scale_from_input_scale(input_scale, "activation"))
    scale, zero_point = e.compute_dynamic_scales_and_zp(
        x, e.scheme.input_activations, module=None, global_scale=g
    )
    sd = e.compressor.compress(
        {
            "weight": x,
            "weight_scale": scale,
            "weight_global_scale": g,
            "weight_zero_point": zero_point,
        },
        e.scheme,
    )
    # the codes and scale bytes are the canonical ones; the decode global is the ENCODE
    # global's reciprocal (the layout's one conversion)
    return activation_planes(
        _torch.to_numpy(sd[WEIGHT_PACKED]),
        _torch.to_numpy(sd[WEIGHT_SCALE]),
        decode_global(_torch.to_numpy(sd[WEIGHT_GLOBAL_SCALE]), "activation").reshape(()),
    )


class CompressedTensorsKernels(EngineKernels, _torch.TorchArrays):
    """The kernel contract over compressed-tensors' NVFP4 compressor (``torch.Tensor`` in
    and out)."""

    NAME = NAME
    DISTRIBUTION = DISTRIBUTION
    probe = staticmethod(_probe)
    CAPABILITIES = frozenset({"dequantize", "fused_partitions", "quantize_activations"})
    NOTES = (
        "dequantize: NVFP4PackedCompressor.decompress (scheme NVFP4), which returns "
        "bfloat16, cast to the asked dtype; one projection and one expert at a time",
        "quantize_activations: generate_gparam(min, max) of x (dynamic) or "
        "input_global_scale = 1 / input_scale (static), compute_dynamic_scales_and_zp, "
        "NVFP4PackedCompressor.compress",
        "absent: compressed-tensors has no NVFP4 matmul",
    )

    def prepare(self, planes: NVFP4Planes) -> CtWeight:
        _ready()
        parts = []
        for part in unfuse(planes):
            mats = unstack_experts(part) if part.num_experts is not None else [part]
            parts.append(
                tuple(
                    {k: _torch.from_numpy(v) for k, v in to_compressed_tensors(m).items()}
                    for m in mats
                )
            )
        return CtWeight(tuple(parts), planes.num_experts)

    def dequantize(self, w: CtWeight, *, dtype: str) -> Any:
        e = _ready()
        torch = _torch.torch()
        rows = []
        for mats in w.parts:
            dense = [e.compressor.decompress(sd, e.scheme)["weight"] for sd in mats]
            rows.append(torch.stack(dense) if w.experts is not None else dense[0])
        return _torch.cat_parts(rows, dim=-2).to(_torch.torch_dtype(dtype))

    def quantize_activations(self, x: Any, *, input_scale: float | None) -> NVFP4Planes:
        return _quantize(_ready(), x, input_scale)


def backend() -> Frontend:
    """Entry-point factory (``compressed-tensors =
    "nvfp4_engines.compressed_tensors:backend"``): cheap, never raises."""
    return Frontend(CompressedTensorsKernels())
