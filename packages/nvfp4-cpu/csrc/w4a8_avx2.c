/* W4A8 AVX2 level (see w4a8.h for the arithmetic and the Q8 panel): compiled with
 * -mavx2 -mfma -mf16c and called only after the dispatcher has checked the CPU. Also the
 * W4A8 kernels of the avx512 level on a CPU without AVX512_VNNI.
 *
 * A tile (16 rows) is two ymm halves: rows 8hr .. 8hr+7 from code bytes 8hr .. 8hr+7 of a
 * pair. Each 32-bit lane holds one row's 4 consecutive weights as unsigned bytes
 * u = 2 * e2m1 + 12, decoded as in w4a8_avx512vnni.c (zero-extend, shift-or, nibble mask,
 * vpshufb). Without VNNI the int8 dot product is vpmaddubsw (u8 x s8 -> int16 pairs, at most
 * 2 * 24 * 127 = 6096, never saturating), four of them added in int16 (at most 24384 <
 * 32767: exact), then vpmaddwd with ones (int16 pairs -> int32): the exact dot of the
 * 16-element block, plus the panel's corr -> isum_j.
 */
#include <float.h>
#include <immintrin.h>

#include "w4a8.h"

#ifndef NV_Q8_256_MC_MAX
#define NV_Q8_256_MC_MAX 8
#endif
#define NV_Q8_256_MC_TABLE 8 /* kernels compiled: chunk sizes 1 .. 8 */

/* ------------------------------------------------------------------------ quantizer */

/* roundf of 8 finite floats of magnitude < 2^23 (see w4a8_avx512vnni.c). */
NV_INLINE __m256i q8_256_round(__m256 p) {
    __m256i r = _mm256_cvttps_epi32(p);
    const __m256 f = _mm256_sub_ps(p, _mm256_cvtepi32_ps(r)); /* exact: |f| < 1 */
    /* a true compare is all ones (-1): subtracting it adds 1 */
    r = _mm256_sub_epi32(r, _mm256_castps_si256(_mm256_cmp_ps(f, _mm256_set1_ps(0.5f), _CMP_GE_OQ)));
    r = _mm256_add_epi32(r, _mm256_castps_si256(_mm256_cmp_ps(f, _mm256_set1_ps(-0.5f), _CMP_LE_OQ)));
    r = _mm256_max_epi32(r, _mm256_set1_epi32(-NV_Q8_MAX));
    return _mm256_min_epi32(r, _mm256_set1_epi32(NV_Q8_MAX));
}

static void q8_256_quant_rows(const float *x, int64_t rows, int64_t k, int8_t *codes, uint16_t *d16) {
    const int64_t nb = k / NV_Q8_BLOCK;
    const __m256 fmax = _mm256_set1_ps(FLT_MAX);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            const int64_t off = r * k + b * NV_Q8_BLOCK; /* element (r, 32b) */
            __m256 v[4], mx = _mm256_setzero_ps();
            int fin = 1;
            for (int i = 0; i < 4; i++) {
                v[i] = _mm256_loadu_ps(x + off + 8 * i);
                const __m256 a = _mm256_and_ps(v[i], absmask);
                /* |x| <= FLT_MAX is false for NaN and Inf */
                fin &= _mm256_movemask_ps(_mm256_cmp_ps(a, fmax, _CMP_LE_OQ)) == 0xFF;
                mx = _mm256_max_ps(mx, a);
            }
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
            const float amax = _mm_cvtss_f32(m4);
            const float d = amax / (float)NV_Q8_MAX;
            const float id = d == 0.0f ? 0.0f : 1.0f / d;
            if (!fin || !(id <= FLT_MAX)) { /* NaN / Inf block, or 1 / d infinite */
                d16[r * nb + b] = nv_q8_d16(nv_q8_block_scalar(x + off, codes + off));
                continue;
            }
            d16[r * nb + b] = nv_f32_to_f16(d);
            const __m256 vid = _mm256_set1_ps(id);
            __m256i q[4];
            for (int i = 0; i < 4; i++) q[i] = q8_256_round(_mm256_mul_ps(v[i], vid));
            /* packs work per 128-bit lane: lane 0 gets elements 0-3 of each q[i], lane 1
             * elements 4-7; the dword permutation restores k order */
            const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256((__m256i *)(codes + off),
                                _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        }
}

