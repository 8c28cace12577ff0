/* The NEON level (AArch64 Advanced SIMD, "ASIMD"): built only for AArch64 targets, where
 * Advanced SIMD is part of the baseline (no -m flags needed), and called only after the
 * dispatcher has seen HWCAP_ASIMD (getauxval) and nv_neon_tables_ok().
 *
 * EXACTNESS: BIT-IDENTICAL TO THE PORTABLE LEVEL
 * ---------------------------------------------
 * Every float32 operation here is the portable kernel's (kernels_generic.h), on the same
 * operands, in the same order, one row per lane:
 *   qmm:      w = e2m1 * e4m3 (exact), acc += (w_even * x_even + w_odd * x_odd) per element
 *             pair, pairs in k order, then y = acc * global;
 *   dequant:  (e2m1 * e4m3) * global, then one round-to-nearest-even cast.
 * No FMA: with -ffp-contract=off (hatch_build.py's BASE_FLAGS) GCC and clang keep vmulq_f32
 * and vaddq_f32 apart, so each product and each sum is rounded once, as in the portable C.
 * The chunking of rows (mc_max) does not matter: each output row is its own sum. The tests
 * compare every call of this level with the portable level bit for bit (tests/conftest.py).
 *
 * E2M1 decode (vqtbl1q_u8): a table of 16 bytes, entry c = the high byte of the float16 of
 *   e2m1(c) * 2^8. Every E2M1 value (and -0) is a float16 whose low byte is zero (at most one
 *   mantissa bit), so "table byte << 8" (vshll_n_u8) is that float16 exactly, and fcvtl widens
 *   it to float32 exactly, the sign of -0 included. The table is built from the spec table
 *   nv_e2m1_lut at each call; nv_neon_tables_ok() checks that it fits.
 * E4M3 decode: the float16 trick of the AVX-512 level (kernels_avx512.c): a scale byte b (bit
 *   7 clear) shifted left by 7 is the float16 of e4m3(b) * 2^-8, fcvtl-widened exactly
 *   (subnormals included). The 2^-8 cancels the table's 2^8: e2m1' * s' = e2m1 * s exactly
 *   (both products have at most 6 significant bits and stay far inside float32's normal
 *   range), so the weight is the portable level's bit for bit. Like the x86 levels it reads
 *   only validated scale bytes (0x00..0x7E, what prepare admits); the tests check each one.
 *
 * qmm register blocking (32 q-registers): chunks of 1 or 2 rows of x take the whole tile
 * (4 float32x4 per row); chunks of 3 to 8 rows take one 8-row half of the tile at a time (2
 * vectors per row, up to 16 accumulators).
 * dequant: the 8 x 16 code bytes of one block of a tile are transposed to 16 rows x 8 bytes
 * with vqtbl4q_u8 / vqtbx4q_u8 (two rows per lookup), the nibbles zipped into element
 * order, decoded, scaled, and stored row-major.
 */
#include <arm_neon.h>
#include <string.h>

#include "nvfp4cpu.h"

#define NV_NEON_MC_MAX 8

/* 1 when every spec E2M1 value times 2^8 is a float16 whose low byte is zero (0, or a normal
 * float16 with at most two mantissa bits): the decoder's table then holds it exactly. */
int nv_neon_tables_ok(void) {
    for (int i = 0; i < 16; i++) {
        union { float f; uint32_t u; } v = {nv_e2m1_lut[i] * NV_E4M3_F16_FACTOR};
        const uint32_t a = v.u & 0x7FFFFFFFu;
        if (a == 0) continue;
        const int e = (int)(a >> 23) - 127;
        if (e < -14 || e > 15 || (a & 0x1FFFFFu)) return 0; /* float16 normal, mantissa bits 9:8 */
    }
    return 1;
}

/* The decode table: byte c = high byte of float16(e2m1(c) * 2^8). */
NV_INLINE uint8x16_t nvn_e2m1_table(void) {
    float16x8_t h[2];
    for (int i = 0; i < 2; i++) {
        const float32x4_t a = vmulq_n_f32(vld1q_f32(nv_e2m1_lut + 8 * i), NV_E4M3_F16_FACTOR);
        const float32x4_t b = vmulq_n_f32(vld1q_f32(nv_e2m1_lut + 8 * i + 4), NV_E4M3_F16_FACTOR);
        h[i] = vcvt_high_f16_f32(vcvt_f16_f32(a), b); /* exact: checked by nv_neon_tables_ok */
    }
    /* the odd bytes (little-endian high bytes) of the 16 float16 values, in order */
    return vuzp2q_u8(vreinterpretq_u8_f16(h[0]), vreinterpretq_u8_f16(h[1]));
}

