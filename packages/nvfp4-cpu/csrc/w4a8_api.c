/* nvfp4-cpu W4A8 entry points (ctypes) and driver: the level's W4A8 kernels, Q8_0
 * quantization of the activations, the panels, and the parallel matmul over (chunk, tile
 * group) items. Compiled for the baseline target like api.c, whose thread pool it uses.
 *
 * Levels: the ISA numbers are api.c's (portable 0, avx2 1, avx512 2). The avx512 level runs
 * the AVX-512 VNNI kernels (vpdpbusd) when the CPU has AVX512_VNNI and else the AVX2 ones
 * (vpmaddubsw + vpmaddwd); nvfp4cpu_w4a8_kernel_name says which.
 */
#define _GNU_SOURCE
#include <stdlib.h>

#include "route.h"
#include "w4a8.h"


int nvfp4cpu_isa_supported(int isa);
unsigned nvfp4cpu_cpu_features(void);
unsigned nvfp4cpu_cpu_feature_bit(const char *name);

/* Every spec E2M1 value doubled is an integer in [-12, 12] (the integer kernels' table). */
static int nv_q8_table_ok(void) {
    for (int i = 0; i < 16; i++) {
        const float v = 2.0f * nv_e2m1_lut[i];
        if (!(v >= -12.0f && v <= 12.0f) || v != (float)(int)v) return 0;
    }
    return 1;
}

static const nv_w4a8_kernels *nv_w4a8_for(int isa) {
    if (!nv_is_initialised() || !nvfp4cpu_isa_supported(isa) || !nv_q8_table_ok()) return NULL;
    switch (isa) {
    case NV_ISA_AVX512:
#if defined(NVFP4CPU_HAVE_W4A8_AVX512VNNI)
        if (nvfp4cpu_cpu_features() & nvfp4cpu_cpu_feature_bit("avx512vnni")) return &nv_w4a8_avx512vnni;
#endif
#if defined(NVFP4CPU_HAVE_W4A8_AVX2)
        return &nv_w4a8_avx2; /* AVX-512 implies AVX2 + FMA + F16C (checked by the level) */
#else
        return &nv_w4a8_portable;
#endif
    case NV_ISA_AVX2:
#if defined(NVFP4CPU_HAVE_W4A8_AVX2)
        return &nv_w4a8_avx2;
#else
        return &nv_w4a8_portable;
#endif
    case NV_ISA_PORTABLE: return &nv_w4a8_portable;
    case NV_ISA_NEON:
#if defined(NVFP4CPU_HAVE_W4A8_NEON_DOTPROD)
        if (nvfp4cpu_cpu_features() & nvfp4cpu_cpu_feature_bit("asimddp")) return &nv_w4a8_neon_dotprod;
#endif
        /* without dotprod: the portable W4A8 kernels, which the compiler vectorises with
         * Advanced SIMD */
        return &nv_w4a8_portable;
    default: return NULL;
    }
}

/* The name of the W4A8 kernels a level runs here ("avx512vnni", "avx2", "portable"), or
 * NULL when the level cannot run. */
NV_API const char *nvfp4cpu_w4a8_kernel_name(int isa) {
    const nv_w4a8_kernels *k = nv_w4a8_for(isa);
    return k ? k->mm.name : NULL;
}

/* ------------------------------------------------------------------ quantize_q8 */

typedef struct {
    const nv_w4a8_kernels *kern;
    const float *x;
    int64_t k;
    int8_t *codes;
    uint16_t *d16;
} nv_q8q_job;

static void nv_q8q_task(void *ctx, int64_t lo, int64_t hi) { /* rows [lo, hi) */
    const nv_q8q_job *j = (const nv_q8q_job *)ctx;
    j->kern->quant_rows(j->x + lo * j->k, hi - lo, j->k, j->codes + lo * j->k,
                        j->d16 + lo * (j->k / NV_Q8_BLOCK));
}

/* x [m][k] float32 -> codes [m][k] int8, d16 [m][k/32] float16 bits (ggml Q8_0,
 * bit-identical to nvfp4.reference.quantize_activations_q8). */
NV_API int nvfp4cpu_quantize_q8(int isa, int nth, const float *x, int64_t m, int64_t k, int8_t *codes,
                                uint16_t *d16) {
    const nv_w4a8_kernels *kern = nv_w4a8_for(isa);
    if (!kern || m < 0 || k < NV_Q8_BLOCK || k % NV_Q8_BLOCK) return NV_EINVAL;
    nv_q8q_job job = {kern, x, k, codes, d16};
    nv_parallel(nv_q8q_task, &job, m, nv_grain(4 * k), nv_threads_for(nth, m, 4 * m * k));
    return 0;
}

