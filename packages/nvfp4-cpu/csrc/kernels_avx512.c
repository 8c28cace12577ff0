/* The AVX-512 level (F/BW/VL; the F16C-style conversions are AVX512F): compiled with
 * -mavx512f -mavx512bw -mavx512vl -mfma -mf16c and called only after the dispatcher has
 * checked the CPU (CPUID and XCR0, api.c).
 *
 * One zmm register = one tile = 16 output rows (see the layout in nvfp4cpu.h).
 *
 * E2M1 decode: vpermps (_mm512_permutexvar_ps) with the 16 spec values in a register as
 *   the table and the nibbles as indices (vpermps reads only bits 3:0 of each index lane,
 *   so the low nibble needs no mask; the high nibble is the byte shifted right by 4).
 * E4M3 decode: a scale byte b (bit 7 clear) shifted left by 7 is the float16 with the same
 *   exponent and mantissa bits (E4M3's 4 exponent bits land in float16's 5-bit field and its
 *   3 mantissa bits on top of float16's 10); float16's bias is 15 against E4M3's 7, so
 *   value = float16(b << 7) * 2^8. vcvtph2ps converts float16 subnormals exactly, which covers
 *   E4M3's subnormals (m * 2^-9). The tests check every byte 0x00..0x7E against the table.
 */
#include <immintrin.h>

#include "kernels_generic.h"

#define NV_AVX512_MC_MAX 24 /* the largest row chunk (k512_large) */

/* Element pair j of 16 rows: the 16 code bytes at p -> decoded element 2j (*lo) and 2j+1
 * (*hi), unscaled E2M1 values, one row per lane. */
NV_INLINE void nv512_decode(const uint8_t *p, __m512 lut, __m512 *lo, __m512 *hi) {
    const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    *lo = _mm512_permutexvar_ps(d, lut);
    *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), lut);
}

/* Small chunks (MC <= 4 rows of x), TN tiles at once.
 *
 * Per block b, each (row m, tile t) sums x * e2m1 over the block's 16 elements in two
 * partial accumulators (even and odd elements: two independent FMA chains), then adds
 * (even + odd) * scale into its running sum: one scale multiply per block instead of one
 * per element. TN > 1 interleaves independent tiles so the FMA latency is hidden when
 * MC is 1 or 2. */
