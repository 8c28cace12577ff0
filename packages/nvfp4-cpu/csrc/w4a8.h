/* nvfp4-cpu W4A8 (spec 1.1, "W4A8", capability `w4a8`): NVFP4 weights times int8 activations
 * quantized per block of 32 along K exactly as ggml's Q8_0 (`quantize_row_q8_0_ref`).
 * Declarations shared by the W4A8 driver (w4a8_api.c, baseline flags) and the per-ISA W4A8
 * translation units (w4a8_portable.c, w4a8_avx2.c, w4a8_avx512vnni.c, w4a8_neon_dotprod.c).
 * The W4A16 kernels (kernels_*.c) are not touched: the weight is the same prepared tiled
 * layout (nvfp4cpu.h).
 *
 * THE ARITHMETIC (per output y[m][n], weight row n, activation row m)
 * ---------------------------------------------------------------
 *   isum_j = sum_{t<16} (2 * e2m1(code[n][16j + t])) * xq[m][16j + t]     exact int32
 *   y      = (sum_b (isum_{2b} * e4m3(s_{2b}) + isum_{2b+1} * e4m3(s_{2b+1})) * (d[m][b] / 2))
 *            * global(n)
 * 2 * e2m1 is an integer in [-12, 12]; |isum_j| <= 16 * 12 * 127 = 24384. isum * e4m3 is
 * exact in float32 (<= 15 significant bits times 4), the sum of the two is rounded once,
 * d / 2 is exact (d is a float16 value), and the global multiplies once after accumulation
 * (the spec's order; [w4a8] bounds the float32 rounding of the sum).
 *
 * The SIMD kernels multiply unsigned bytes (the weight as u = 2 * e2m1 + 12, in [0, 24]) by
 * signed activation bytes (vpdpbusd / vpmaddubsw are u8 x s8), so
 *   isum_j = sum u * xq - 12 * sum xq = dot_j + corr_j,   corr_j = -12 * sum_{t<16} xq[16j + t]
 * with corr_j computed once per activation row and block (the "panel", below), independent
 * of the weight: nothing extra is stored with the prepared weight.
 *
 * THE Q8 PANEL (one chunk of MC activation rows, MC <= the kernel's mc_max)
 * -------------------------------------------------------------------------
 * Per activation block b of 32 elements (b = 0 .. K/32 - 1) one record of NV_Q8_REC(MC)
 * bytes, at panel + b * NV_Q8_REC(MC):
 *   int8    codes[MC][32]  the row's 32 codes of block b, in k order
 *   float   dh[MC]         d[m][b] / 2 as float32 (NaN for a block that held NaN / Inf)
 *   int32   corr[2][MC]    corr for the 16-blocks 2b (h = 0) and 2b + 1 (h = 1)
 * so a kernel reaches every value of block b from one base pointer with constant
 * displacements, and the 4 codes k .. k+3 of row m are one aligned 32-bit word (the
 * vpdpbusd broadcast operand).
 */
#ifndef NVFP4CPU_W4A8_H
#define NVFP4CPU_W4A8_H

#include <math.h>
#include <string.h>

#include "nvfp4cpu.h"

#define NV_Q8_BLOCK 32  /* activation elements per Q8_0 block (spec 1.1, ggml QK8_0) */
#define NV_Q8_MAX 127   /* largest code magnitude: d = amax / 127 */
#define NV_Q8_OFFSET 12 /* u = 2 * e2m1 + 12 is the unsigned weight byte of the SIMD kernels */
#define NV_Q8_MC_LIMIT 32 /* the largest row chunk any W4A8 kernel takes */
#define NV_F16_NAN 0x7E00u /* the float16 NaN numpy writes (np.float16(np.nan)) */

/* Bytes of one block record of a panel of MC rows (see above). */
#define NV_Q8_REC(MC) ((int64_t)(MC) * (NV_Q8_BLOCK + 4 + 8))

/* The W4A8 kernels' view of a chunk's panel (nv_chunk, nvfp4cpu.h): K/32 records (see
 * above), 64-byte aligned. */