/* ------------------------------------------------------------------------- matmul */

/* 8 scale bytes (rows 8hr .. 8hr+7 of a block) -> 8 exact float32 scales (the float16
 * trick of kernels_avx512.c). */
NV_INLINE __m256 q8_256_scales(const uint8_t *p) {
    const __m128i h = _mm_slli_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p)), 7);
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
}

/* Pairs j, j + 1 of 8 rows (8 code bytes at p, 8 at p + 16) -> u of elements 2j .. 2j+3. */
NV_INLINE __m256i q8_256_decode(const uint8_t *p, __m256i utab) {
    const __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + NV_TILE)));
    const __m256i c = _mm256_or_si256(a, _mm256_slli_epi32(b, 16)); /* bytes [A, 0, B, 0] */
    const __m256i n = _mm256_and_si256(_mm256_or_si256(c, _mm256_slli_epi32(c, 4)),
                                       _mm256_set1_epi32(0x0F0F0F0F)); /* [A&15, A>>4, B&15, B>>4] */
    return _mm256_shuffle_epi8(utab, n);
}

NV_INLINE __m256i q8_bcast32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof(v));
    return _mm256_set1_epi32(v);
}

/* Stores v (8 rows starting at n0 + 8hr) into o, only the rows below n. */
NV_INLINE void q8_256_store_rows(float *o, __m256 v, int64_t live) {
    if (live >= 8) {
        _mm256_storeu_ps(o, v);
    } else if (live > 0) {
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)live),
                                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_maskstore_ps(o, mask, v);
    }
}

/* The rows of x per pass that take both 8-row halves of a tile at once: up to 4 (2 * MC
 * accumulators, the 4 decoded vectors and the temporaries fit the 16 ymm registers), so
 * the tile's codes stream through once, prefetched (nvfp4cpu.h), with two independent
 * halves to overlap. Against one half per pass without prefetch, on a weight not in cache
 * (14336 x 8192), two threads, 2-vCPU Zen 4: 0.75x the time at MC = 1, 0.87x at 2, 0.84x at
 * 3, 0.88x at 4; LLC-resident (4096 x 4096): 0.90x at MC = 1, 1.01x at 4. Larger chunks
 * amortise the decode over their rows instead. */
#define NV_Q8_256_BOTH_HALVES_MC 4

/* MC rows of x, one tile: both 8-row halves hr = 0, 1 in one pass (MC <= 4) or one half
 * per pass (MC accumulators, the 4 decoded vectors of a 16-element block and the
 * temporaries: 8 rows spill a few values yet measured fastest, the decode amortised over
 * more rows). Per weight block j = 2b + h and half hr:
 *   i = madd16(sum_q maddubs(u[q], codes[m][16h + 4q .. +3]), 1) + corr[h][m]   (isum_j)
 *   acc[hr][m] += float(i) * (s_j * d[m][b] / 2)
 * (s_j * d / 2 is exact: 4 significant bits times 11), and the row globals multiply at the
 * end. Each output's sum runs over j in increasing order whichever the pass, so the two
 * schedules give the same bits. */