/* 8 table bytes -> 8 float32 (two vectors): byte << 8 is the float16, widened exactly. */
NV_INLINE void nvn_widen8(uint8x8_t t, float32x4_t *v) {
    const float16x8_t h = vreinterpretq_f16_u16(vshll_n_u8(t, 8));
    v[0] = vcvt_f32_f16(vget_low_f16(h));
    v[1] = vcvt_high_f32_f16(h);
}

/* 16 codes (one per byte, 0..15) -> 16 float32 values e2m1 * 2^8 (four vectors, lane order). */
NV_INLINE void nvn_decode16(uint8x16_t tab, uint8x16_t codes, float32x4_t *v) {
    const uint8x16_t t = vqtbl1q_u8(tab, codes);
    nvn_widen8(vget_low_u8(t), v);
    nvn_widen8(vget_high_u8(t), v + 2);
}

/* 8 codes -> 8 float32 values e2m1 * 2^8 (two vectors). */
NV_INLINE void nvn_decode8(uint8x16_t tab, uint8x8_t codes, float32x4_t *v) {
    nvn_widen8(vqtbl1_u8(tab, codes), v);
}

/* 8 scale bytes -> 8 float32 values e4m3 * 2^-8 (two vectors, exact). */
NV_INLINE void nvn_scales8(uint8x8_t b, float32x4_t *s) {
    const float16x8_t h = vreinterpretq_f16_u16(vshll_n_u8(b, 7));
    s[0] = vcvt_f32_f16(vget_low_f16(h));
    s[1] = vcvt_high_f32_f16(h);
}

/* Stores the first `live` of the 4 * nvec floats of v at o (rows past N are not written). */
NV_INLINE void nvn_store_rows(float *o, const float32x4_t *v, const int nvec, int64_t live) {
    if (live >= 4 * nvec) {
        for (int q = 0; q < nvec; q++) vst1q_f32(o + 4 * q, v[q]);
    } else if (live > 0) {
        float tmp[NV_TILE];
        for (int q = 0; q < nvec; q++) vst1q_f32(tmp + 4 * q, v[q]);
        memcpy(o, tmp, (size_t)live * sizeof(float));
    }
}

/* 1 or 2 rows of x, the whole tile (16 rows of w = 4 vectors) at once. */
NV_INLINE void kn_full(const nv_weight *w, int64_t t, const nv_chunk *c, uint8x16_t tab,
                       const int MC) {
    const int64_t k = w->k, nblocks = k / NV_BLOCK;
    const uint8_t *tc = w->codes + t * nv_tile_code_bytes(k);
    const uint8_t *ts = w->scales + t * nv_tile_scale_bytes(k);
    const uint8x16_t low4 = vdupq_n_u8(0x0F);
    const int G = MC == 1 ? 2 : 1; /* element pairs per activation load: 2 * G * MC == 4 */
    float32x4_t acc[2][4];
#pragma GCC unroll 2
    for (int m = 0; m < MC; m++)
        for (int q = 0; q < 4; q++) acc[m][q] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nblocks; b++) {
        const float *xb = nv_chunk_f32(c) + b * NV_BLOCK * MC; /* panel[16b][0] */
        const uint8x16_t sb = vld1q_u8(ts + b * NV_TILE);
        float32x4_t s[4];
        nvn_scales8(vget_low_u8(sb), s);
        nvn_scales8(vget_high_u8(sb), s + 2);
        for (int j = 0; j < NV_BLOCK / 2; j += G) {
            /* the 2 * G * MC activations of pairs j .. j + G - 1: one vector */
            const float32x4_t xv = vld1q_f32(xb + 2 * j * MC);
#pragma GCC unroll 2
            for (int jj = 0; jj < G; jj++) {
                const uint8x16_t cb = vld1q_u8(tc + (b * (NV_BLOCK / 2) + j + jj) * NV_TILE);
                float32x4_t wl[4], wh[4];
                nvn_decode16(tab, vandq_u8(cb, low4), wl); /* element 16b + 2(j+jj) of 16 rows */
                nvn_decode16(tab, vshrq_n_u8(cb, 4), wh);  /* element 16b + 2(j+jj) + 1 */
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) {
                    wl[q] = vmulq_f32(wl[q], s[q]); /* = e2m1 * e4m3, exact */
                    wh[q] = vmulq_f32(wh[q], s[q]);
                }
#pragma GCC unroll 2
                for (int m = 0; m < MC; m++) {
                    const float xe = xv[2 * jj * MC + m], xo = xv[2 * jj * MC + MC + m];
#pragma GCC unroll 4
                    for (int q = 0; q < 4; q++)
                        acc[m][q] = vaddq_f32(acc[m][q], vaddq_f32(vmulq_n_f32(wl[q], xe),
                                                                   vmulq_n_f32(wh[q], xo)));
                }
            }
        }
    }
    const int64_t n0 = t * NV_TILE;
    float32x4_t g[4];
    for (int q = 0; q < 4; q++) g[q] = vld1q_f32(w->rowg + n0 + 4 * q);
