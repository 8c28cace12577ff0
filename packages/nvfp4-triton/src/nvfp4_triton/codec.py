"""The NVFP4 element and scale codecs as ``@triton.jit`` helpers, shared by every kernel.

Decoders (exact, no lookup table, no denormal arithmetic, so they behave the same on
NVIDIA, AMD and the interpreter):

* :func:`e2m1_to_f32` - a 4-bit E2M1 code (0..15) to its float32 value;
* :func:`e4m3_to_f32` - an FP8 E4M3 byte (0..255) to its float32 value;
* :func:`e2m1_code_scaled` - code ``R`` of int32 words (4 code bytes each) to float32 values
  times ``2^-14`` (:data:`E2M1_UNSCALE` restores them), a few integer operations per code:
  the decoder of the streaming kernels' inner loops, which fold the factor into the block
  scale.

Encoders (bit-exact to :mod:`nvfp4.reference`):

* :func:`e4m3_rne` - a float32 in ``[2^-9, 448]`` to the nearest E4M3 value, ties to even,
  returning the byte and its value;
* :func:`e2m1_rne_index` - ``|q|`` to the nearest E2M1 magnitude index, ties to even,
  saturating at 6.

Output:

* :func:`round_out` - float32 to the output dtype with round-to-nearest-even. float16 uses
  Triton's cast; bfloat16 is rounded here on the bits, because the interpreter's own
  float32 -> bfloat16 cast truncates.

Every number comes from :mod:`nvfp4.spec` (the rounding bounds of E2M1, the range of E4M3);
``tests/test_codec.py`` checks the decoders on all 16 codes and all 256 bytes and the
encoders on every rounding boundary against :mod:`nvfp4.spec` and :mod:`nvfp4.reference`.
"""

from __future__ import annotations

import triton
import triton.language as tl
from nvfp4.spec import E2M1_BOUNDS, E2M1_ODD_BOUNDS, E4M3_MAX, E4M3_MIN_SUBNORMAL

__all__ = [
    "E2M1_UNSCALE",
    "e2m1_code_scaled",
    "e2m1_rne_index",
    "e2m1_to_f32",
    "e4m3_rne",
    "e4m3_to_f32",
    "e4m3_valid_to_f32",
    "round_out",
]

# The E2M1 rounding bounds (midpoints between consecutive magnitudes) and the three ties
# whose even neighbour is the upper magnitude, from nvfp4.spec.
_B0 = tl.constexpr(float(E2M1_BOUNDS[0]))  # 0.25
_B1 = tl.constexpr(float(E2M1_BOUNDS[1]))  # 0.75
_B2 = tl.constexpr(float(E2M1_BOUNDS[2]))  # 1.25
_B3 = tl.constexpr(float(E2M1_BOUNDS[3]))  # 1.75
_B4 = tl.constexpr(float(E2M1_BOUNDS[4]))  # 2.5
_B5 = tl.constexpr(float(E2M1_BOUNDS[5]))  # 3.5
_B6 = tl.constexpr(float(E2M1_BOUNDS[6]))  # 5.0
_ODD0 = tl.constexpr(float(E2M1_ODD_BOUNDS[0]))  # 0.75
_ODD1 = tl.constexpr(float(E2M1_ODD_BOUNDS[1]))  # 1.75
_ODD2 = tl.constexpr(float(E2M1_ODD_BOUNDS[2]))  # 3.5
assert len(E2M1_BOUNDS) == 7
assert len(E2M1_ODD_BOUNDS) == 3

# E4M3: the clamp range of a block scale, the subnormal step (2^-9) and where the normal
# range starts (2^-6 = 8 subnormal steps).
_E4M3_MAX = tl.constexpr(float(E4M3_MAX))  # 448
_E4M3_STEP = tl.constexpr(float(E4M3_MIN_SUBNORMAL))  # 2^-9
_E4M3_INV_STEP = tl.constexpr(1.0 / float(E4M3_MIN_SUBNORMAL))  # 512
_E4M3_MIN_NORMAL = tl.constexpr(8.0 * float(E4M3_MIN_SUBNORMAL))  # 2^-6


@triton.jit
def e2m1_to_f32(code):
    """E2M1 codes (an int32 tensor, values 0..15) -> float32 values, exactly.

    Bits: ``s e e m`` (sign, 2 exponent bits with bias 1, 1 mantissa bit). The magnitude
    index ``i = code & 7`` orders the values 0, 0.5, 1, 1.5, 2, 3, 4, 6. For ``i >= 2`` the
    value is normal, ``(1 + m/2) * 2^(e-1)``; its float32 bits are exponent ``126 + e``
    and mantissa bit 22 = ``m``, which is ``(126 << 23) + (i << 22)`` because ``i = 2e + m``.
    ``i`` = 0 and 1 are 0 and 0.5. The sign bit (code bit 3) is set on the result's bits,
    so code 8 is -0.0 (a float negation ``-x`` gives +0.0 for 0 on Triton 3.6's interpreter).
    """
    mag = code & 7
    normal = ((126 << 23) + (mag << 22)).to(tl.float32, bitcast=True)
    small = mag.to(tl.float32) * 0.5
    value = tl.where(mag >= 2, normal, small)
    return (value.to(tl.int32, bitcast=True) | ((code >> 3) << 31)).to(tl.float32, bitcast=True)