NV_INLINE const uint8_t *nv_chunk_q8(const nv_chunk *c) { return (const uint8_t *)c->panel; }

/* The W4A8 kernels of one ISA level. */
typedef struct {
    nv_matmul_kernel mm; /* the matmul (see the arithmetic above); the first member */
    /* Q8_0 of `rows` contiguous rows of x [rows][k] (k a multiple of 32): codes [rows][k]
     * int8, d16 [rows][k/32] float16 bits; bit-identical to the reference. */
    void (*quant_rows)(const float *x, int64_t rows, int64_t k, int8_t *codes, uint16_t *d16);
} nv_w4a8_kernels;

extern const nv_w4a8_kernels nv_w4a8_portable;
#if defined(NVFP4CPU_HAVE_W4A8_AVX2)
extern const nv_w4a8_kernels nv_w4a8_avx2;
#endif
#if defined(NVFP4CPU_HAVE_W4A8_AVX512VNNI)
extern const nv_w4a8_kernels nv_w4a8_avx512vnni;
#endif
#if defined(NVFP4CPU_HAVE_W4A8_NEON_DOTPROD)
extern const nv_w4a8_kernels nv_w4a8_neon_dotprod;
#endif

/* PER-CHUNK-SIZE KERNELS
 * A SIMD level writes its tile kernel once, KERNEL(w, t, c, MC): NV_INLINE, MC rows of x
 * times tile t. NV_Q8_KERNELS_BY_MC(KERNEL, N) compiles it once per chunk size MC = 1 .. N
 * (N = 8 or 32 = NV_Q8_MC_LIMIT) as a non-inlined function KERNEL_MC, so every loop over the
 * chunk's rows unrolls and the accumulators live in registers, and defines the table
 * KERNEL_by_mc[MC] of them (entry 0 unused) that a level's qmm_tiles picks from per chunk;
 * it checks MC_MAX, the largest chunk the level takes, has a kernel. */
typedef void (*nv_q8_tile_fn)(const nv_weight *w, int64_t t, const nv_chunk *c);

#define NV_Q8_EACH_MC_8(X, KERNEL)                                                             \
    X(KERNEL, 1) X(KERNEL, 2) X(KERNEL, 3) X(KERNEL, 4) X(KERNEL, 5) X(KERNEL, 6) X(KERNEL, 7) \
    X(KERNEL, 8)
#define NV_Q8_EACH_MC_32(X, KERNEL)                                                            \
    NV_Q8_EACH_MC_8(X, KERNEL)                                                                 \
    X(KERNEL, 9) X(KERNEL, 10) X(KERNEL, 11) X(KERNEL, 12) X(KERNEL, 13) X(KERNEL, 14)         \
    X(KERNEL, 15) X(KERNEL, 16) X(KERNEL, 17) X(KERNEL, 18) X(KERNEL, 19) X(KERNEL, 20)        \
    X(KERNEL, 21) X(KERNEL, 22) X(KERNEL, 23) X(KERNEL, 24) X(KERNEL, 25) X(KERNEL, 26)        \
    X(KERNEL, 27) X(KERNEL, 28) X(KERNEL, 29) X(KERNEL, 30) X(KERNEL, 31) X(KERNEL, 32)
#define NV_Q8_SPECIALISE(KERNEL, MC)                                                           \
    static __attribute__((noinline)) void KERNEL##_##MC(const nv_weight *w, int64_t t,         \
                                                        const nv_chunk *c) {                   \
        KERNEL(w, t, c, MC);                                                                   \
    }
#define NV_Q8_TABLE_ENTRY(KERNEL, MC) KERNEL##_##MC,
#define NV_Q8_KERNELS_BY_MC(KERNEL, N, MC_MAX)                                                 \
    _Static_assert((MC_MAX) <= (N) && (N) <= NV_Q8_MC_LIMIT, "a chunk size without a kernel"); \
    NV_Q8_EACH_MC_##N(NV_Q8_SPECIALISE, KERNEL)                                                \
    static const nv_q8_tile_fn KERNEL##_by_mc[N + 1] = {                                     \
        0, NV_Q8_EACH_MC_##N(NV_Q8_TABLE_ENTRY, KERNEL)};