#pragma GCC unroll 2
    for (int m = 0; m < MC; m++) {
        float32x4_t y[4];
        for (int q = 0; q < 4; q++) y[q] = vmulq_f32(acc[m][q], g[q]);
        nvn_store_rows(c->out + c->out_rows[m] * c->ldo + n0, y, 4, w->n - n0);
    }
}

/* 3 to 8 rows of x, one 8-row half of the tile (code bytes 8h .. 8h + 7) at a time. */
NV_INLINE void kn_half(const nv_weight *w, int64_t t, const nv_chunk *c, uint8x16_t tab,
                       const int MC) {
    const int64_t k = w->k, nblocks = k / NV_BLOCK;
    const uint8_t *tc = w->codes + t * nv_tile_code_bytes(k);
    const uint8_t *ts = w->scales + t * nv_tile_scale_bytes(k);
    const uint8x8_t low4 = vdup_n_u8(0x0F);
    const int64_t n0 = t * NV_TILE;
    const int G = MC % 2 ? 2 : 1; /* element pairs per activation load: 2 * G * MC % 4 == 0 */
    for (int h = 0; h < 2; h++) {
        if (w->n - n0 - 8 * h <= 0) break; /* the half is all padding: nothing to write */
        float32x4_t acc[NV_NEON_MC_MAX][2];
#pragma GCC unroll 8
        for (int m = 0; m < MC; m++) acc[m][0] = acc[m][1] = vdupq_n_f32(0.0f);
        for (int64_t b = 0; b < nblocks; b++) {
            const float *xb = nv_chunk_f32(c) + b * NV_BLOCK * MC;
            float32x4_t s[2];
            nvn_scales8(vld1_u8(ts + b * NV_TILE + 8 * h), s);
            for (int j = 0; j < NV_BLOCK / 2; j += G) {
                /* the 2 * G * MC activations of pairs j .. j + G - 1, a whole number of vectors
                 * (never read past the panel); lanes picked by constant subscripts */
                float32x4_t xv[NV_NEON_MC_MAX];
#pragma GCC unroll 8
                for (int v = 0; v < G * MC / 2; v++) xv[v] = vld1q_f32(xb + 2 * j * MC + 4 * v);
#pragma GCC unroll 2
                for (int jj = 0; jj < G; jj++) {
                    const uint8_t *cp = tc + (b * (NV_BLOCK / 2) + j + jj) * NV_TILE + 8 * h;
                    const uint8x8_t cb = vld1_u8(cp);
                    float32x4_t wl[2], wh[2];
                    nvn_decode8(tab, vand_u8(cb, low4), wl);
                    nvn_decode8(tab, vshr_n_u8(cb, 4), wh);
                    wl[0] = vmulq_f32(wl[0], s[0]); /* = e2m1 * e4m3, exact */
                    wl[1] = vmulq_f32(wl[1], s[1]);
                    wh[0] = vmulq_f32(wh[0], s[0]);
                    wh[1] = vmulq_f32(wh[1], s[1]);
#pragma GCC unroll 8
                    for (int m = 0; m < MC; m++) {
                        const int fe = 2 * jj * MC + m, fo = fe + MC; /* flat panel offsets */
                        const float xe = xv[fe / 4][fe % 4], xo = xv[fo / 4][fo % 4];
                        acc[m][0] = vaddq_f32(acc[m][0], vaddq_f32(vmulq_n_f32(wl[0], xe),
                                                                   vmulq_n_f32(wh[0], xo)));
                        acc[m][1] = vaddq_f32(acc[m][1], vaddq_f32(vmulq_n_f32(wl[1], xe),
                                                                   vmulq_n_f32(wh[1], xo)));
                    }
                }
            }
        }
        const float32x4_t g0 = vld1q_f32(w->rowg + n0 + 8 * h);
        const float32x4_t g1 = vld1q_f32(w->rowg + n0 + 8 * h + 4);
#pragma GCC unroll 8
        for (int m = 0; m < MC; m++) {
            const float32x4_t y[2] = {vmulq_f32(acc[m][0], g0), vmulq_f32(acc[m][1], g1)};
            nvn_store_rows(c->out + c->out_rows[m] * c->ldo + n0 + 8 * h, y, 2, w->n - n0 - 8 * h);
        }
    }
}

