/* W4A8 AVX2 level (see w4a8.h for the arithmetic and the Q8 panel): compiled with
 * -mavx2 -mfma -mf16c and called only after the dispatcher has checked the CPU. Also the
 * W4A8 kernels of the avx512 level on a CPU without AVX512_VNNI.
 *
 * A tile's 16 rows are two ymm vectors, rows (0..3 | 8..11) and rows (4..7 | 12..15) (the
 * order two in-lane unpacks leave them in; the epilogue puts them back), decoded once per
 * block for every row of x. Each 32-bit lane holds one row's 4 consecutive weights as
 * unsigned bytes u = 2 * e2m1 + 12: a 32-byte load gives two element pairs of all 16 rows,
 * vpermq puts rows 0..7 of both pairs in the low 128-bit lane, a nibble split and one
 * vpshufb table give the u bytes, and two levels of unpacks (bytes, then 16-bit words)
 * gather each row's 4 weights: 10 shuffle / shift / logic operations per 64 weights,
 * against 16 for the zero-extend, shift-or, nibble-mask and vpshufb decode of
 * w4a8_avx512vnni.c on 8-row halves. Without VNNI the int8 dot product is vpmaddubsw
 * (u8 x s8 -> int16 pairs, at most 2 * 24 * 127 = 6096, never saturating), four of them
 * added in int16 (at most 24384 < 32767: exact), then vpmaddwd with ones (int16 pairs ->
 * int32): the exact dot of the 16-element block, plus the panel's corr -> isum_j.
 */
#include <float.h>
#include <immintrin.h>

#include "w4a8.h"

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

/* Pairs p, p + 1 of the 16 rows (the 32 code bytes at p) -> u of elements 2p .. 2p + 3, one
 * row per 32-bit lane: rows (0..3 | 8..11) in *ua, rows (4..7 | 12..15) in *ub. */
NV_INLINE void q8_256_decode(const uint8_t *p, __m256i utab, __m256i *ua, __m256i *ub) {
    /* qwords (pair p rows 0..7, p rows 8..15, p+1 rows 0..7, p+1 rows 8..15) reordered to
     * (0, 2 | 1, 3): each 128-bit lane holds one row half of both pairs */
    const __m256i v = _mm256_permute4x64_epi64(_mm256_loadu_si256((const __m256i *)p), 0xD8);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    /* bytes 0..7 of a lane: element 2p (e) / 2p + 1 (o) of its 8 rows; 8..15: 2p + 2 / 2p + 3 */
    const __m256i e = _mm256_shuffle_epi8(utab, _mm256_and_si256(v, m4));
    const __m256i o = _mm256_shuffle_epi8(utab, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
    const __m256i lo = _mm256_unpacklo_epi8(e, o); /* word r of a lane: [u(2p), u(2p+1)] of row r */
    const __m256i hi = _mm256_unpackhi_epi8(e, o); /* [u(2p+2), u(2p+3)] */
    *ua = _mm256_unpacklo_epi16(lo, hi);           /* rows 0..3 of each lane's 8 */
    *ub = _mm256_unpackhi_epi16(lo, hi);           /* rows 4..7 */
}

/* The 16 scale bytes of a block -> exact float32 scales of rows (0..3 | 8..11) (*sa) and
 * (4..7 | 12..15) (*sb), q8_256_decode's order (the float16 trick of kernels_avx512.c). */
NV_INLINE void q8_256_scales(const uint8_t *p, __m256 *sa, __m256 *sb) {
    const __m128i order = _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15);
    const __m128i b = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)p), order);
    const __m256i h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 7); /* float16 patterns */
    const __m256 f256 = _mm256_set1_ps(NV_E4M3_F16_FACTOR);
    *sa = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), f256);
    *sb = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), f256);
}

NV_INLINE __m256i q8_bcast32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof(v));
    return _mm256_set1_epi32(v);
}

/* MC rows of x, one tile, in one pass over its codes (prefetched, nvfp4cpu.h). Per weight
 * block j = 2b + h the 8 vectors of u are decoded once and feed every row m; for each row
 * group g (rows (0..3 | 8..11), (4..7 | 12..15)):
 *   i = madd16(sum_q maddubs(u[g][q], codes[m][16h + 4q .. +3]), 1) + corr[h][m]   (isum_j)
 *   acc[g][m] += float(i) * (s_j * d[m][b] / 2)
 * (s_j * d / 2 is exact: 4 significant bits times 11), and the row globals multiply at the
 * end. 2 * MC accumulators: from MC = 5 on some spill (from 9 on most live in L1), yet one
 * decode for up to 16 rows measured faster than one per 8-row half or per 8-row chunk (16
 * rows against two chunks of 8 at M = 16, 32, 128: 0.90x, 0.85x, 0.91x the time; Zen 4),
 * and 32 rows faster again (see NV_Q8_256_MC_MAX). Against
 * the 8-row-half kernel without prefetch this replaced (two threads, 2-vCPU Zen 4, old
 * library against new in one process): on
 * 4096 x 4096 0.80x the time at M = 1, 0.83x at 4, 0.85x at 8; on 14336 x 8192 (not in
 * cache) 0.65x at M = 1, 0.80x at 4, 0.91x at 8. Each output sums its blocks in the same
 * order with the same operations as that kernel: the bits are unchanged. */
