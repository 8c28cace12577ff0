/* W4A8 AVX-512 VNNI level (see w4a8.h for the arithmetic and the Q8 panel): compiled with
 * -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx2 -mfma -mf16c and called only when the
 * CPU has AVX512_VNNI (the dispatcher in w4a8_api.c checks it).
 *
 * One zmm = one tile = 16 output rows; each 32-bit lane holds one row's 4 consecutive
 * weights of a 16-element block as unsigned bytes u = 2 * e2m1 + 12 (in [0, 24]), and
 * vpdpbusd adds u . x over the 4 bytes into an exact int32 (|sum| <= 16 * 24 * 127).
 *
 * Weight decode, 64 weights (16 rows x elements 2j .. 2j+3) from the 32 code bytes of pairs
 * j and j + 1 (tiled layout: 16 bytes per pair, byte r = row r, low nibble = element 2j):
 *   a = zero-extended byte A_r (pair j) per lane, b = byte B_r (pair j + 1)
 *   c = a | b << 16                       bytes [A, 0, B, 0]
 *   n = (c | c << 4) & 0x0F0F0F0F         bytes [A & 15, A >> 4, B & 15, B >> 4] (one vpternlogd)
 *   u = vpshufb(table, n)                 the 16-entry table of u in every 128-bit lane
 * so byte i of lane r is row r's element 2j + i: the activation operand is the row's 4 codes
 * 2j .. 2j+3 as one broadcast 32-bit word, in k order.
 * E4M3 scales: the float16 trick of kernels_avx512.c (a scale byte shifted left by 7 is the
 * float16 of the same exponent and mantissa bits; times 2^8 for the bias difference).
 */
#include <float.h>
#include <immintrin.h>

#include "w4a8.h"

/* ------------------------------------------------------------------------ quantizer */

/* roundf of 16 finite floats of magnitude < 2^23, as int32: truncate, then one step away
 * from zero where the (exact) remainder is at least 1/2. */
NV_INLINE __m512i q8_512_round(__m512 p) {
    __m512i r = _mm512_cvttps_epi32(p);
    const __m512 f = _mm512_sub_ps(p, _mm512_cvtepi32_ps(r)); /* exact: |f| < 1 */
    const __m512i one = _mm512_set1_epi32(1);
    r = _mm512_mask_add_epi32(r, _mm512_cmp_ps_mask(f, _mm512_set1_ps(0.5f), _CMP_GE_OQ), r, one);
    r = _mm512_mask_sub_epi32(r, _mm512_cmp_ps_mask(f, _mm512_set1_ps(-0.5f), _CMP_LE_OQ), r, one);
    r = _mm512_max_epi32(r, _mm512_set1_epi32(-NV_Q8_MAX));
    return _mm512_min_epi32(r, _mm512_set1_epi32(NV_Q8_MAX));
}

static void q8_512_quant_rows(const float *x, int64_t rows, int64_t k, int8_t *codes, uint16_t *d16) {
    const int64_t nb = k / NV_Q8_BLOCK;
    const __m512 fmax = _mm512_set1_ps(FLT_MAX);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            const int64_t off = r * k + b * NV_Q8_BLOCK; /* element (r, 32b) */
            const __m512 v0 = _mm512_loadu_ps(x + off), v1 = _mm512_loadu_ps(x + off + 16);
            const __m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1);
            /* |x| <= FLT_MAX is false for NaN and Inf */
            const __mmask16 fin = _mm512_cmp_ps_mask(a0, fmax, _CMP_LE_OQ) &
                                  _mm512_cmp_ps_mask(a1, fmax, _CMP_LE_OQ);
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
            const float d = amax / (float)NV_Q8_MAX;
            const float id = d == 0.0f ? 0.0f : 1.0f / d;
            if (fin != 0xFFFF || !(id <= FLT_MAX)) { /* NaN / Inf block, or 1 / d infinite */
                d16[r * nb + b] = nv_q8_d16(nv_q8_block_scalar(x + off, codes + off));
                continue;
            }
            d16[r * nb + b] = nv_f32_to_f16(d);
            const __m512 vid = _mm512_set1_ps(id);
            _mm_storeu_si128((__m128i *)(codes + off), _mm512_cvtsepi32_epi8(q8_512_round(_mm512_mul_ps(v0, vid))));
            _mm_storeu_si128((__m128i *)(codes + off + 16),
                             _mm512_cvtsepi32_epi8(q8_512_round(_mm512_mul_ps(v1, vid))));
        }
}

/* ------------------------------------------------------------------------- matmul */

/* Pairs j, j + 1 of 16 rows (32 code bytes at p) -> u of elements 2j .. 2j+3 (see above). */
NV_INLINE __m512i q8_512_decode(const uint8_t *p, __m512i utab) {
    const __m512i a = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + NV_TILE)));
    const __m512i c = _mm512_or_si512(a, _mm512_slli_epi32(b, 16));
    /* 0xA8: (c | c << 4) & mask */
    const __m512i n = _mm512_ternarylogic_epi32(c, _mm512_slli_epi32(c, 4), _mm512_set1_epi32(0x0F0F0F0F), 0xA8);
    return _mm512_shuffle_epi8(utab, n);
}

NV_INLINE __m512i q8_bcast32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof(v));
    return _mm512_set1_epi32(v);
}

/* MC rows of x times TN tiles from t0. Per activation block b (32 elements = weight blocks
 * 2b and 2b+1) the 8 * TN weight vectors are decoded once and feed every row m:
 *   i_h = corr[h][m] + sum_q vpdpbusd(u[h][q], codes[m][16h + 4q .. +3])   (exact isum)
 *   acc[m] += (float(i_0) * s_0 + float(i_1) * s_1) * (d[m][b] / 2)
 * and the row globals multiply once at the end. */