typedef void (*kn_fn)(const nv_weight *, int64_t, const nv_chunk *, uint8x16_t);

#define NV_FULL(MC)                                                                            \
    static __attribute__((noinline)) void kn_full_##MC(const nv_weight *w, int64_t t,          \
                                                       const nv_chunk *c, uint8x16_t tab) {    \
        kn_full(w, t, c, tab, MC);                                                             \
    }
#define NV_HALF(MC)                                                                            \
    static __attribute__((noinline)) void kn_half_##MC(const nv_weight *w, int64_t t,          \
                                                       const nv_chunk *c, uint8x16_t tab) {    \
        kn_half(w, t, c, tab, MC);                                                             \
    }
NV_FULL(1)
NV_FULL(2)
NV_HALF(3)
NV_HALF(4)
NV_HALF(5)
NV_HALF(6)
NV_HALF(7)
NV_HALF(8)

static const kn_fn kn_by_mc[NV_NEON_MC_MAX + 1] = {
    0, kn_full_1, kn_full_2, kn_half_3, kn_half_4, kn_half_5, kn_half_6, kn_half_7, kn_half_8,
};

static void kn_qmm_tiles(const nv_weight *w, int64_t t0, int64_t nt, const nv_chunk *c) {
    const kn_fn fn = kn_by_mc[c->mc];
    const uint8x16_t tab = nvn_e2m1_table();
    for (int64_t t = t0; t < t0 + nt; t++) fn(w, t, c, tab);
}

/* Round-to-nearest-even float32 -> bfloat16 of 8 finite or infinite values, as
 * nv_f32_to_bf16 (integer arithmetic: needs no BF16 extension). */
NV_INLINE uint16x8_t nvn_bf16(float32x4_t a, float32x4_t b) {
    const uint32x4_t ua = vreinterpretq_u32_f32(a), ub = vreinterpretq_u32_f32(b);
    const uint32x4_t one = vdupq_n_u32(1), bias = vdupq_n_u32(0x7FFFu);
    const uint32x4_t ra = vaddq_u32(vaddq_u32(ua, bias), vandq_u32(vshrq_n_u32(ua, 16), one));
    const uint32x4_t rb = vaddq_u32(vaddq_u32(ub, bias), vandq_u32(vshrq_n_u32(ub, 16), one));
    return vshrn_high_n_u32(vshrn_n_u32(ra, 16), rb, 16);
}

/* One row's 16 decoded, scaled values of one block -> out (element (row, 16b)) as `kind`.
 * float16: fcvtn rounds to nearest even (the FPCR default), overflow to inf and float16
 * subnormals included, as nv_f32_to_f16. */
NV_INLINE void nvn_store_block(void *out, int64_t off, const float32x4_t *v, int kind) {
    if (kind == NV_OUT_F32) {
        float *o = (float *)out + off;
        for (int q = 0; q < 4; q++) vst1q_f32(o + 4 * q, v[q]);
    } else if (kind == NV_OUT_F16) {
        uint16_t *o = (uint16_t *)out + off;
        vst1q_u16(o, vreinterpretq_u16_f16(vcvt_high_f16_f32(vcvt_f16_f32(v[0]), v[1])));
        vst1q_u16(o + 8, vreinterpretq_u16_f16(vcvt_high_f16_f32(vcvt_f16_f32(v[2]), v[3])));
    } else {
        uint16_t *o = (uint16_t *)out + off;
        vst1q_u16(o, nvn_bf16(v[0], v[1]));
        vst1q_u16(o + 8, nvn_bf16(v[2], v[3]));
    }
}