/* Tiles [t0, t0 + nt) of chunk c, each by the kernel of the chunk's size in by_mc. */
NV_INLINE void nv_q8_tiles_by_mc(const nv_q8_tile_fn *by_mc, const nv_weight *w, int64_t t0,
                                 int64_t nt, const nv_chunk *c) {
    const nv_q8_tile_fn fn = by_mc[c->mc];
    for (int64_t t = t0; t < t0 + nt; t++) fn(w, t, c);
}

/* float16 bits -> float32, exactly (subnormals, infinities, NaN). */
NV_INLINE float nv_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
    union { uint32_t u; float f; } v;
    if (exp == 0x1Fu) {
        v.u = sign | 0x7F800000u | (mant << 13); /* inf, or NaN with its payload */
    } else if (exp != 0) {
        v.u = sign | ((exp + 112u) << 23) | (mant << 13); /* rebias 15 -> 127 */
    } else {
        v.f = (float)mant * 0x1p-24f; /* subnormal or zero: mant * 2^-24, exact */
        v.u |= sign;
    }
    return v.f;
}

/* The reference rule for one block of 32, in scalar float32 (every SIMD quantizer falls
 * back to it for the rare blocks whose 1 / d is not finite): writes the 32 codes and
 * returns d (float32), NaN for a block holding NaN or Inf (its codes 0).
 *   amax = max |x|; d = amax / 127; id = d == 0 ? 0 : 1 / d; code = roundf(x * id) clamped
 *   to [-127, 127], halfway away from zero. x * id is NaN only for x = 0 with id = inf
 *   (d float32-subnormal): numpy's cast of that NaN gives 0, and so does this. */
NV_INLINE float nv_q8_block_scalar(const float *x, int8_t *q) {
    float amax = 0.0f;
    int bad = 0;
    for (int i = 0; i < NV_Q8_BLOCK; i++) {
        const float a = fabsf(x[i]);
        if (!(a <= 3.40282346638528859812e+38f)) bad = 1; /* NaN or Inf */
        else if (a > amax) amax = a;
    }
    if (bad) {
        memset(q, 0, NV_Q8_BLOCK);
        return NAN;
    }
    const float d = amax / (float)NV_Q8_MAX;
    const float id = d == 0.0f ? 0.0f : 1.0f / d;
    for (int i = 0; i < NV_Q8_BLOCK; i++) {
        const float p = x[i] * id;
        float r = p != p ? 0.0f : roundf(p);
        if (r > (float)NV_Q8_MAX) r = (float)NV_Q8_MAX;
        if (r < -(float)NV_Q8_MAX) r = -(float)NV_Q8_MAX;
        q[i] = (int8_t)r;
    }
    return d;
}

/* float16 bits of the block's d (RNE; NaN for a non-finite block). */
NV_INLINE uint16_t nv_q8_d16(float d) { return d != d ? (uint16_t)NV_F16_NAN : nv_f32_to_f16(d); }

/* The doubled E2M1 table as integers (2 * value, in [-12, 12]), from the spec table the
 * library was initialised with; the dispatcher checks every entry is such an integer. */
NV_INLINE void nv_q8_wtable(int8_t t[16]) {
    for (int i = 0; i < 16; i++) t[i] = (int8_t)(2.0f * nv_e2m1_lut[i]);
}

/* The unsigned form u = 2 * e2m1 + 12 of the SIMD kernels. */
NV_INLINE void nv_q8_utable(uint8_t t[16]) {
    for (int i = 0; i < 16; i++) t[i] = (uint8_t)((int)(2.0f * nv_e2m1_lut[i]) + NV_Q8_OFFSET);
}

#endif /* NVFP4CPU_W4A8_H */
