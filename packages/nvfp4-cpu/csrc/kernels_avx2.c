/* The AVX2 level (AVX2 + FMA + F16C): compiled with -mavx2 -mfma -mf16c and called only after
 * the dispatcher has checked the CPU.
 *
 * A tile (16 rows) is two ymm halves: rows 0..7 from code bytes 0..7 of a pair, rows 8..15
 * from bytes 8..15.
 *
 * E2M1 decode: vpermps (_mm256_permutevar8x32_ps) has 8 entries, so it looks up the
 *   magnitude (code bits 2:0) and the sign (code bit 3) is xored in. The table is stored
 *   pre-xored with (i << 28): shifting the code left by 28 puts bits 2:0 on bits 30:28 (which
 *   cancel that pre-xor) and bit 3 on bit 31 (the sign), so lookup-xor-shift needs no mask:
 *   value bits = (lut[i] ^ (i << 28)) ^ (code << 28) = lut[i] ^ (sign << 31). It relies on
 *   E2M1 being sign-magnitude (code 8 + i = -value i), which the dispatcher checks.
 * E4M3 decode: the float16 trick of the AVX-512 level (see kernels_avx512.c) with F16C.
 */
#include <immintrin.h>

#include "kernels_generic.h"

#define NV_AVX2_MC_MAX 8

/* 8 scale bytes (rows 8h .. 8h+7 of a block) -> 8 exact float32 scales. */
NV_INLINE __m256 nv256_scales(const uint8_t *p) {
    const __m128i h = _mm_slli_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p)), 7);
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
}

/* The 8-entry magnitude table, pre-xored with (i << 28) (see above). */
NV_INLINE __m256 nv256_lut(void) {
    const __m256i pre = _mm256_setr_epi32(0 << 28, 1 << 28, 2 << 28, 3 << 28, 4 << 28, 5 << 28,
                                          6 << 28, 7 << 28);
    return _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(_mm256_loadu_ps(nv_e2m1_lut)), pre));
}

/* 8 code bytes at p (element pair j of 8 rows) -> element 2j (*lo) and 2j+1 (*hi). */
NV_INLINE void nv256_decode(const uint8_t *p, __m256 lutx, __m256 *lo, __m256 *hi) {
    const __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); /* byte per lane */
    const __m256i dh = _mm256_srli_epi32(d, 4);                                   /* high nibble */
    /* d << 28 keeps only the low nibble (bits 4..7 shift out of the 32-bit lane) */
    *lo = _mm256_castsi256_ps(_mm256_xor_si256(
        _mm256_castps_si256(_mm256_permutevar8x32_ps(lutx, d)), _mm256_slli_epi32(d, 28)));
    *hi = _mm256_castsi256_ps(_mm256_xor_si256(
        _mm256_castps_si256(_mm256_permutevar8x32_ps(lutx, dh)), _mm256_slli_epi32(dh, 28)));
}

/* Stores v (8 rows starting at n0 + 8h) into o, only the rows below n. */
NV_INLINE void nv256_store_rows(float *o, __m256 v, int64_t live) {
    if (live >= 8) {
        _mm256_storeu_ps(o, v);
    } else if (live > 0) {
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)live),
                                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_maskstore_ps(o, mask, v);
    }
}

/* One row of x (MC = 1): per block, even / odd partial sums of x * e2m1, then one multiply
 * by the block scale (as in the AVX-512 small kernel). */
static void k256_one(const nv_weight *w, int64_t t, const nv_chunk *c) {
    const int64_t k = w->k, nblocks = k / NV_BLOCK;
    const uint8_t *tc = w->codes + t * nv_tile_code_bytes(k);
    const uint8_t *ts = w->scales + t * nv_tile_scale_bytes(k);
    const __m256 lutx = nv256_lut();
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < nblocks; b++) {
        const float *xb = c->panel + b * NV_BLOCK;
        __m256 be[2], bo[2];
#pragma GCC unroll 8
        for (int j = 0; j < NV_BLOCK / 2; j++) {
            const __m256 xe = _mm256_set1_ps(xb[2 * j]), xo = _mm256_set1_ps(xb[2 * j + 1]);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256 wl, wh;
                nv256_decode(tc + (b * (NV_BLOCK / 2) + j) * NV_TILE + 8 * h, lutx, &wl, &wh);
                if (j == 0) {
                    be[h] = _mm256_mul_ps(wl, xe);
                    bo[h] = _mm256_mul_ps(wh, xo);
                } else {
                    be[h] = _mm256_fmadd_ps(wl, xe, be[h]);
                    bo[h] = _mm256_fmadd_ps(wh, xo, bo[h]);
                }
            }
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++)
            acc[h] = _mm256_fmadd_ps(_mm256_add_ps(be[h], bo[h]),
                                     nv256_scales(ts + b * NV_TILE + 8 * h), acc[h]);
    }
    const int64_t n0 = t * NV_TILE;
    float *o = c->out + c->out_rows[0] * c->ldo + n0;
    for (int h = 0; h < 2; h++)
        nv256_store_rows(o + 8 * h, _mm256_mul_ps(acc[h], _mm256_loadu_ps(w->rowg + n0 + 8 * h)),
                         w->n - n0 - 8 * h);
}

/* 2 <= MC <= 4 rows of x, both halves of the tile at once (2 * MC independent accumulator
 * chains hide the FMA latency): the decoded pair times its block scale (exact), then 4 * MC
 * FMAs with broadcast activations. */