/* Exact decoding of tiles [t0, t0 + nt) into row-major out[n][k]. */
static void kn_dequant_tiles(const nv_weight *w, int64_t t0, int64_t nt, void *out, int kind) {
    const int64_t k = w->k, nblocks = k / NV_BLOCK;
    const int64_t tcb = nv_tile_code_bytes(k), tsb = nv_tile_scale_bytes(k);
    const uint8x16_t tab = nvn_e2m1_table();
    const uint8x16_t low4 = vdupq_n_u8(0x0F);
    /* Transpose indices for rows 2p and 2p + 1 (add 2p): output byte 8i + j is code byte
     * (pair j, row 2p + i); the block's pairs 0..3 are table A (byte 16j + r), pairs 4..7
     * table B. 0x80 + 2p is out of range (>= 64): vqtbl4q gives 0 there, vqtbx4q keeps. */
    static const uint8_t base_a[16] = {0,    16,   32,   48,   0x80, 0x80, 0x80, 0x80,
                                       1,    17,   33,   49,   0x80, 0x80, 0x80, 0x80};
    static const uint8_t base_b[16] = {0x80, 0x80, 0x80, 0x80, 0,    16,   32,   48,
                                       0x80, 0x80, 0x80, 0x80, 1,    17,   33,   49};
    const uint8x16_t ia = vld1q_u8(base_a), ib = vld1q_u8(base_b);
    for (int64_t t = t0; t < t0 + nt; t++) {
        const uint8_t *tc = w->codes + t * tcb;
        const uint8_t *ts = w->scales + t * tsb;
        const int64_t n0 = t * NV_TILE;
        const int64_t live = (w->n - n0) < NV_TILE ? (w->n - n0) : NV_TILE;
        const float *g = w->rowg + n0;
        for (int64_t b = 0; b < nblocks; b++) {
            float s[NV_TILE]; /* e4m3 * 2^-8 of the 16 rows */
            {
                const uint8x16_t sb = vld1q_u8(ts + b * NV_TILE);
                float32x4_t sv[4];
                nvn_scales8(vget_low_u8(sb), sv);
                nvn_scales8(vget_high_u8(sb), sv + 2);
                for (int q = 0; q < 4; q++) vst1q_f32(s + 4 * q, sv[q]);
            }
            const uint8_t *cb = tc + b * (NV_BLOCK / 2) * NV_TILE;
            const uint8x16x4_t ta = {{vld1q_u8(cb), vld1q_u8(cb + 16), vld1q_u8(cb + 32),
                                      vld1q_u8(cb + 48)}}; /* pairs 0..3 */
            const uint8x16x4_t tb = {{vld1q_u8(cb + 64), vld1q_u8(cb + 80), vld1q_u8(cb + 96),
                                      vld1q_u8(cb + 112)}}; /* pairs 4..7 */
            for (int p = 0; 2 * p < live; p++) {
                const uint8x16_t add = vdupq_n_u8((uint8_t)(2 * p));
                const uint8x16_t rows =
                    vqtbx4q_u8(vqtbl4q_u8(ta, vaddq_u8(ia, add)), tb, vaddq_u8(ib, add));
                const uint8x16_t lo = vandq_u8(rows, low4), hi = vshrq_n_u8(rows, 4);
                const uint8x16_t el[2] = {vzip1q_u8(lo, hi), vzip2q_u8(lo, hi)};
                for (int i = 0; i < 2; i++) {
                    const int r = 2 * p + i;
                    if (r >= live) break;
                    float32x4_t v[4];
                    nvn_decode16(tab, el[i], v); /* elements 16b .. 16b + 15 of row r */
                    for (int q = 0; q < 4; q++)
                        v[q] = vmulq_n_f32(vmulq_n_f32(v[q], s[r]), g[r]); /* (e2m1*e4m3)*g */
                    nvn_store_block(out, (n0 + r) * k + b * NV_BLOCK, v, kind);
                }
            }
        }
    }
}

const nv_isa_kernels nv_kernels_neon = {
    {"neon", NV_NEON_MC_MAX, kn_qmm_tiles},
    kn_dequant_tiles,
};
