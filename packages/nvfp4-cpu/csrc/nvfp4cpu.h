/* nvfp4-cpu: internal declarations shared by the dispatcher (api.c) and the per-ISA kernel
 * translation units (kernels_portable.c, kernels_avx2.c, kernels_avx512.c, kernels_neon.c).
 *
 * THE PREPARED ("TILED") LAYOUT
 * -----------------------------
 * The canonical planes are row-major: codes[n][K/2] (two E2M1 codes per byte, element 2j in
 * the low nibble), scales[n][K/16] (one E4M3 byte per 16 elements). `prepare` rewrites them
 * once into tiles of TILE = 16 consecutive output rows, interleaved at byte granularity:
 *
 *   tile t covers rows 16t .. 16t+15 (rows past N are padding: code 0, scale byte 0 -> 0.0)
 *   codes : [tiles][K/2][16]   byte (t, j, r) = canonical codes[16t + r][j]
 *   scales: [tiles][K/16][16]  byte (t, b, r) = canonical scales[16t + r][b]
 *
 * so one 16-byte load of codes gives "element pair j of 16 rows": zero-extended to sixteen
 * 32-bit lanes, lane r holds row 16t+r's byte, whose low nibble is element 2j and whose high
 * nibble is element 2j+1. Each SIMD lane is one output row: a decoded vector is used with a
 * broadcast activation x[m][k] for every row m of x (decode once, FMA into M accumulators),
 * nothing is reduced horizontally, and the 16 scale bytes of a block load as one vector.
 *
 * Byte offsets (all int64):
 *   tile_code_bytes  = (K/2) * 16      codes of one tile
 *   tile_scale_bytes = (K/16) * 16     scales of one tile
 *   code  (t, j, r)  = t * tile_code_bytes  + j * 16 + r      (j = k / 2)
 *   scale (t, b, r)  = t * tile_scale_bytes + b * 16 + r      (b = k / 16)
 * An expert-stacked weight [E][N][K] repeats this per expert: expert e's tiles start at
 * e * tiles * tile_code_bytes (codes) and e * tiles * tile_scale_bytes (scales), and its
 * per-row globals at e * tiles * 16 in the row-global array (padding rows hold 0).
 *
 * THE ACTIVATION PANEL
 * --------------------
 * The matmul kernels read activations from a "panel": for a chunk of MC rows of x (MC <= the
 * ISA's mc_max), panel[k * MC + i] = x[row_i][k]. For a fixed k the MC values are adjacent,
 * so the kernels broadcast them with constant displacements from one base pointer.
 */
#ifndef NVFP4CPU_H
#define NVFP4CPU_H

#include <stddef.h>
#include <stdint.h>

#define NV_TILE 16  /* output rows per tile (one 512-bit vector of float32) */
#define NV_BLOCK 16 /* elements per E4M3 scale block, spec 1.0 */
#define NV_MC_LIMIT 32 /* the largest row chunk any ISA kernel takes */
/* The float16 trick for E4M3 scales: an E4M3 byte with its sign bit clear, shifted left by
 * 7, is the float16 of its value / 2^8 (the same exponent and mantissa bits; exponent bias
 * 15 against 7), subnormals included. The kernels convert that float16 (F16C, AVX-512,
 * NEON) and multiply by this factor, or move the factor into their E2M1 tables (AVX2, NEON
 * W4A16: 2^8 * e2m1 is still exact there). */
#define NV_E4M3_F16_FACTOR 256.0f

/* Error codes of the entry points (part of the ABI; every function returns 0 or one). */
#define NV_EINVAL (-1) /* bad argument (dimension, ISA level, not initialised) */
#define NV_ENOMEM (-2) /* scratch allocation failed */

#if defined(__GNUC__)
#define NV_API __attribute__((visibility("default")))
#define NV_INLINE static inline __attribute__((always_inline))
#else
#define NV_API
#define NV_INLINE static inline
#endif

/* ISA levels (the numbers are part of the ctypes ABI). */
enum { NV_ISA_PORTABLE = 0, NV_ISA_AVX2 = 1, NV_ISA_AVX512 = 2, NV_ISA_NEON = 3, NV_ISA_COUNT = 4 };