NV_INLINE void q8_256_kernel(const nv_weight *w, int64_t t, const nv_q8_chunk *c, const int MC) {
    const int64_t k = w->k, nb = k / NV_Q8_BLOCK;
    const uint8_t *tc = w->codes + t * nv_tile_code_bytes(k);
    const uint8_t *ts = w->scales + t * nv_tile_scale_bytes(k);
    const int64_t rec = NV_Q8_REC(MC), n0 = t * NV_TILE;
    const int64_t left = nv_codes_left(w, t);
    const int NH = MC <= NV_Q8_256_BOTH_HALVES_MC ? 2 : 1; /* halves per pass */
    uint8_t ut[16];
    nv_q8_utable(ut);
    const __m256i utab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)ut));
    const __m256i ones = _mm256_set1_epi16(1);
    for (int hr0 = 0; hr0 < 2; hr0 += NH) { /* this pass: rows n0 + 8hr0 .. n0 + 8(hr0 + NH) - 1 */
        __m256 acc[2][NV_Q8_256_MC_TABLE];  /* [half in this pass][row of x] */
#pragma GCC unroll 2
        for (int hh = 0; hh < NH; hh++)
#pragma GCC unroll 8
            for (int m = 0; m < MC; m++) acc[hh][m] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *pb = c->panel + b * rec;
            const int8_t *xq = (const int8_t *)pb;                 /* codes[MC][32] */
            const float *dh = (const float *)(pb + 32 * MC);       /* d / 2 [MC] */
            const int32_t *corr = (const int32_t *)(pb + 36 * MC); /* corr[2][MC] */
            /* the first pass streams the block's 256 code bytes (16 pairs of 16 rows) from
             * memory; a second one finds them in cache */
            if (hr0 == 0) nv_prefetch_codes(tc, b * (NV_Q8_BLOCK / 2) * NV_TILE, (NV_Q8_BLOCK / 2) * NV_TILE, left);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) { /* weight block j = 2b + h: pairs 16b + 8h .. +7 */
#pragma GCC unroll 2
                for (int hh = 0; hh < NH; hh++) {
                    const int hr = hr0 + hh; /* rows 8hr .. 8hr + 7: code bytes 8hr .. of a pair */
                    const uint8_t *cp = tc + (b * (NV_Q8_BLOCK / 2) + 8 * h) * NV_TILE + 8 * hr;
                    __m256i u[4];
#pragma GCC unroll 4
                    for (int q = 0; q < 4; q++) u[q] = q8_256_decode(cp + 2 * q * NV_TILE, utab);
                    const __m256 s = q8_256_scales(ts + (2 * b + h) * NV_TILE + 8 * hr);
#pragma GCC unroll 8
                    for (int m = 0; m < MC; m++) {
                        const int8_t *xm = xq + m * NV_Q8_BLOCK + 16 * h;
                        __m256i p = _mm256_maddubs_epi16(u[0], q8_bcast32(xm));
                        p = _mm256_add_epi16(p, _mm256_maddubs_epi16(u[1], q8_bcast32(xm + 4)));
                        p = _mm256_add_epi16(p, _mm256_maddubs_epi16(u[2], q8_bcast32(xm + 8)));
                        p = _mm256_add_epi16(p, _mm256_maddubs_epi16(u[3], q8_bcast32(xm + 12)));
                        const __m256i i = _mm256_add_epi32(_mm256_madd_epi16(p, ones),
                                                           _mm256_set1_epi32(corr[h * MC + m]));
                        acc[hh][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i),
                                                     _mm256_mul_ps(s, _mm256_set1_ps(dh[m])), acc[hh][m]);
                    }
                }
            }
        }
#pragma GCC unroll 2
        for (int hh = 0; hh < NH; hh++) {
            const int hr = hr0 + hh;
            const __m256 g = _mm256_loadu_ps(w->rowg + n0 + 8 * hr);
#pragma GCC unroll 8
            for (int m = 0; m < MC; m++)
                q8_256_store_rows(c->out + c->out_rows[m] * c->ldo + n0 + 8 * hr,
                                  _mm256_mul_ps(acc[hh][m], g), w->n - n0 - 8 * hr);
        }
    }
}

#define NV_Q8K(MC)                                                                             \
    static __attribute__((noinline)) void q8_256_##MC(const nv_weight *w, int64_t t,           \
                                                      const nv_q8_chunk *c) {                  \
        q8_256_kernel(w, t, c, MC);                                                            \
    }
NV_Q8K(1)
NV_Q8K(2)
NV_Q8K(3)
NV_Q8K(4)
NV_Q8K(5)
NV_Q8K(6)
NV_Q8K(7)
NV_Q8K(8)

typedef void (*q8_256_fn)(const nv_weight *, int64_t, const nv_q8_chunk *);
static const q8_256_fn q8_256_by_mc[NV_Q8_256_MC_TABLE + 1] = {
    0, q8_256_1, q8_256_2, q8_256_3, q8_256_4, q8_256_5, q8_256_6, q8_256_7, q8_256_8,
};

static void q8_256_qmm_tiles(const nv_weight *w, int64_t t0, int64_t nt, const nv_q8_chunk *c) {
    const q8_256_fn fn = q8_256_by_mc[c->mc];
    for (int64_t t = t0; t < t0 + nt; t++) fn(w, t, c);
}

const nv_w4a8_kernels nv_w4a8_avx2 = {
    "avx2",
    NV_Q8_256_MC_MAX,
    q8_256_quant_rows,
    q8_256_qmm_tiles,
};