#: :func:`e2m1_code_scaled` returns E2M1 values times 2^-14; this factor restores them (a power
#: of two: folding it into a block scale is exact).
E2M1_UNSCALE = tl.constexpr(16384.0)


# Masks for e2m1_code_scaled, as int32 constants: bits 9..11 and 15 of both 16-bit halves
# (0x0E000E00 and 0x80008000; the latter written as its signed int32 value).
_MAG_BITS = tl.constexpr(0x0E000E00)
_SIGN_BITS = tl.constexpr(0x80008000 - (1 << 32))


@triton.jit
def e2m1_code_scaled(word, R: tl.constexpr):
    """Code ``R`` (0..7) of int32 words holding 4 code bytes each (little-endian: byte ``j``
    holds codes ``2j``, low nibble, and ``2j + 1``) -> its E2M1 value times 2^-14, float32,
    exactly. Called for ``R = 0..7`` on the same words (``tl.static_range``), the compiler
    shares the work codes ``R`` and ``R + 4`` have in common.

    A float16 is ``s eeeee mmmmmmmmmm`` (bias 15). Writing a code ``s e1 e0 m`` as the
    float16 with sign ``s``, exponent field ``e = e1 e0`` (0..3) and top mantissa bit ``m``
    (bits 15, 10..11 and 9) gives ``2^(e-15) * (1 + m/2)`` for ``e >= 1`` and the subnormal
    ``m * 2^-1 * 2^-14`` for ``e = 0``: in both cases the E2M1 value (``2^(e-1) * (1 + m/2)``,
    resp. ``m * 0.5``) times ``2^-14``. The float16 -> float32 conversion is exact (float16
    subnormals are float32 normals; no denormal arithmetic happens).

    One shift-and-mask of the word places a code in *each* 16-bit half, because the nibbles
    of bytes 0 and 2 (and of bytes 1 and 3) are 16 bits apart. For the nibble starting at
    bit ``4q`` the magnitude moves by ``9 - 4q`` and the sign by ``12 - 4q``::

        nibble 0 (element 0) and nibble 4 (element 4):  << 9,  << 12
        nibble 1 (element 1) and nibble 5 (element 5):  << 5,  << 8
        nibble 2 (element 2) and nibble 6 (element 6):  << 1,  << 4
        nibble 3 (element 3) and nibble 7 (element 7):  >> 3,  as is

    so 8 codes cost 4 x (two shifts and two logic operations) plus 8 float16 -> float32
    conversions, which the compiler reads straight from the register's halves (codes 0..3
    the low halves, 4..7 the high ones): the decode of the streaming kernels' inner loops
    (``benchmarks/triton_sass.py`` counts it).
    """
    Q: tl.constexpr = R % 4  # the nibble within a 16-bit half
    if Q == 3:
        pattern = ((word >> 3) & _MAG_BITS) | (word & _SIGN_BITS)
    else:
        pattern = ((word << (9 - 4 * Q)) & _MAG_BITS) | ((word << (12 - 4 * Q)) & _SIGN_BITS)
    if R >= 4:
        pattern = pattern >> 16
    return pattern.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def e4m3_to_f32(byte):
    """FP8 E4M3 bytes (an int32 tensor, values 0..255) -> float32 values, exactly.

    Bits: ``s eeee mmm`` with bias 7. Exponent field ``e >= 1`` is normal,
    ``(1 + m/8) * 2^(e-7)``: float32 exponent ``e + 120`` and mantissa bits 20..22 = ``m``,
    i.e. the low 7 bits shifted left by 20 plus ``120 << 23``. ``e == 0`` is subnormal,
    ``m * 2^-9``. ``0x7F`` and ``0xFF`` are NaN (planes never hold them: validation
    refuses them; activation blocks with NaN or Inf get 0x7F on purpose).
    """
    mag = byte & 0x7F
    normal = ((mag << 20) + (120 << 23)).to(tl.float32, bitcast=True)
    subnormal = (mag & 7).to(tl.float32) * _E4M3_STEP
    value = tl.where((mag >> 3) == 0, subnormal, normal)
    nan = (mag * 0 + 0x7FC00000).to(tl.float32, bitcast=True)
    value = tl.where(mag == 0x7F, nan, value)
    # the sign bit (byte bit 7) set on the bits, as in e2m1_to_f32
    return (value.to(tl.int32, bitcast=True) | ((byte >> 7) << 31)).to(tl.float32, bitcast=True)


