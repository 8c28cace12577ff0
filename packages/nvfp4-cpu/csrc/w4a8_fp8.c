/* nvfp4-cpu W4A8 FP8 activation encoder (spec 1.1, "W4A8", capability `w4a8_fp8`):
 * code = e4m3(x / input_scale), bit-identical to nvfp4.reference.quantize_activations_fp8.
 * Baseline flags (plain C); every step is one float32 operation in the reference's order:
 *   q = x / s                   (one division; may overflow to +-inf for a tiny s)
 *   mag = min(|q|, E4M3_MAX)    (saturating)
 *   r = e4m3 round-to-nearest-even of mag (subnormal step 2^-9: below 2^-10 -> 0)
 *   code = byte(r) | sign bit of q << 7
 * A NaN or Inf element gets the NaN byte (0x7F).
 *
 * The product (nvfp4cpu_qmm_fp8) takes the codes decoded exactly to float32 (E4M3 values are
 * float32 values) and accumulates in float32 in three levels, so the rounding error grows
 * with K / 256 rather than K (the spec's [w4a8_fp8] float32 bound is 1e-6):
 *   every product e4m3 * e2m1 * e4m3 is exact (at most 4 + 2 + 4 significant bits);
 *   p = the 16 products of one weight block, summed;
 *   a = the sum of p over 16 blocks (256 elements); y = the sum of a, times the row global,
 *   then (in Python) times input_scale. */
#include <math.h>
#include <string.h>

#include "nvfp4cpu.h"

#define NV_EINVAL (-1)

typedef struct {
    const float *x;
    float s;
    uint8_t *codes;
} nv_fp8_job;

static void nv_fp8_task(void *ctx, int64_t lo, int64_t hi) { /* elements [lo, hi) */
    const nv_fp8_job *j = (const nv_fp8_job *)ctx;
    for (int64_t i = lo; i < hi; i++) {
        const float v = j->x[i];
        if (!isfinite(v)) {
            j->codes[i] = nv_e4m3_nan;
            continue;
        }
        const float q = v / j->s;
        float mag = fabsf(q);
        if (mag > nv_e4m3_max) mag = nv_e4m3_max; /* also +inf */
        j->codes[i] = (uint8_t)(nv_e4m3_byte(nv_e4m3_round(mag)) | (signbit(q) ? 0x80u : 0u));
    }
}

/* x [count] float32 -> FP8 E4M3 codes [count] with the decode scale s (finite, > 0). */
NV_API int nvfp4cpu_quantize_fp8(int nth, const float *x, int64_t count, float s, uint8_t *codes) {
    if (!nv_is_initialised() || count < 0 || !(s > 0.0f) || !isfinite(s)) return NV_EINVAL;
    nv_fp8_job job = {x, s, codes};
    nv_parallel(nv_fp8_task, &job, count, nv_grain(16), nv_threads_for(nth, count, 16 * count));
    return 0;
}

/* ------------------------------------------------------------------- the product */

#define NV_FP8_MC 8       /* rows of x per pass over a tile */
#define NV_FP8_FOLD 16    /* blocks summed before they join the total */
#define NV_FP8_GROUP 4    /* tiles per work item */

typedef struct {
    const uint8_t *codes, *scales;
    const float *rowg;
    int64_t n, k, tiles;
    const float *x; /* [m][k], decoded activations */
    int64_t m;
    float *out;
} nv_fp8_mm_job;

static void nv_fp8_mm_task(void *ctx, int64_t lo, int64_t hi) { /* tile groups [lo, hi) */
    const nv_fp8_mm_job *j = (const nv_fp8_mm_job *)ctx;
    const int64_t k = j->k, nb = k / NV_BLOCK;
    const int64_t tcb = nv_tile_code_bytes(k), tsb = nv_tile_scale_bytes(k);
    for (int64_t t = lo * NV_FP8_GROUP; t < hi * NV_FP8_GROUP && t < j->tiles; t++) {
        const uint8_t *tc = j->codes + t * tcb;  /* tile t's codes [K/2][16] */
        const uint8_t *ts = j->scales + t * tsb; /* tile t's scales [K/16][16] */
        const int64_t n0 = t * NV_TILE;
        const int64_t live = (j->n - n0) < NV_TILE ? (j->n - n0) : NV_TILE;
        for (int64_t m0 = 0; m0 < j->m; m0 += NV_FP8_MC) {
            const int mc = (int)((j->m - m0) < NV_FP8_MC ? (j->m - m0) : NV_FP8_MC);
            float tot[NV_FP8_MC][NV_TILE], grp[NV_FP8_MC][NV_TILE];
            memset(tot, 0, sizeof(tot));
            memset(grp, 0, sizeof(grp));
            for (int64_t b = 0; b < nb; b++) {
                float wv[NV_BLOCK][NV_TILE]; /* block b decoded: e2m1 * e4m3, exact */
                for (int jj = 0; jj < NV_BLOCK / 2; jj++) {
                    const uint8_t *cp = tc + (b * (NV_BLOCK / 2) + jj) * NV_TILE;
                    for (int r = 0; r < NV_TILE; r++) {
                        const float s = nv_e4m3_lut[ts[b * NV_TILE + r]];
                        wv[2 * jj][r] = nv_e2m1_lut[cp[r] & 15u] * s;
                        wv[2 * jj + 1][r] = nv_e2m1_lut[cp[r] >> 4] * s;
                    }
                }
                for (int i = 0; i < mc; i++) {
                    const float *xr = j->x + (m0 + i) * k + b * NV_BLOCK; /* x[m0 + i][16b] */
                    float p[NV_TILE];
                    for (int r = 0; r < NV_TILE; r++) p[r] = wv[0][r] * xr[0];
                    for (int e = 1; e < NV_BLOCK; e++)
                        for (int r = 0; r < NV_TILE; r++) p[r] += wv[e][r] * xr[e];
                    for (int r = 0; r < NV_TILE; r++) grp[i][r] += p[r];
                }
                if ((b + 1) % NV_FP8_FOLD == 0 || b + 1 == nb) {
                    for (int i = 0; i < mc; i++)
                        for (int r = 0; r < NV_TILE; r++) {
                            tot[i][r] += grp[i][r];
                            grp[i][r] = 0.0f;
                        }
                }
            }
            for (int i = 0; i < mc; i++) { /* the global once per output, after accumulation */
                float *o = j->out + (m0 + i) * j->n + n0;
                for (int64_t r = 0; r < live; r++) o[r] = tot[i][r] * j->rowg[n0 + r];
            }
        }
    }
}

/* y [m][n] = (sum_k x[m][k] * e2m1 * e4m3) * rowg[n] for decoded FP8 activations x [m][k]
 * (float32) and one tiled weight (nvfp4cpu.h); input_scale is applied by the caller. */
NV_API int nvfp4cpu_qmm_fp8(int nth, const uint8_t *codes, const uint8_t *scales, const float *rowg,
                            int64_t n, int64_t k, const float *x, int64_t m, float *out) {
    if (!nv_is_initialised() || n < 1 || k < NV_BLOCK || k % NV_BLOCK || m < 0) return NV_EINVAL;
    nv_fp8_mm_job job = {codes, scales, rowg, n, k, nv_tiles(n), x, m, out};
    const int64_t groups = (job.tiles + NV_FP8_GROUP - 1) / NV_FP8_GROUP;
    nv_parallel(nv_fp8_mm_task, &job, groups, 1, nv_threads_for(nth, groups, m * n * k));
    return 0;
}