/* Output element kinds of dequantize (part of the ABI). */
enum { NV_OUT_F32 = 0, NV_OUT_F16 = 1, NV_OUT_BF16 = 2 };

/* One matrix (one expert) in the tiled layout. */
typedef struct {
    const uint8_t *codes;  /* this matrix's first tile */
    const uint8_t *scales; /* this matrix's first tile's scales */
    const float *rowg;     /* per-row global, tiles * 16 floats (padding rows 0) */
    int64_t n;             /* real rows */
    int64_t k;             /* contraction length, a multiple of 16 */
} nv_weight;

/* A chunk of activation rows, ready for a kernel (W4A16 or W4A8). */
typedef struct {
    const void *panel;       /* W4A16: float32 [K][mc], see above (nv_chunk_f32); W4A8: the
                                Q8 records of w4a8.h (nv_chunk_q8) */
    int mc;                  /* rows in the chunk, 1 .. mc_max */
    float *out;              /* output base: row r of the result is out + r * ldo */
    int64_t ldo;             /* output row stride in floats (= N) */
    const int64_t *out_rows; /* mc output row indices */
} nv_chunk;

/* The W4A16 kernels' view of a chunk's panel. */
NV_INLINE const float *nv_chunk_f32(const nv_chunk *c) { return (const float *)c->panel; }

/* The matmul kernel of one ISA level, W4A16 or W4A8: what the matmul driver (route.h) runs. */
typedef struct {
    const char *name;
    int mc_max; /* largest chunk it takes (<= NV_MC_LIMIT, W4A8 <= NV_Q8_MC_LIMIT) */
    /* y[out_rows[i]][16t + r] for the tiles t in [t0, t0 + nt); rows >= n are not written. */
    void (*qmm_tiles)(const nv_weight *w, int64_t t0, int64_t nt, const nv_chunk *c);
} nv_matmul_kernel;

/* The kernels of one ISA level. */
typedef struct {
    /* W4A16: y[out_rows[i]][16t + r] = rowg[16t + r] * sum_k panel[k][i] * w[16t + r][k] */
    nv_matmul_kernel mm;
    /* Decode tiles [t0, t0 + nt) of w into out ([n][k] of the given kind), exactly. */
    void (*dequant_tiles)(const nv_weight *w, int64_t t0, int64_t nt, void *out, int kind);
} nv_isa_kernels;

/* The spec tables, handed over by Python (nvfp4.spec) at load time: the single source of
 * truth for the values; the SIMD decoders are checked against them by the tests. */
extern float nv_e2m1_lut[16];
extern float nv_e4m3_lut[256];

/* Per-ISA tables; each is defined only in a translation unit compiled for that ISA. */
extern const nv_isa_kernels nv_kernels_portable;
#if defined(NVFP4CPU_HAVE_AVX2)
extern const nv_isa_kernels nv_kernels_avx2;
/* The AVX2 level's one-row (M = 1) W4A16 decode (kernels_avx2.c): mode NV_AVX2_DECODE_F16 or
 * _BF16 sets it, _AUTO puts back the CPU's default, anything else asks; returns the one in
 * effect. Call only where the CPU runs AVX2 (the unit is compiled for it). */
int nv_avx2_m1_decode(int mode);
#endif
#if defined(__x86_64__) || defined(__i386__)
int nv_cpu_is_intel(void); /* CPUID vendor "GenuineIntel" (api.c) */
#endif
#define NV_AVX2_DECODE_AUTO 0
#define NV_AVX2_DECODE_F16 1  /* float16 patterns through vcvtph2ps (the default on Intel) */
#define NV_AVX2_DECODE_BF16 2 /* bfloat16 pairs split by shift and mask (elsewhere) */
#if defined(NVFP4CPU_HAVE_AVX512)
extern const nv_isa_kernels nv_kernels_avx512;
#endif
#if defined(NVFP4CPU_HAVE_NEON) /* AArch64 only (kernels_neon.c) */
extern const nv_isa_kernels nv_kernels_neon;
int nv_neon_tables_ok(void); /* the spec's E2M1 values fit the NEON decoder's table */
#endif