@triton.jit
def e4m3_valid_to_f32(byte):
    """A *valid* scale byte (0x00..0x7E, what validated planes hold) -> float32, exactly,
    in three operations: the byte shifted left by 7 is the float16 with the same exponent
    and mantissa bits (float16's exponent bias is 15, E4M3's 7; E4M3 subnormals land on
    float16 subnormals), i.e. ``e4m3 * 2^-8``; the float32 conversion is exact and the
    multiply by 256 restores the value. The weight kernels use it in their inner loops;
    :func:`e4m3_to_f32` handles every byte (NaN and sign too)."""
    half = (byte << 7).to(tl.int16).to(tl.float16, bitcast=True)
    return half.to(tl.float32) * 256.0


@triton.jit
def e4m3_rne(s):
    """Round float32 ``s`` in ``[2^-9, 448]`` (the caller clamps) to E4M3, nearest, ties to
    even, exactly as :func:`nvfp4.spec.e4m3_round`. Returns ``(byte, value)``: the int32
    E4M3 byte (0x01..0x7E) and its float32 value.

    Normal range (``s >= 2^-6``): E4M3 keeps 3 of float32's 23 mantissa bits. Adding
    ``2^19 - 1`` plus the lowest kept bit, then clearing the 20 dropped bits, rounds the bit
    pattern to nearest with ties to even; a carry out of the mantissa increments the
    exponent, which is the right result (``s <= 448`` cannot carry past 448). The byte is
    then ``(float32 exponent - 120) << 3 | kept mantissa bits``.

    Subnormal range (``s < 2^-6``): the grid is the multiples of ``2^-9``, so the byte is
    ``rint(s * 512)`` (at most 8, which is 0x08 = 2^-6, the first normal). ``s * 512`` is
    exact and below 8; adding and subtracting ``2^23`` rounds it to an integer with the
    float unit's own round-to-nearest-even.
    """
    bits = s.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # -1048576 = ~0xFFFFF
    normal_value = rounded.to(tl.float32, bitcast=True)
    normal_byte = (((rounded >> 23) - 120) << 3) | ((rounded >> 20) & 7)
    steps = (s * _E4M3_INV_STEP + 8388608.0) - 8388608.0  # 8388608 = 2^23
    sub_byte = steps.to(tl.int32)
    sub_value = steps * _E4M3_STEP
    is_sub = s < _E4M3_MIN_NORMAL
    return tl.where(is_sub, sub_byte, normal_byte), tl.where(is_sub, sub_value, normal_value)


@triton.jit
def e2m1_rne_index(mag):
    """``|q|`` (float32, >= 0) -> the E2M1 magnitude index 0..7 (0, 0.5, 1, 1.5, 2, 3, 4, 6):
    nearest, ties to even, saturating at 6 - as :func:`nvfp4.reference.e2m1_encode`.

    Counting the bounds strictly below ``mag`` gives the nearest index with every tie
    rounded down; the ties whose even neighbour is above (0.75 -> 1, 1.75 -> 2, 3.5 -> 4)
    get one more. A NaN (``0 / 0`` when a block's denominator underflows) counts as
    above every bound, as numpy's ``searchsorted`` places it.
    """
    idx = (mag > _B0).to(tl.int32)
    idx += (mag > _B1).to(tl.int32)
    idx += (mag > _B2).to(tl.int32)
    idx += (mag > _B3).to(tl.int32)
    idx += (mag > _B4).to(tl.int32)
    idx += (mag > _B5).to(tl.int32)
    idx += (mag > _B6).to(tl.int32)
    idx += ((mag == _ODD0) | (mag == _ODD1) | (mag == _ODD2)).to(tl.int32)
    return tl.where(mag != mag, 7, idx)


@triton.jit
def clamp_scale(s):
    """Clamp a block scale to the E4M3 range ``[2^-9, 448]`` (after ``s == 0 -> 1``)."""
    return tl.minimum(tl.maximum(s, _E4M3_STEP), _E4M3_MAX)


@triton.jit
def _f32_to_bf16_rne(v):
    """float32 -> bfloat16 with round-to-nearest-even, on the bits: add ``2^15 - 1`` plus
    the lowest kept bit, keep the high 16 bits. NaN stays a quiet NaN."""
    bits = v.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = tl.where(v != v, 0x7FC0, rounded & 0xFFFF)
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def round_out(v, OUT_DTYPE: tl.constexpr):
    """float32 ``v`` -> ``OUT_DTYPE`` (float32, float16 or bfloat16), round to nearest even."""
    if tl.bfloat16 == OUT_DTYPE:
        return _f32_to_bf16_rne(v)
    elif tl.float16 == OUT_DTYPE:
        return v.to(tl.float16)
    else:
        return v
