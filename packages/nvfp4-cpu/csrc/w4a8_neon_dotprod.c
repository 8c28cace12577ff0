/* W4A8 on AArch64 with the dot-product extension (FEAT_DotProd, `asimddp`): compiled with
 * -march=armv8.2-a+dotprod (hatch_build.py) and called only where the dispatcher saw
 * HWCAP_ASIMDDP (w4a8_api.c); a NEON CPU without it runs the portable W4A8 kernels. See
 * w4a8.h for the arithmetic and the Q8 panel.
 *
 * EXACTNESS: BIT-IDENTICAL TO THE PORTABLE LEVEL (w4a8_portable.c)
 * ----------------------------------------------------------------
 * isum_j (the exact integer dot of a 16-element block) is summed in int32 by vdotq_laneq_s32
 * (s8 x s8: the signed doubled E2M1 value 2 * e2m1 in [-12, 12] times the activation code,
 * so the panel's corr words are not needed); the portable kernel sums the same integers in
 * float32, exactly (every partial sum is below 2^24). The float32 operations after it are the
 * portable kernel's, on the same operands, in the same order, one output row per lane:
 *   f = isum_{2b} * s_{2b} + isum_{2b+1} * s_{2b+1}   (two exact products, one rounding)
 *   acc += f * (d / 2)                                 (one rounding each)
 *   y = acc * global
 * No FMA: -ffp-contract=off (hatch_build.py's BASE_FLAGS) keeps vmulq_f32 and vaddq_f32
 * apart. The chunking of rows does not matter (each output row is its own sum). The tests
 * repeat every call of this level at the portable level and compare the bits
 * (tests/conftest.py).
 *
 * Decode (4 consecutive k of all 16 rows, element pairs p and p + 1 of a tile): two 16-byte
 * loads, a nibble split, four vqtbl1q_s8 lookups of the doubled table (k = 2p .. 2p + 3,
 * one row per byte), then zips of bytes (rows 0..7 | 8..15 as [k, k + 1] pairs) and of
 * 16-bit pairs: four vectors, one per quad of rows, whose 32-bit lanes hold one row's four
 * weights in k order, the operand vdotq_laneq_s32 multiplies with four activation codes.
 * E4M3 scales: the float16 trick of kernels_neon.c (byte << 7 is the float16 of
 * e4m3 * 2^-8, widened exactly), times 2^8 (exact): the value nv_e4m3_lut holds.
 *
 * Speed is not measured: no AArch64 hardware was available; the kernels are tested under
 * qemu-user (scripts/aarch64_emulated.sh).
 */
#include <arm_neon.h>
#include <string.h>

#include "w4a8.h"

#define NV_Q8_NEON_MC_MAX 8

/* Element pairs p, p + 1 of the 16 rows (code bytes at c and c + 16) -> w[rq], rq = 0..3:
 * rows 4rq .. 4rq + 3, each 32-bit lane one row's doubled weights of elements 2p .. 2p + 3. */
NV_INLINE void q8n_decode(const uint8_t *c, int8x16_t tab, int8x16_t w[4]) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    const uint8x16_t p0 = vld1q_u8(c), p1 = vld1q_u8(c + NV_TILE);
    const int8x16_t k0 = vqtbl1q_s8(tab, vandq_u8(p0, m4)); /* element 2p of rows 0..15 */
    const int8x16_t k1 = vqtbl1q_s8(tab, vshrq_n_u8(p0, 4)); /* 2p + 1 */
    const int8x16_t k2 = vqtbl1q_s8(tab, vandq_u8(p1, m4)); /* 2p + 2 */
    const int8x16_t k3 = vqtbl1q_s8(tab, vshrq_n_u8(p1, 4)); /* 2p + 3 */
    /* 16-bit lane r: [w(2p), w(2p + 1)] of row r (lo: rows 0..7, hi: rows 8..15) */
    const int16x8_t a_lo = vreinterpretq_s16_s8(vzip1q_s8(k0, k1));
    const int16x8_t a_hi = vreinterpretq_s16_s8(vzip2q_s8(k0, k1));
    const int16x8_t b_lo = vreinterpretq_s16_s8(vzip1q_s8(k2, k3)); /* [w(2p + 2), w(2p + 3)] */
    const int16x8_t b_hi = vreinterpretq_s16_s8(vzip2q_s8(k2, k3));
    w[0] = vreinterpretq_s8_s16(vzip1q_s16(a_lo, b_lo)); /* rows 0..3 */
    w[1] = vreinterpretq_s8_s16(vzip2q_s16(a_lo, b_lo)); /* rows 4..7 */
    w[2] = vreinterpretq_s8_s16(vzip1q_s16(a_hi, b_hi)); /* rows 8..11 */
    w[3] = vreinterpretq_s8_s16(vzip2q_s16(a_hi, b_hi)); /* rows 12..15 */
}

/* The 16 scale bytes of one block (rows 0..15) -> their exact E4M3 values, 4 vectors. */
NV_INLINE void q8n_scales(const uint8_t *p, float32x4_t s[4]) {
    const uint8x16_t b = vld1q_u8(p);
    const float16x8_t lo = vreinterpretq_f16_u16(vshll_n_u8(vget_low_u8(b), 7));
    const float16x8_t hi = vreinterpretq_f16_u16(vshll_high_n_u8(b, 7));
    s[0] = vmulq_n_f32(vcvt_f32_f16(vget_low_f16(lo)), NV_E4M3_F16_FACTOR);
    s[1] = vmulq_n_f32(vcvt_high_f32_f16(lo), NV_E4M3_F16_FACTOR);
    s[2] = vmulq_n_f32(vcvt_f32_f16(vget_low_f16(hi)), NV_E4M3_F16_FACTOR);
    s[3] = vmulq_n_f32(vcvt_high_f32_f16(hi), NV_E4M3_F16_FACTOR);
}