/* api.c's thread pool and helpers, shared with the W4A8 driver (w4a8_api.c); internal
 * (the library is built with -fvisibility=hidden). */
typedef void (*nv_task)(void *ctx, int64_t lo, int64_t hi); /* process items [lo, hi) */
void nv_parallel(nv_task fn, void *ctx, int64_t nitems, int64_t grain, int nth);
int nv_threads_for(int nth, int64_t items, int64_t work);
int64_t nv_grain(int64_t work_per_item);
void *nv_aligned_alloc(size_t bytes);
int nv_is_initialised(void);
/* api.c's E4M3 encoder pieces (spec constants from nvfp4cpu_init), shared with the FP8
 * activation encoder (w4a8_fp8.c): E4M3_MAX, the NaN byte, the round-to-nearest-even of a
 * value in [0, E4M3_MAX] and the byte of an exactly representable non-negative value. */
extern float nv_e4m3_max;
extern uint8_t nv_e4m3_nan;
float nv_e4m3_round(float s);
uint8_t nv_e4m3_byte(float r);

/* Byte sizes of one tile (see the layout above). */
NV_INLINE int64_t nv_tile_code_bytes(int64_t k) { return (k / 2) * NV_TILE; }
NV_INLINE int64_t nv_tile_scale_bytes(int64_t k) { return (k / NV_BLOCK) * NV_TILE; }
NV_INLINE int64_t nv_tiles(int64_t n) { return (n + NV_TILE - 1) / NV_TILE; }

/* SOFTWARE PREFETCH OF THE CODE STREAM
 * A kernel that streams a tile's codes once per pass (the AVX2 W4A16 and W4A8 kernels: the
 * weight streams faster than the hardware prefetcher ramps up at each new tile) asks, as it
 * starts the code bytes [off, off + bytes) of the tile at tc, for the lines NV_CODE_PREFETCH
 * bytes further on: 4 KiB (32 W4A16 blocks, a few hundred nanoseconds ahead); the stream runs
 * on into the next tile, whose codes follow. `left` = the bytes of this matrix's codes from tc
 * on: no prefetch leaves them. Measured on a weight that is not in cache: the AVX2 W4A16 kernel
 * 1.09x at MC = 1, 1.14x at MC = 2, 1.08x at MC = 4 (one thread); the AVX2 W4A8 kernel
 * 1.08-1.20x at MC = 1 and 4 (one and two threads, 2-vCPU Zen 4). The AVX-512 W4A16 and VNNI
 * W4A8 kernels measured no difference (within the run-to-run noise, about 4%) and do not ask.
 * Farther is not better: 8 and 16 KiB ahead ran 0.99x the time of 4 KiB (AVX2 W4A16,
 * 14336 x 8192, M = 1, two threads; median of 20 interleaved rounds' ratios, 2-vCPU Zen 4). */
#define NV_CODE_PREFETCH 4096

NV_INLINE void nv_prefetch_codes(const uint8_t *tc, int64_t off, int64_t bytes, int64_t left) {
    off += NV_CODE_PREFETCH;
    if (off + bytes > left) return;
#if defined(__GNUC__)
    for (int64_t l = 0; l < bytes; l += 64) __builtin_prefetch(tc + off + l, 0, 3); /* per line */
#endif
}

/* The bytes of w's codes from tile t's on (the `left` of nv_prefetch_codes). */
NV_INLINE int64_t nv_codes_left(const nv_weight *w, int64_t t) {
    return (nv_tiles(w->n) - t) * nv_tile_code_bytes(w->k);
}

/* Round-to-nearest-even float32 -> bfloat16 / float16 bits of a finite or infinite value
 * (the dequantizer never sees NaN: validated scale bytes and globals cannot produce it). */
NV_INLINE uint16_t nv_f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = {f};
    uint32_t lsb = (v.u >> 16) & 1u;
    return (uint16_t)((v.u + 0x7FFFu + lsb) >> 16);
}