NV_INLINE void k256_pair(const nv_weight *w, int64_t t, const nv_chunk *c, const int MC) {
    const int64_t k = w->k, nblocks = k / NV_BLOCK;
    const uint8_t *tc = w->codes + t * nv_tile_code_bytes(k);
    const uint8_t *ts = w->scales + t * nv_tile_scale_bytes(k);
    const __m256 lutx = nv256_lut();
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int m = 0; m < MC; m++) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nblocks; b++) {
        const float *xb = c->panel + b * NV_BLOCK * MC;
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256 s = nv256_scales(ts + b * NV_TILE + 8 * h);
#pragma GCC unroll 8
            for (int j = 0; j < NV_BLOCK / 2; j++) {
                __m256 wl, wh;
                nv256_decode(tc + (b * (NV_BLOCK / 2) + j) * NV_TILE + 8 * h, lutx, &wl, &wh);
                wl = _mm256_mul_ps(wl, s);
                wh = _mm256_mul_ps(wh, s);
                const float *x0 = xb + (2 * j) * MC, *x1 = x0 + MC;
#pragma GCC unroll 4
                for (int m = 0; m < MC; m++) {
                    acc[m][h] = _mm256_fmadd_ps(wl, _mm256_set1_ps(x0[m]), acc[m][h]);
                    acc[m][h] = _mm256_fmadd_ps(wh, _mm256_set1_ps(x1[m]), acc[m][h]);
                }
            }
        }
    }
    const int64_t n0 = t * NV_TILE;
#pragma GCC unroll 4
    for (int m = 0; m < MC; m++) {
        float *o = c->out + c->out_rows[m] * c->ldo + n0;
        for (int h = 0; h < 2; h++)
            nv256_store_rows(o + 8 * h, _mm256_mul_ps(acc[m][h], _mm256_loadu_ps(w->rowg + n0 + 8 * h)),
                             w->n - n0 - 8 * h);
    }
}

/* 5 <= MC <= 8 rows of x, one 8-row half of the tile at a time (so MC accumulators fit in
 * the 16 ymm registers): the decoded pair times its block scale (exact), then 2 * MC FMAs
 * with broadcast activations. */
NV_INLINE void k256_multi(const nv_weight *w, int64_t t, const nv_chunk *c, const int MC) {
    const int64_t k = w->k, nblocks = k / NV_BLOCK;
    const uint8_t *tc = w->codes + t * nv_tile_code_bytes(k);
    const uint8_t *ts = w->scales + t * nv_tile_scale_bytes(k);
    const __m256 lutx = nv256_lut();
    const int64_t n0 = t * NV_TILE;
    for (int h = 0; h < 2; h++) { /* rows n0 + 8h .. n0 + 8h + 7: code bytes 8h .. 8h + 7 */
        __m256 acc[NV_AVX2_MC_MAX];
#pragma GCC unroll 8
        for (int m = 0; m < MC; m++) acc[m] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nblocks; b++) {
            const float *xb = c->panel + b * NV_BLOCK * MC;
            const __m256 s = nv256_scales(ts + b * NV_TILE + 8 * h);
#pragma GCC unroll 8
            for (int j = 0; j < NV_BLOCK / 2; j++) {
                __m256 wl, wh;
                nv256_decode(tc + (b * (NV_BLOCK / 2) + j) * NV_TILE + 8 * h, lutx, &wl, &wh);
                wl = _mm256_mul_ps(wl, s);
                wh = _mm256_mul_ps(wh, s);
                const float *x0 = xb + (2 * j) * MC, *x1 = x0 + MC;
#pragma GCC unroll 8
                for (int m = 0; m < MC; m++) {
                    acc[m] = _mm256_fmadd_ps(wl, _mm256_set1_ps(x0[m]), acc[m]);
                    acc[m] = _mm256_fmadd_ps(wh, _mm256_set1_ps(x1[m]), acc[m]);
                }
            }
        }
        const __m256 g = _mm256_loadu_ps(w->rowg + n0 + 8 * h);
#pragma GCC unroll 8
        for (int m = 0; m < MC; m++)
            nv256_store_rows(c->out + c->out_rows[m] * c->ldo + n0 + 8 * h, _mm256_mul_ps(acc[m], g),
                             w->n - n0 - 8 * h);
    }
}

#define NV_PAIR(MC)                                                                           \
    static __attribute__((noinline)) void k256_pair_##MC(const nv_weight *w, int64_t t,        \
                                                         const nv_chunk *c) {                 \
        k256_pair(w, t, c, MC);                                                               \
    }
#define NV_MULTI(MC)                                                                          \
    static __attribute__((noinline)) void k256_multi_##MC(const nv_weight *w, int64_t t,       \
                                                          const nv_chunk *c) {                \
        k256_multi(w, t, c, MC);                                                              \
    }
NV_PAIR(2)
NV_PAIR(3)
NV_PAIR(4)
NV_MULTI(5)
NV_MULTI(6)
NV_MULTI(7)
NV_MULTI(8)

typedef void (*k256_fn)(const nv_weight *, int64_t, const nv_chunk *);
static const k256_fn k256_by_mc[NV_AVX2_MC_MAX + 1] = {
    0, k256_one, k256_pair_2, k256_pair_3, k256_pair_4, k256_multi_5, k256_multi_6, k256_multi_7, k256_multi_8,
};

static void k256_qmm_tiles(const nv_weight *w, int64_t t0, int64_t nt, const nv_chunk *c) {
    const k256_fn fn = k256_by_mc[c->mc];
    for (int64_t t = t0; t < t0 + nt; t++) fn(w, t, c);
}

const nv_isa_kernels nv_kernels_avx2 = {
    "avx2",
    NV_AVX2_MC_MAX,
    k256_qmm_tiles,
    generic_dequant_tiles, /* the plain-C decoder, vectorised by the compiler for AVX2 */
};