/* isum of one 16-element block for one row of x (its 16 codes xh) against the decoded block
 * w[q][rq] (q: elements 4q .. 4q + 3), times the block's scales: prod[rq] = isum * s[rq]
 * (exact). */
NV_INLINE void q8n_block(int8x16_t w[4][4], int8x16_t xh, const float32x4_t s[4],
                         float32x4_t prod[4]) {
#pragma GCC unroll 4
    for (int rq = 0; rq < 4; rq++) {
        int32x4_t i = vdupq_n_s32(0);
        i = vdotq_laneq_s32(i, w[0][rq], xh, 0);
        i = vdotq_laneq_s32(i, w[1][rq], xh, 1);
        i = vdotq_laneq_s32(i, w[2][rq], xh, 2);
        i = vdotq_laneq_s32(i, w[3][rq], xh, 3);
        prod[rq] = vmulq_f32(vcvtq_f32_s32(i), s[rq]);
    }
}

/* MC rows of x, one tile: per activation block b (weight blocks 2b and 2b + 1) each weight
 * block is decoded once for all MC rows; row m keeps isum_{2b} * s_{2b} (exact) until the
 * second block's product is added to it. */
NV_INLINE void q8n_kernel(const nv_weight *w, int64_t t, const nv_chunk *c, const int MC) {
    const int64_t k = w->k, nb = k / NV_Q8_BLOCK;
    const uint8_t *tc = w->codes + t * nv_tile_code_bytes(k);
    const uint8_t *ts = w->scales + t * nv_tile_scale_bytes(k);
    const int64_t rec = NV_Q8_REC(MC), n0 = t * NV_TILE;
    const int64_t left = nv_codes_left(w, t);
    int8_t wt[16];
    nv_q8_wtable(wt);
    const int8x16_t tab = vld1q_s8(wt);
    float32x4_t acc[NV_Q8_NEON_MC_MAX][4];
#pragma GCC unroll 8
    for (int m = 0; m < MC; m++)
        for (int rq = 0; rq < 4; rq++) acc[m][rq] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = nv_chunk_q8(c) + b * rec;
        const int8_t *xq = (const int8_t *)pb;           /* codes[MC][32] */
        const float *dh = (const float *)(pb + 32 * MC); /* d / 2 [MC] */
        nv_prefetch_codes(tc, b * (NV_Q8_BLOCK / 2) * NV_TILE, (NV_Q8_BLOCK / 2) * NV_TILE, left);
        float32x4_t first[NV_Q8_NEON_MC_MAX][4]; /* isum_{2b} * s_{2b} per row of x */
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) { /* weight block 2b + h: pairs 16b + 8h .. + 7 */
            int8x16_t wq[4][4];
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++)
                q8n_decode(tc + (b * (NV_Q8_BLOCK / 2) + 8 * h + 2 * q) * NV_TILE, tab, wq[q]);
            float32x4_t s[4];
            q8n_scales(ts + (2 * b + h) * NV_TILE, s);
#pragma GCC unroll 8
            for (int m = 0; m < MC; m++) {
                const int8x16_t xh = vld1q_s8(xq + m * NV_Q8_BLOCK + 16 * h);
                if (h == 0) {
                    q8n_block(wq, xh, s, first[m]);
                } else {
                    float32x4_t second[4];
                    q8n_block(wq, xh, s, second);
#pragma GCC unroll 4
                    for (int rq = 0; rq < 4; rq++) {
                        const float32x4_t f = vaddq_f32(first[m][rq], second[rq]);
                        acc[m][rq] = vaddq_f32(acc[m][rq], vmulq_n_f32(f, dh[m]));
                    }
                }
            }
        }
    }
    float32x4_t g[4];
    for (int rq = 0; rq < 4; rq++) g[rq] = vld1q_f32(w->rowg + n0 + 4 * rq);
    const int64_t live = (w->n - n0) < NV_TILE ? (w->n - n0) : NV_TILE;
#pragma GCC unroll 8
    for (int m = 0; m < MC; m++) {
        float y[NV_TILE];
        for (int rq = 0; rq < 4; rq++) vst1q_f32(y + 4 * rq, vmulq_f32(acc[m][rq], g[rq]));
        memcpy(c->out + c->out_rows[m] * c->ldo + n0, y, (size_t)live * sizeof(float));
    }
}

NV_Q8_KERNELS_BY_MC(q8n_kernel, 8, NV_Q8_NEON_MC_MAX)

static void q8n_qmm_tiles(const nv_weight *w, int64_t t0, int64_t nt, const nv_chunk *c) {
    nv_q8_tiles_by_mc(q8n_kernel_by_mc, w, t0, nt, c);
}

/* The activation quantizer is the portable level's (its scalar rule is the reference). */
static void q8n_quant_rows(const float *x, int64_t rows, int64_t k, int8_t *codes, uint16_t *d16) {
    nv_w4a8_portable.quant_rows(x, rows, k, codes, d16);
}

const nv_w4a8_kernels nv_w4a8_neon_dotprod = {
    {"neon_dotprod", NV_Q8_NEON_MC_MAX, q8n_qmm_tiles},
    q8n_quant_rows,
};
