/* W4A8 portable level: plain C11 (see w4a8.h for the arithmetic and the panel). Always built.
 * The dot products use the signed doubled E2M1 values directly, so the panel's corr words
 * are not needed here. They run in float32 on integer values: every product (at most
 * 12 * 127) and every partial sum of a 16-element block (at most 24384 < 2^24) is an
 * integer float32 represents exactly, so isum_j is exact, as in the SIMD int32 kernels,
 * and the loops vectorise on the baseline target (SSE2 has no 32-bit integer multiply). */
#include "w4a8.h"

#define NV_Q8_PORTABLE_MC_MAX 8

static void q8p_quant_rows(const float *x, int64_t rows, int64_t k, int8_t *codes, uint16_t *d16) {
    const int64_t nb = k / NV_Q8_BLOCK;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            const int64_t off = r * k + b * NV_Q8_BLOCK; /* element (r, 32b) */
            d16[r * nb + b] = nv_q8_d16(nv_q8_block_scalar(x + off, codes + off));
        }
}

/* One chunk of at most NV_Q8_PORTABLE_MC_MAX rows over tiles [t0, t0 + nt). */
static void q8p_qmm_tiles(const nv_weight *w, int64_t t0, int64_t nt, const nv_chunk *c) {
    const int64_t k = w->k, nb = k / NV_Q8_BLOCK;
    const int64_t tcb = nv_tile_code_bytes(k), tsb = nv_tile_scale_bytes(k);
    const int mc = c->mc;
    const int64_t rec = NV_Q8_REC(mc);
    int8_t wt8[16];
    float wt[16];
    nv_q8_wtable(wt8);
    for (int i = 0; i < 16; i++) wt[i] = (float)wt8[i];
    for (int64_t t = t0; t < t0 + nt; t++) {
        const uint8_t *tc = w->codes + t * tcb;  /* this tile's codes: [K/2][16] */
        const uint8_t *ts = w->scales + t * tsb; /* this tile's scales: [K/16][16] */
        float acc[NV_Q8_PORTABLE_MC_MAX][NV_TILE];
        memset(acc, 0, sizeof(acc));
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *pb = nv_chunk_q8(c) + b * rec;
            const int8_t *xq = (const int8_t *)pb;           /* codes[mc][32] */
            const float *dh = (const float *)(pb + 32 * mc); /* d / 2 [mc] */
            /* decoded weights of the 32 elements of block b, 16 rows: wv[e][r] */
            float wv[NV_Q8_BLOCK][NV_TILE];
            float s[2][NV_TILE];
            for (int h = 0; h < 2; h++)
                for (int r = 0; r < NV_TILE; r++) s[h][r] = nv_e4m3_lut[ts[(2 * b + h) * NV_TILE + r]];
            if (mc == 1) { /* one row: decode and multiply in one pass (nothing to reuse) */
                float is[2][NV_TILE] = {{0.0f}}; /* exact integers (see above) */
                for (int j = 0; j < NV_Q8_BLOCK / 2; j++) { /* pair 16b + j */
                    const uint8_t *cp = tc + (b * (NV_Q8_BLOCK / 2) + j) * NV_TILE;
                    const float x0 = (float)xq[2 * j], x1 = (float)xq[2 * j + 1];
                    float *ih = is[j / 8]; /* elements 2j, 2j+1 lie in 16-block 2b + j / 8 */
                    for (int r = 0; r < NV_TILE; r++)
                        ih[r] += wt[cp[r] & 15u] * x0 + wt[cp[r] >> 4] * x1;
                }
                for (int r = 0; r < NV_TILE; r++)
                    acc[0][r] += (is[0][r] * s[0][r] + is[1][r] * s[1][r]) * dh[0];
                continue;
            }
            for (int j = 0; j < NV_Q8_BLOCK / 2; j++) { /* pair 16b + j: elements 32b + 2j, +1 */
                const uint8_t *cp = tc + (b * (NV_Q8_BLOCK / 2) + j) * NV_TILE;
                for (int r = 0; r < NV_TILE; r++) {
                    wv[2 * j][r] = wt[cp[r] & 15u];
                    wv[2 * j + 1][r] = wt[cp[r] >> 4];
                }
            }
            for (int i = 0; i < mc; i++) {
                const int8_t *xr = xq + i * NV_Q8_BLOCK;
                float is[2][NV_TILE]; /* exact integers (see above) */
                for (int h = 0; h < 2; h++) {
                    for (int r = 0; r < NV_TILE; r++) is[h][r] = 0.0f;
                    for (int e = 0; e < NV_Q8_BLOCK / 2; e++) {
                        const float xv = (float)xr[16 * h + e];
                        for (int r = 0; r < NV_TILE; r++) is[h][r] += xv * wv[16 * h + e][r];
                    }
                }
                const float d = dh[i];
                for (int r = 0; r < NV_TILE; r++) {
                    const float f = is[0][r] * s[0][r] + is[1][r] * s[1][r];
                    acc[i][r] += f * d;
                }
            }
        }
        /* epilogue: the global once per output, after accumulation */
        const int64_t n0 = t * NV_TILE;
        const int64_t live = (w->n - n0) < NV_TILE ? (w->n - n0) : NV_TILE;
        for (int i = 0; i < mc; i++) {
            float *o = c->out + c->out_rows[i] * c->ldo + n0;
            for (int64_t r = 0; r < live; r++) o[r] = acc[i][r] * w->rowg[n0 + r];
        }
    }
}

const nv_w4a8_kernels nv_w4a8_portable = {
    {"portable", NV_Q8_PORTABLE_MC_MAX, q8p_qmm_tiles},
    q8p_quant_rows,
};