NV_INLINE void q8_512_kernel(const nv_weight *w, int64_t t0, const nv_chunk *c, const int MC,
                             const int TN) {
    const int64_t k = w->k, nb = k / NV_Q8_BLOCK;
    const int64_t tcb = nv_tile_code_bytes(k), tsb = nv_tile_scale_bytes(k);
    const int64_t rec = NV_Q8_REC(MC);
    uint8_t ut[16];
    nv_q8_utable(ut);
    const __m512i utab = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)ut));
    __m512 acc[NV_Q8_MC_LIMIT][2];
#pragma GCC unroll 32
    for (int m = 0; m < MC; m++)
#pragma GCC unroll 2
        for (int t = 0; t < TN; t++) acc[m][t] = _mm512_setzero_ps();
    /* The panel, code and scale pointers step once per block (not base + b * stride), so the
     * broadcast operands are addressed as base + displacement: Intel cores keep those
     * micro-fused (see k512_large in kernels_avx512.c: zig cc's build ran about 5% slower
     * than gcc's at M = 32 before). */
    const uint8_t *pb = nv_chunk_q8(c), *tc0 = w->codes + t0 * tcb, *ts0 = w->scales + t0 * tsb;
    for (int64_t b = 0; b < nb;
         b++, pb += rec, tc0 += (NV_Q8_BLOCK / 2) * NV_TILE, ts0 += 2 * NV_TILE) {
        const int8_t *xq = (const int8_t *)pb;                  /* codes[MC][32] */
        const float *dh = (const float *)(pb + 32 * MC);        /* d / 2 [MC] */
        const int32_t *corr = (const int32_t *)(pb + 36 * MC);  /* corr[2][MC] */
        __m512i u[2][2][4];
        __m512 s[2][2];
#pragma GCC unroll 2
        for (int t = 0; t < TN; t++) {
            const uint8_t *tc = tc0 + t * tcb, *ts = ts0 + t * tsb;
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                s[t][h] = nv512_scales(ts + h * NV_TILE); /* scales (t, 2b + h, rows) */
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) /* pairs 16b + 8h + 2q, +1 */
                    u[t][h][q] = q8_512_decode(tc + (8 * h + 2 * q) * NV_TILE, utab);
            }
        }
#pragma GCC unroll 32
        for (int m = 0; m < MC; m++) {
            const int8_t *xm = xq + m * NV_Q8_BLOCK;
            const __m512 dm = _mm512_set1_ps(dh[m]);
#pragma GCC unroll 2
            for (int t = 0; t < TN; t++) {
                __m512i i0 = _mm512_set1_epi32(corr[m]), i1 = _mm512_set1_epi32(corr[MC + m]);
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) {
                    i0 = _mm512_dpbusd_epi32(i0, u[t][0][q], q8_bcast32(xm + 4 * q));
                    i1 = _mm512_dpbusd_epi32(i1, u[t][1][q], q8_bcast32(xm + 16 + 4 * q));
                }
                const __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), s[t][1],
                                                 _mm512_mul_ps(_mm512_cvtepi32_ps(i0), s[t][0]));
                acc[m][t] = _mm512_fmadd_ps(f, dm, acc[m][t]);
            }
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < TN; t++) nv512_store_tile(w, c, t0 + t, &acc[0][t], 2, MC);
}

/* One tile: the kernel of every chunk size (NV_Q8_KERNELS_BY_MC, w4a8.h). */
#define q8_512_tile(w, t, c, MC) q8_512_kernel(w, t, c, MC, 1)

/* Rows of x per chunk, up to NV_Q8_MC_LIMIT: each block's weights are decoded once per chunk
 * (7 vector operations per 64 weights, against 13 per row and 512 weights for the dot
 * products and the scaling), so larger chunks spend less on the decode even where the
 * accumulators spill (more than 16 zmm of them). 32 rows against 16 (one thread, 2-vCPU
 * Emerald Rapids, 9 interleaved rounds): 0.89-0.91x the time at M = 32, 128 and 512,
 * 4096 x 4096, and at M = 128, 14336 x 8192; M = 20 (one chunk against two of 10) 0.89x. */
#ifndef NV_Q8_512_MC_MAX
#define NV_Q8_512_MC_MAX 32
#endif
/* Two tiles at once for chunks of 1 and 2 rows (specialised, non-inlined, as below). */
static __attribute__((noinline)) void q8_512_pair_1(const nv_weight *w, int64_t t, const nv_chunk *c) {
    q8_512_kernel(w, t, c, 1, 2);
}
static __attribute__((noinline)) void q8_512_pair_2(const nv_weight *w, int64_t t, const nv_chunk *c) {
    q8_512_kernel(w, t, c, 2, 2);
}

NV_Q8_KERNELS_BY_MC(q8_512_tile, 32, NV_Q8_512_MC_MAX)

static void q8_512_qmm_tiles(const nv_weight *w, int64_t t0, int64_t nt, const nv_chunk *c) {
    const int64_t end = t0 + nt;
    int64_t t = t0;
    if (c->mc == 1) for (; t + 2 <= end; t += 2) q8_512_pair_1(w, t, c);
    if (c->mc == 2) for (; t + 2 <= end; t += 2) q8_512_pair_2(w, t, c);
    for (; t < end; t++) q8_512_tile_by_mc[c->mc](w, t, c);
}

const nv_w4a8_kernels nv_w4a8_avx512vnni = {
    {"avx512vnni", NV_Q8_512_MC_MAX, q8_512_qmm_tiles},
    q8_512_quant_rows,
};