NV_INLINE void q8_256_kernel(const nv_weight *w, int64_t t, const nv_chunk *c, const int MC) {
    const int64_t k = w->k, nb = k / NV_Q8_BLOCK;
    const uint8_t *tc = w->codes + t * nv_tile_code_bytes(k);
    const uint8_t *ts = w->scales + t * nv_tile_scale_bytes(k);
    const int64_t rec = NV_Q8_REC(MC), n0 = t * NV_TILE;
    const int64_t left = nv_codes_left(w, t);
    uint8_t ut[16];
    nv_q8_utable(ut);
    const __m256i utab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)ut));
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[2][NV_Q8_MC_LIMIT]; /* [row group][row of x] */
#pragma GCC unroll 16
    for (int m = 0; m < MC; m++) acc[0][m] = acc[1][m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *pb = nv_chunk_q8(c) + b * rec;
        const int8_t *xq = (const int8_t *)pb;                 /* codes[MC][32] */
        const float *dh = (const float *)(pb + 32 * MC);       /* d / 2 [MC] */
        const int32_t *corr = (const int32_t *)(pb + 36 * MC); /* corr[2][MC] */
        /* the block's 256 code bytes: 16 pairs of 16 rows */
        nv_prefetch_codes(tc, b * (NV_Q8_BLOCK / 2) * NV_TILE, (NV_Q8_BLOCK / 2) * NV_TILE, left);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) { /* weight block j = 2b + h: pairs 16b + 8h .. +7 */
            __m256i u[2][4];          /* [row group][q]: elements 4q .. 4q + 3 of the block */
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++)
                q8_256_decode(tc + (b * (NV_Q8_BLOCK / 2) + 8 * h + 2 * q) * NV_TILE, utab, &u[0][q],
                              &u[1][q]);
            __m256 s[2];
            q8_256_scales(ts + (2 * b + h) * NV_TILE, &s[0], &s[1]);
#pragma GCC unroll 8
            for (int m = 0; m < MC; m++) {
                const int8_t *xm = xq + m * NV_Q8_BLOCK + 16 * h;
                const __m256 dm = _mm256_set1_ps(dh[m]);
                const __m256i cr = _mm256_set1_epi32(corr[h * MC + m]);
#pragma GCC unroll 2
                for (int g = 0; g < 2; g++) {
                    __m256i p = _mm256_maddubs_epi16(u[g][0], q8_bcast32(xm));
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(u[g][1], q8_bcast32(xm + 4)));
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(u[g][2], q8_bcast32(xm + 8)));
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(u[g][3], q8_bcast32(xm + 12)));
                    const __m256i i = _mm256_add_epi32(_mm256_madd_epi16(p, ones), cr);
                    acc[g][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(s[g], dm), acc[g][m]);
                }
            }
        }
    }
    const __m256 g0 = _mm256_loadu_ps(w->rowg + n0), g1 = _mm256_loadu_ps(w->rowg + n0 + 8);
#pragma GCC unroll 8
    for (int m = 0; m < MC; m++) {
        float *o = c->out + c->out_rows[m] * c->ldo + n0;
        const __m256 r0 = _mm256_permute2f128_ps(acc[0][m], acc[1][m], 0x20); /* rows 0..7 */
        const __m256 r1 = _mm256_permute2f128_ps(acc[0][m], acc[1][m], 0x31); /* rows 8..15 */
        nv256_store_rows(o, _mm256_mul_ps(r0, g0), w->n - n0);
        nv256_store_rows(o + 8, _mm256_mul_ps(r1, g1), w->n - n0 - 8);
    }
}

/* Rows of x per chunk: 32 against 16 (one decode of each block for twice the rows) ran
 * 0.91-0.93x the time at M = 20, 32, 128 and 0.93-0.96x at M = 512 (4096 x 4096) and
 * M = 128 (14336 x 8192); one thread, 2-vCPU Emerald Rapids, interleaved A/B runs. */
#ifndef NV_Q8_256_MC_MAX
#define NV_Q8_256_MC_MAX 32
#endif
NV_Q8_KERNELS_BY_MC(q8_256_kernel, 32, NV_Q8_256_MC_MAX)

static void q8_256_qmm_tiles(const nv_weight *w, int64_t t0, int64_t nt, const nv_chunk *c) {
    nv_q8_tiles_by_mc(q8_256_kernel_by_mc, w, t0, nt, c);
}

const nv_w4a8_kernels nv_w4a8_avx2 = {
    {"avx2", NV_Q8_256_MC_MAX, q8_256_qmm_tiles},
    q8_256_quant_rows,
};