NV_INLINE void k512_small(const nv_weight *w, int64_t t0, const nv_chunk *c, const int MC,
                          const int TN) {
    const int64_t k = w->k, nblocks = k / NV_BLOCK;
    const int64_t tcb = nv_tile_code_bytes(k), tsb = nv_tile_scale_bytes(k);
    const __m512 lut = _mm512_loadu_ps(nv_e2m1_lut);
    const uint8_t *tc[4], *ts[4];
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int t = 0; t < TN; t++) {
        tc[t] = w->codes + (t0 + t) * tcb;
        ts[t] = w->scales + (t0 + t) * tsb;
#pragma GCC unroll 4
        for (int m = 0; m < MC; m++) acc[m][t] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nblocks; b++) {
        const float *xb = nv_chunk_f32(c) + b * NV_BLOCK * MC; /* panel[16b][0] */
        __m512 be[4][4], bo[4][4];
#pragma GCC unroll 8
        for (int j = 0; j < NV_BLOCK / 2; j++) {
#pragma GCC unroll 4
            for (int t = 0; t < TN; t++) {
                __m512 wl, wh;
                /* codes (t, pair 8b + j, rows 0..15) */
                nv512_decode(tc[t] + (b * (NV_BLOCK / 2) + j) * NV_TILE, lut, &wl, &wh);
#pragma GCC unroll 4
                for (int m = 0; m < MC; m++) {
                    const __m512 xe = _mm512_set1_ps(xb[(2 * j) * MC + m]);     /* x[m][16b+2j] */
                    const __m512 xo = _mm512_set1_ps(xb[(2 * j + 1) * MC + m]); /* x[m][16b+2j+1] */
                    if (j == 0) {
                        be[m][t] = _mm512_mul_ps(wl, xe);
                        bo[m][t] = _mm512_mul_ps(wh, xo);
                    } else {
                        be[m][t] = _mm512_fmadd_ps(wl, xe, be[m][t]);
                        bo[m][t] = _mm512_fmadd_ps(wh, xo, bo[m][t]);
                    }
                }
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < TN; t++) {
            const __m512 s = nv512_scales(ts[t] + b * NV_TILE); /* scales (t, b, rows 0..15) */
#pragma GCC unroll 4
            for (int m = 0; m < MC; m++)
                acc[m][t] = _mm512_fmadd_ps(_mm512_add_ps(be[m][t], bo[m][t]), s, acc[m][t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < TN; t++) nv512_store_tile(w, c, t0 + t, &acc[0][t], 4, MC);
}

/* Larger chunks (5 <= MC <= 24 rows of x), one tile: the decoded pair is multiplied by its
 * block scale once (exact: e2m1 * e4m3 fits float32) and then feeds 2 * MC FMAs with
 * broadcast activations. Up to 8 rows keep separate even / odd accumulators (enough
 * independent FMA chains); from 9 rows on there are enough rows. */
NV_INLINE void k512_large(const nv_weight *w, int64_t t, const nv_chunk *c, const int MC,
                          const int SPLIT) {
    const int64_t k = w->k, nblocks = k / NV_BLOCK;
    const uint8_t *tc = w->codes + t * nv_tile_code_bytes(k);
    const uint8_t *ts = w->scales + t * nv_tile_scale_bytes(k);
    const __m512 lut = _mm512_loadu_ps(nv_e2m1_lut);
    __m512 acc[NV_AVX512_MC_MAX], acc2[8];
#pragma GCC unroll 24
    for (int m = 0; m < MC; m++) acc[m] = _mm512_setzero_ps();
    if (SPLIT) {
#pragma GCC unroll 8
        for (int m = 0; m < MC; m++) acc2[m] = _mm512_setzero_ps();
    }
    /* The panel and code pointers step once per block (not base + b * stride): clang then
     * addresses the broadcast operands of the FMAs as base + displacement, which Intel cores
     * keep micro-fused, where an indexed address splits each FMA into two uops at rename
     * (the likely cause: zig cc's build ran 10% slower at M = 32 before, gcc's ran the same). */
    const float *xb = nv_chunk_f32(c);
    for (int64_t b = 0; b < nblocks; b++, xb += NV_BLOCK * MC, tc += NV_BLOCK / 2 * NV_TILE) {
        const __m512 s = nv512_scales(ts + b * NV_TILE);
#pragma GCC unroll 8
        for (int j = 0; j < NV_BLOCK / 2; j++) {
            __m512 wl, wh;
            nv512_decode(tc + j * NV_TILE, lut, &wl, &wh);
            wl = _mm512_mul_ps(wl, s);
            wh = _mm512_mul_ps(wh, s);
            const float *x0 = xb + (2 * j) * MC, *x1 = x0 + MC;
#pragma GCC unroll 24
            for (int m = 0; m < MC; m++) {
                acc[m] = _mm512_fmadd_ps(wl, _mm512_set1_ps(x0[m]), acc[m]);
                if (SPLIT)
                    acc2[m] = _mm512_fmadd_ps(wh, _mm512_set1_ps(x1[m]), acc2[m]);
                else
                    acc[m] = _mm512_fmadd_ps(wh, _mm512_set1_ps(x1[m]), acc[m]);
            }
        }
    }
    const int64_t n0 = t * NV_TILE;
    const __m512 g = _mm512_loadu_ps(w->rowg + n0);
    const __mmask16 live = nv512_live(w, t);
#pragma GCC unroll 24
    for (int m = 0; m < MC; m++) {
        __m512 v = SPLIT ? _mm512_add_ps(acc[m], acc2[m]) : acc[m];
        _mm512_mask_storeu_ps(c->out + c->out_rows[m] * c->ldo + n0, live, _mm512_mul_ps(v, g));
    }
}

/* One specialised (non-inlined) function per chunk size, so every loop above unrolls and
 * every accumulator lives in a register. */
#define NV_SMALL(MC, TN)                                                                    \
    static __attribute__((noinline)) void k512_small_##MC##_##TN(const nv_weight *w,        \
                                                                 int64_t t, const nv_chunk *c) { \
        k512_small(w, t, c, MC, TN);                                                        \
    }
#define NV_LARGE(MC, SPLIT)                                                                 \
    static __attribute__((noinline)) void k512_large_##MC(const nv_weight *w, int64_t t,   \
                                                          const nv_chunk *c) {              \
        k512_large(w, t, c, MC, SPLIT);                                                     \
    }
NV_SMALL(1, 4)
NV_SMALL(1, 1)
NV_SMALL(2, 2)
NV_SMALL(2, 1)
NV_SMALL(3, 1)
NV_SMALL(4, 1)
NV_LARGE(5, 1)
NV_LARGE(6, 1)
NV_LARGE(7, 1)
NV_LARGE(8, 1)
NV_LARGE(9, 0)
NV_LARGE(10, 0)
NV_LARGE(11, 0)
NV_LARGE(12, 0)
NV_LARGE(13, 0)
NV_LARGE(14, 0)
NV_LARGE(15, 0)
NV_LARGE(16, 0)
NV_LARGE(17, 0)
NV_LARGE(18, 0)
NV_LARGE(19, 0)
NV_LARGE(20, 0)
NV_LARGE(21, 0)
NV_LARGE(22, 0)
NV_LARGE(23, 0)
NV_LARGE(24, 0)

typedef void (*k512_fn)(const nv_weight *, int64_t, const nv_chunk *);

static const k512_fn k512_large_by_mc[NV_AVX512_MC_MAX + 1] = {
    0, 0, 0, 0, 0,
    k512_large_5, k512_large_6, k512_large_7, k512_large_8, k512_large_9, k512_large_10,
    k512_large_11, k512_large_12, k512_large_13, k512_large_14, k512_large_15, k512_large_16,
    k512_large_17, k512_large_18, k512_large_19, k512_large_20, k512_large_21, k512_large_22,
    k512_large_23, k512_large_24,
};

static void k512_qmm_tiles(const nv_weight *w, int64_t t0, int64_t nt, const nv_chunk *c) {
    const int64_t end = t0 + nt;
    int64_t t = t0;
    switch (c->mc) {
    case 1:
        for (; t + 4 <= end; t += 4) k512_small_1_4(w, t, c);
        for (; t < end; t++) k512_small_1_1(w, t, c);
        break;
    case 2:
        for (; t + 2 <= end; t += 2) k512_small_2_2(w, t, c);
        for (; t < end; t++) k512_small_2_1(w, t, c);
        break;
    case 3:
        for (; t < end; t++) k512_small_3_1(w, t, c);
        break;
    case 4:
        for (; t < end; t++) k512_small_4_1(w, t, c);
        break;
    default:
        for (; t < end; t++) k512_large_by_mc[c->mc](w, t, c);
        break;
    }
}

/* 16 x 16 float transpose: r[i] lane j <-> r[j] lane i (64 shuffles). */
NV_INLINE void nv512_transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) { /* interleave row pairs inside each 128-bit lane */
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int q = 0; q < 4; q++) { /* u[4q+p] lane L = rows 4q..4q+3 at column 4L+p */
        u[4 * q + 0] = _mm512_shuffle_ps(t[4 * q], t[4 * q + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * q + 1] = _mm512_shuffle_ps(t[4 * q], t[4 * q + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * q + 2] = _mm512_shuffle_ps(t[4 * q + 1], t[4 * q + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * q + 3] = _mm512_shuffle_ps(t[4 * q + 1], t[4 * q + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int p = 0; p < 4; p++) { /* gather lane L of u[p], u[4+p], u[8+p], u[12+p] */
        const __m512 va = _mm512_shuffle_f32x4(u[p], u[4 + p], 0x88);
        const __m512 vb = _mm512_shuffle_f32x4(u[p], u[4 + p], 0xDD);
        const __m512 wa = _mm512_shuffle_f32x4(u[8 + p], u[12 + p], 0x88);
        const __m512 wb = _mm512_shuffle_f32x4(u[8 + p], u[12 + p], 0xDD);
        r[p] = _mm512_shuffle_f32x4(va, wa, 0x88);      /* column p      (lane 0) */
        r[4 + p] = _mm512_shuffle_f32x4(vb, wb, 0x88);  /* column 4 + p  (lane 1) */
        r[8 + p] = _mm512_shuffle_f32x4(va, wa, 0xDD);  /* column 8 + p  (lane 2) */
        r[12 + p] = _mm512_shuffle_f32x4(vb, wb, 0xDD); /* column 12 + p (lane 3) */
    }
}

/* Exact dequantize: per block, decode the 16 elements of 16 rows (one vector per element,
 * lanes = rows), value = (e2m1 * scale) * global lane-wise, transpose so each vector is one
 * row's 16 elements, convert and store. */
static void k512_dequant_tiles(const nv_weight *w, int64_t t0, int64_t nt, void *out, int kind) {
    const int64_t k = w->k, nblocks = k / NV_BLOCK;
    const int64_t tcb = nv_tile_code_bytes(k), tsb = nv_tile_scale_bytes(k);
    const __m512 lut = _mm512_loadu_ps(nv_e2m1_lut);
    for (int64_t t = t0; t < t0 + nt; t++) {
        const uint8_t *tc = w->codes + t * tcb, *ts = w->scales + t * tsb;
        const __m512 g = _mm512_loadu_ps(w->rowg + t * NV_TILE);
        const int64_t live = (w->n - t * NV_TILE) < NV_TILE ? (w->n - t * NV_TILE) : NV_TILE;
        for (int64_t b = 0; b < nblocks; b++) {
            const __m512 s = nv512_scales(ts + b * NV_TILE);
            __m512 v[16];
            for (int j = 0; j < NV_BLOCK / 2; j++) {
                __m512 wl, wh;
                nv512_decode(tc + (b * (NV_BLOCK / 2) + j) * NV_TILE, lut, &wl, &wh);
                v[2 * j] = _mm512_mul_ps(_mm512_mul_ps(wl, s), g);
                v[2 * j + 1] = _mm512_mul_ps(_mm512_mul_ps(wh, s), g);
            }
            nv512_transpose16(v); /* v[r] = row 16t + r, elements 16b .. 16b + 15 */
            for (int64_t r = 0; r < live; r++) {
                const int64_t off = (t * NV_TILE + r) * k + b * NV_BLOCK;
                if (kind == NV_OUT_F32) {
                    _mm512_storeu_ps((float *)out + off, v[r]);
                } else if (kind == NV_OUT_F16) {
                    _mm256_storeu_si256((__m256i *)((uint16_t *)out + off),
                                        _mm512_cvtps_ph(v[r], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
                } else { /* bfloat16, round to nearest even on the bits (finite or inf) */
                    const __m512i u = _mm512_castps_si512(v[r]);
                    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
                    const __m512i rnd = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
                    _mm256_storeu_si256((__m256i *)((uint16_t *)out + off),
                                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(rnd, 16)));
                }
            }
        }
    }
}

const nv_isa_kernels nv_kernels_avx512 = {
    {"avx512", NV_AVX512_MC_MAX, k512_qmm_tiles},
    k512_dequant_tiles,
};