NV_INLINE uint16_t nv_f32_to_f16(float f) {
    union { float f; uint32_t u; } v = {f};
    uint32_t sign = (v.u >> 16) & 0x8000u;
    uint32_t a = v.u & 0x7FFFFFFFu;
    if (a >= 0x7F800000u) /* inf (NaN never reaches here) */
        return (uint16_t)(sign | 0x7C00u | (a > 0x7F800000u ? 0x200u : 0u));
    if (a >= 0x477FF000u) /* >= 65520 = halfway above the largest half: rounds to inf */
        return (uint16_t)(sign | 0x7C00u);
    if (a >= 0x38800000u) { /* normal half range (>= 2^-14) */
        uint32_t mant = a & 0x7FFFFFu;
        uint32_t exp = (a >> 23) - 112u; /* rebias 127 -> 15 */
        uint32_t h = (exp << 10) | (mant >> 13);
        uint32_t rest = mant & 0x1FFFu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1u; /* may carry into exp */
        return (uint16_t)(sign | h);
    }
    if (a < 0x33000000u) /* < 2^-25: rounds to zero (2^-25 itself is a tie to even 0) */
        return (uint16_t)sign;
    { /* subnormal half: value = m * 2^-24, m = round(a / 2^-24) */
        uint32_t e = a >> 23;                       /* biased float exponent, 102..112 */
        uint32_t m = (a & 0x7FFFFFu) | 0x800000u;   /* 24-bit significand */
        uint32_t shift = 126u - e;                  /* a = m * 2^(e-150); /2^-24 -> >> (126-e) */
        uint32_t h = m >> shift;
        uint32_t rest = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rest > half || (rest == half && (h & 1u))) h += 1u;
        return (uint16_t)(sign | h);
    }
}

#if defined(__AVX2__)
#include <immintrin.h>
/* Shared by the AVX2 W4A16 and W4A8 kernels: stores v (8 output rows starting at n0 + 8h)
 * into o, only the `live` rows below n. */
NV_INLINE void nv256_store_rows(float *o, __m256 v, int64_t live) {
    if (live >= 8) {
        _mm256_storeu_ps(o, v);
    } else if (live > 0) {
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)live),
                                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_maskstore_ps(o, mask, v);
    }
}
#endif

#if defined(__AVX512F__)
#include <immintrin.h>
/* Shared by the AVX-512 W4A16 and the VNNI W4A8 kernels. The 16 scale bytes of one block of
 * one tile -> 16 float32 scales (exact: the float16 trick of NV_E4M3_F16_FACTOR). */
NV_INLINE __m512 nv512_scales(const uint8_t *p) {
    const __m256i h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)), 7);
    return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(NV_E4M3_F16_FACTOR));
}

/* Lanes of tile t that are real rows (the last tile of a ragged N is partly padding). */
NV_INLINE __mmask16 nv512_live(const nv_weight *w, int64_t t) {
    const int64_t live = w->n - t * NV_TILE;
    return live >= NV_TILE ? (__mmask16)0xFFFF : (__mmask16)((1u << live) - 1u);
}

/* The epilogue of tile t for the MC rows of chunk c: output row m, columns 16t .. 16t + 15,
 * gets acc[m * stride] (row m's 16 running sums) times the row globals, the lanes past N
 * left unwritten. `stride` steps over a kernel's other tiles: acc[m * stride] is its
 * acc[m][t] when called with &acc[0][t]. */
NV_INLINE void nv512_store_tile(const nv_weight *w, const nv_chunk *c, int64_t t,
                                const __m512 *acc, const int stride, const int MC) {
    const int64_t n0 = t * NV_TILE;
    const __m512 g = _mm512_loadu_ps(w->rowg + n0);
    const __mmask16 live = nv512_live(w, t);
#pragma GCC unroll 32
    for (int m = 0; m < MC; m++)
        _mm512_mask_storeu_ps(c->out + c->out_rows[m] * c->ldo + n0, live,
                              _mm512_mul_ps(acc[m * stride], g));
}
#endif

#endif /* NVFP4CPU_H */