/* --------------------------------------------------------------------- matmul */
/* The driver of route.h, as api.c's W4A16 matmul: rows grouped by expert, chunks of at most
 * mc_max rows, items (chunk, tile group). The panels are built first, in parallel over
 * chunks (each row quantized once, rows of out-of-range ids never read). */

/* K/32 records of 44 bytes per row (w4a8.h: a record of mc rows is 44 * mc bytes). */
static int64_t nv_q8_row_bytes(int64_t k) { return (k / NV_Q8_BLOCK) * NV_Q8_REC(1); }

/* Quantizes the rows of chunks [lo, hi) and writes their panels (layout in w4a8.h). */
static void nv_q8_fill(void *ctx, int64_t lo, int64_t hi) {
    const nv_matmul_job *j = (const nv_matmul_job *)ctx;
    /* the matmul kernel is the first member of the level's table */
    const nv_w4a8_kernels *kern = (const nv_w4a8_kernels *)(const void *)j->kern;
    const int64_t k = j->k, nb = k / NV_Q8_BLOCK;
    int8_t *codes = (int8_t *)malloc((size_t)k + (size_t)nb * sizeof(uint16_t));
    if (!codes) { /* cannot happen in practice (K bytes); make the rows NaN, not garbage */
        for (int64_t ci = lo; ci < hi; ci++) {
            const nv_route_chunk *cd = &j->route->chunks[ci];
            uint8_t *panel = nv_matmul_panel(j, cd);
            const int64_t rec = NV_Q8_REC(cd->mc);
            for (int64_t b = 0; b < nb; b++) {
                memset(panel + b * rec, 0, (size_t)rec);
                float *dh = (float *)(panel + b * rec + NV_Q8_BLOCK * cd->mc);
                for (int i = 0; i < cd->mc; i++) dh[i] = NAN;
            }
        }
        return;
    }
    uint16_t *d16 = (uint16_t *)(codes + k);
    for (int64_t ci = lo; ci < hi; ci++) {
        const nv_route_chunk *cd = &j->route->chunks[ci];
        const int mc = cd->mc;
        const int64_t rec = NV_Q8_REC(mc);
        uint8_t *panel = nv_matmul_panel(j, cd);
        for (int i = 0; i < mc; i++) {
            kern->quant_rows(j->x + cd->rows[i] * k, 1, k, codes, d16);
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *pb = panel + b * rec;
                const int8_t *src = codes + b * NV_Q8_BLOCK;
                memcpy(pb + i * NV_Q8_BLOCK, src, NV_Q8_BLOCK);
                float *dh = (float *)(pb + NV_Q8_BLOCK * mc);
                dh[i] = 0.5f * nv_f16_to_f32(d16[b]); /* d / 2: exact (a float16 value) */
                int32_t *corr = (int32_t *)(pb + (NV_Q8_BLOCK + 4) * mc);
                for (int h = 0; h < 2; h++) {
                    int32_t sum = 0;
                    for (int t = 0; t < NV_Q8_BLOCK / 2; t++) sum += src[16 * h + t];
                    corr[h * mc + i] = -NV_Q8_OFFSET * sum;
                }
            }
        }
    }
    free(codes);
}

static const nv_matmul_kernel *nv_w4a8_kernel(int isa) {
    const nv_w4a8_kernels *kern = nv_w4a8_for(isa);
    return kern ? &kern->mm : NULL;
}

/* W4A8: Q8 panels, about 8 operations per element to make; an int8 multiply-add costs about
 * half a float32 one. */
static const nv_matmul nv_w4a8 = {nv_w4a8_kernel, NV_Q8_BLOCK, nv_q8_row_bytes, nv_q8_fill, 8, 2};

/* W4A8 y = q8(x) @ w^T: codes/scales tiled (nvfp4cpu.h), rowg [tiles * 16], x [m][k]
 * float32 contiguous (k a multiple of 32), out [m][n] float32. */
NV_API int nvfp4cpu_qmm_w4a8(int isa, int nth, const uint8_t *codes, const uint8_t *scales,
                             const float *rowg, int64_t n, int64_t k, const float *x, int64_t m,
                             float *out) {
    return nv_matmul_run(&nv_w4a8, isa, nth, codes, scales, rowg, 1, n, k, x, m, NULL, out);
}

/* MoE W4A8: weights [e] tiled matrices, rowg [e][tiles * 16], ids [m] int64 (any values). */
NV_API int nvfp4cpu_gather_qmm_w4a8(int isa, int nth, const uint8_t *codes, const uint8_t *scales,
                                    const float *rowg, int64_t e, int64_t n, int64_t k,
                                    const float *x, int64_t m, const int64_t *ids, float *out) {
    if (!ids) return NV_EINVAL;
    return nv_matmul_run(&nv_w4a8, isa, nth, codes, scales, rowg, e, n, k, x, m, ids, out);
}
