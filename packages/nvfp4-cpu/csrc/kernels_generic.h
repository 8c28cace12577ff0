/* Plain-C kernels over the tiled layout (see nvfp4cpu.h). Included by kernels_portable.c,
 * and by the SIMD translation units for the kernels they do not specialise, so the compiler
 * vectorises the same source for each ISA's flags. Every loop over `r` runs over the 16
 * lanes (= rows) of a tile. */
#ifndef NVFP4CPU_KERNELS_GENERIC_H
#define NVFP4CPU_KERNELS_GENERIC_H

#include <string.h>

#include "nvfp4cpu.h"

#define NV_GENERIC_MC_MAX 8

/* Matmul for one chunk of at most NV_GENERIC_MC_MAX rows over tiles [t0, t0 + nt). */
__attribute__((unused)) static void generic_qmm_tiles(const nv_weight *w, int64_t t0, int64_t nt, const nv_chunk *c) {
    const int64_t k = w->k;
    const int64_t nblocks = k / NV_BLOCK;
    const int64_t tcb = nv_tile_code_bytes(k), tsb = nv_tile_scale_bytes(k);
    const int mc = c->mc;
    for (int64_t t = t0; t < t0 + nt; t++) {
        float acc[NV_GENERIC_MC_MAX][NV_TILE];
        memset(acc, 0, sizeof(acc));
        const uint8_t *tc = w->codes + t * tcb;  /* this tile's codes: [K/2][16] */
        const uint8_t *ts = w->scales + t * tsb; /* this tile's scales: [K/16][16] */
        for (int64_t b = 0; b < nblocks; b++) {
            float s[NV_TILE];
            for (int r = 0; r < NV_TILE; r++) s[r] = nv_e4m3_lut[ts[b * NV_TILE + r]];
            /* the 8 element pairs of block b: pair j holds elements k0 = 16b + 2j and k0+1 */
            for (int j = 0; j < NV_BLOCK / 2; j++) {
                const uint8_t *cp = tc + (b * (NV_BLOCK / 2) + j) * NV_TILE;
                const float *x0 = nv_chunk_f32(c) + (b * NV_BLOCK + 2 * j) * mc; /* panel[k0][.] */
                const float *x1 = x0 + mc;                                /* panel[k0+1][.] */
                float wl[NV_TILE], wh[NV_TILE];
                /* e2m1 * e4m3 is exact in float32 (at most 6 significant bits) */
                for (int r = 0; r < NV_TILE; r++) {
                    wl[r] = nv_e2m1_lut[cp[r] & 15u] * s[r];
                    wh[r] = nv_e2m1_lut[cp[r] >> 4] * s[r];
                }
                for (int i = 0; i < mc; i++) {
                    const float xe = x0[i], xo = x1[i];
                    for (int r = 0; r < NV_TILE; r++) acc[i][r] += wl[r] * xe + wh[r] * xo;
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

/* Exact decoding of tiles [t0, t0 + nt) into row-major out[n][k]:
 * value = (e2m1 * e4m3) * global, the first product exact, the second rounded once in
 * float32, then (for float16 / bfloat16) one round-to-nearest-even cast. */
__attribute__((unused)) static void generic_dequant_tiles(const nv_weight *w, int64_t t0, int64_t nt, void *out, int kind) {
    const int64_t k = w->k;
    const int64_t nblocks = k / NV_BLOCK;
    const int64_t tcb = nv_tile_code_bytes(k), tsb = nv_tile_scale_bytes(k);
    for (int64_t t = t0; t < t0 + nt; t++) {
        const uint8_t *tc = w->codes + t * tcb;
        const uint8_t *ts = w->scales + t * tsb;
        for (int r = 0; r < NV_TILE; r++) {
            const int64_t row = t * NV_TILE + r;
            if (row >= w->n) break;
            const float g = w->rowg[row];
            float buf[NV_BLOCK];
            for (int64_t b = 0; b < nblocks; b++) {
                const float s = nv_e4m3_lut[ts[b * NV_TILE + r]];
                for (int j = 0; j < NV_BLOCK / 2; j++) {
                    const uint8_t byte = tc[(b * (NV_BLOCK / 2) + j) * NV_TILE + r];
                    buf[2 * j] = (nv_e2m1_lut[byte & 15u] * s) * g;
                    buf[2 * j + 1] = (nv_e2m1_lut[byte >> 4] * s) * g;
                }
                const int64_t off = row * k + b * NV_BLOCK; /* element (row, 16b) of out */
                if (kind == NV_OUT_F32) {
                    memcpy((float *)out + off, buf, sizeof(buf));
                } else if (kind == NV_OUT_F16) {
                    uint16_t *o = (uint16_t *)out + off;
                    for (int e = 0; e < NV_BLOCK; e++) o[e] = nv_f32_to_f16(buf[e]);
                } else {
                    uint16_t *o = (uint16_t *)out + off;
                    for (int e = 0; e < NV_BLOCK; e++) o[e] = nv_f32_to_bf16(buf[e]);
                }
            }
        }
    }
}

#endif /* NVFP4CPU_KERNELS_GENERIC_H */
