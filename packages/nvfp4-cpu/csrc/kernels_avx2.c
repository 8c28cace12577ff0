/* The AVX2 level (AVX2 + FMA + F16C): compiled with -mavx2 -mfma -mf16c and called only after
 * the dispatcher has checked the CPU.
 *
 * E2M1 decode, "bfloat16 pairs" (nv256_decode4): every E2M1 value is a bfloat16 (its
 *   float32 pattern has 16 low zero bits; the dispatcher checks it), so two 16-entry byte
 *   tables (the low and the high byte of that bfloat16, by code) looked up with vpshufb
 *   decode 32 codes per instruction. Interleaving the two bytes (vpunpck*bw) gives 32-bit
 *   lanes holding the bfloat16s of two adjacent rows, row 2i in the low half and row 2i+1 in
 *   the high half; then lane << 16 is row 2i's exact float32 and lane & 0xFFFF0000 row
 *   2i+1's: 14 shuffle-unit and 6 logic instructions per 64 weights (a vpermps lookup with
 *   the sign xored in took 24 and 8). The 16 rows of a tile thus come out as an "even"
 *   vector (rows 0,2,4,6 | 8,10,12,14) and an "odd" vector (rows 1,3,5,7 | 9,11,13,15);
 *   scales and accumulators use the same order, and the epilogue interleaves them back.
 * E2M1 decode, "float16" (k256_one_f16, one row of x on Intel CPUs): every E2M1 value times
 *   256 is a float16 with a zero low byte, so one vpshufb table of high bytes decodes 32
 *   codes, vpunpck*bw against zero makes the float16 patterns, and vcvtph2ps reads them back
 *   from an L1 buffer, 8 rows of one k at a time (see k256_one_f16).
 * E4M3 decode: the float16 trick of the AVX-512 level (see kernels_avx512.c) with F16C, which
 *   gives e4m3 / 256 exactly; the factor 256 rides in the E2M1 tables instead (every
 *   value 256 * e2m1 is a bfloat16 too), so no multiply per block restores it. Scaling by
 *   a power of two commutes with float32 rounding while nothing overflows or turns
 *   subnormal, so each block sum is 256 times the unscaled one bit for bit, and its product
 *   with e4m3 / 256 rounds the same real number: the same bits as applying e2m1 and e4m3
 *   at their own values (measured 2-3% faster at M = 1 and M = 8). The cost is headroom: a
 *   block sum overflows at a 256 times smaller |x| (about 1e34).
 *
 * Summation order (per output, fixed by the chunk size alone, so every thread count gives
 * the same bits): each block's 16 products x * e2m1 are summed in registers, in increasing k
 * (in two chains, even and odd k, at MC = 1 and in small row groups), and the block's sum
 * times its scale is added to the running sum; the row global multiplies at the end.
 */
#include <immintrin.h>
#include <stdatomic.h>

#include "kernels_generic.h"
#include "plan.h"

#define NV_AVX2_MC_MAX 32

/* ------------------------------------------------------------- bfloat16-pair decode */

/* The two vpshufb tables, in both 128-bit lanes: byte c of *lo / *hi is the low / high byte
 * of the bfloat16 of 256 times E2M1 code c (bits 23:16 / 31:24 of its float32 pattern; the
 * 256 undoes the scale decode's 1 / 256, see the top of this file). */
NV_INLINE void nv256_bf16_tables(__m256i *lo, __m256i *hi) {
    uint8_t l[16], h[16];
    for (int c = 0; c < 16; c++) {
        const float v = nv_e2m1_lut[c] * NV_E4M3_F16_FACTOR; /* exact: a power of two */
        uint32_t u;
        memcpy(&u, &v, sizeof(u));
        l[c] = (uint8_t)(u >> 16);
        h[c] = (uint8_t)(u >> 24);
    }
    *lo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)l));
    *hi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)h));
}

/* The 32 code bytes at p (element pairs j and j + 1 of the 16 rows: bytes 0..15 = pair j,
 * rows 0..15; bytes 16..31 = pair j + 1), loaded with its qwords (pair j rows 0..7, pair j
 * rows 8..15, pair j+1 rows 0..7, pair j+1 rows 8..15) reordered to (0, 2 | 1, 3): 128-bit
 * lane 0 holds rows 0..7 of both pairs, lane 1 rows 8..15, so that the in-lane unpacks of
 * nv256_lookup give rows 0..7 | 8..15 of one element. */
NV_INLINE __m256i nv256_codes(const uint8_t *p) {
    return _mm256_permute4x64_epi64(_mm256_loadu_si256((const __m256i *)p), 0xD8);
}

/* nv256_codes' bytes -> the codes of elements 2j, 2j+2 (*e, low nibbles) and 2j+1, 2j+3
 * (*o, high nibbles), one per byte. */
NV_INLINE void nv256_nibbles(__m256i v, __m256i *e, __m256i *o) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    *e = _mm256_and_si256(v, m4);
    *o = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
}

/* nv256_nibbles' codes -> w[q], q = 0..3, the bfloat16 pairs of element k = 2j + q of all
 * 16 rows: 32-bit lane i < 4 holds rows 2i (low half) and 2i + 1, lane 4 + i rows 8 + 2i
 * and 9 + 2i. */
NV_INLINE void nv256_lookup(__m256i e, __m256i o, __m256i tlo, __m256i thi, __m256i w[4]) {
    const __m256i el = _mm256_shuffle_epi8(tlo, e), eh = _mm256_shuffle_epi8(thi, e);
    const __m256i ol = _mm256_shuffle_epi8(tlo, o), oh = _mm256_shuffle_epi8(thi, o);
    w[0] = _mm256_unpacklo_epi8(el, eh); /* bytes 0..7 of each lane: pair j */
    w[1] = _mm256_unpacklo_epi8(ol, oh);
    w[2] = _mm256_unpackhi_epi8(el, eh); /* bytes 8..15 of each lane: pair j + 1 */
    w[3] = _mm256_unpackhi_epi8(ol, oh);
}

/* The 32 code bytes at p -> w[0..3] (nv256_lookup's order) in one go. */
NV_INLINE void nv256_decode4(const uint8_t *p, __m256i tlo, __m256i thi, __m256i w[4]) {
    __m256i e, o;
    nv256_nibbles(nv256_codes(p), &e, &o);
    nv256_lookup(e, o, tlo, thi, w);
}

/* Code bytes of a group: elements 4g .. 4g + 3 (two pairs) of a tile's 16 rows. */
#define NV256_GROUP_BYTES (2 * NV_TILE)

/* The same decode software-pipelined over the groups of a tile (group g: the code bytes at
 * tc + NV256_GROUP_BYTES * g): when group g is looked up, the nibbles of g + 1 are split and
 * the bytes of g + 2 and g + 3 loaded and reordered, so the long-latency front of the chain
 * (load, lane-crossing vpermq) runs three groups ahead and the core always has ready
 * shuffles beside the FMAs. A tile has at least 4 groups (k >= 16); the loads past its last
 * group re-read group g instead (in bounds, unused). */
typedef struct {
    __m256i e, o; /* group g + 1's nibbles */
    __m256i v1, v2; /* groups g + 2, g + 3: reordered bytes */
} nv256_pipe;

NV_INLINE void nv256_pipe_start(nv256_pipe *p, const uint8_t *tc) {
    nv256_nibbles(nv256_codes(tc), &p->e, &p->o);
    p->v1 = nv256_codes(tc + NV256_GROUP_BYTES);
    p->v2 = nv256_codes(tc + 2 * NV256_GROUP_BYTES);
}

/* Group g's w[0..3]; advances the pipe to g + 1. */
NV_INLINE void nv256_pipe_next(nv256_pipe *p, const uint8_t *tc, int64_t g, int64_t ngroups,
                               __m256i tlo, __m256i thi, __m256i w[4]) {
    const __m256i e = p->e, o = p->o;
    nv256_nibbles(p->v1, &p->e, &p->o);
    p->v1 = p->v2;
    p->v2 = nv256_codes(tc + (g + 3 < ngroups ? g + 3 : g) * NV256_GROUP_BYTES);
    nv256_lookup(e, o, tlo, thi, w);
}

/* The exact float32 weights (times 256) of the even rows (0,2,4,6 | 8,10,12,14) and of the
 * odd rows of a pair vector of nv256_decode4. */
NV_INLINE __m256 nv256_even(__m256i w) { return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)); }
NV_INLINE __m256 nv256_odd(__m256i w) {
    return _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xFFFF0000u)));
}

/* The 16 scale bytes of one block (rows 0..15) -> scales / 256 of the even rows (*se) and of
 * the odd rows (*so), in nv256_decode4's lane order (the tables hold 256 * e2m1). */
NV_INLINE void nv256_scales_eo(const uint8_t *p, __m256 *se, __m256 *so) {
    const __m128i even_odd = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m128i eo = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)p), even_odd);
    const __m256i h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(eo), 7); /* float16 patterns */
    *se = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *so = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

/* Even / odd-row vectors -> rows 0..7 (*r0) and 8..15 (*r1) in order. */
NV_INLINE void nv256_interleave(__m256 e, __m256 o, __m256 *r0, __m256 *r1) {
    const __m256 lo = _mm256_unpacklo_ps(e, o); /* rows 0,1,2,3 | 8,9,10,11 */
    const __m256 hi = _mm256_unpackhi_ps(e, o); /* rows 4,5,6,7 | 12,13,14,15 */
    *r0 = _mm256_permute2f128_ps(lo, hi, 0x20);
    *r1 = _mm256_permute2f128_ps(lo, hi, 0x31);
}

/* The code bytes of one block of tile tc (8 pairs of 16 rows: 2 lines), prefetched ahead
 * (nvfp4cpu.h) as the block starts. */
NV_INLINE void nv256_prefetch_block(const uint8_t *tc, int64_t b, int64_t left) {
    nv_prefetch_codes(tc, b * (NV_BLOCK / 2) * NV_TILE, (NV_BLOCK / 2) * NV_TILE, left);
}

/* One row of x (MC = 1), the memory-bound GEMV: the bfloat16-pair decode, per block
 * four partial sums (even / odd rows x even / odd k: independent FMA chains), then one
 * multiply-add by the block scale into the running sums.
 *
 * Cost (one thread, Zen 5 at about 4.45 GHz): about 10.4 cycles per 64 weights whether the
 * weight sits in L2, L3 or DRAM, so the decode, not memory, bounds it. Per 64 weights it
 * runs 1 vpermq, 4 vpshufb, 4 vpunpck, 5 shifts, 6 ands, 4 broadcasts and 8 FMAs: 20 of
 * those are shuffle / shift / logic operations competing for the vector ports the FMAs
 * also need. Measured and not kept: eight FMA chains instead of four (split by pair
 * parity: 1.05x slower, so the chains' latency is not the bound); two tiles at once (no
 * gain: GCC spills the partial sums); a float16 decode through vcvtph2ps (14 cycles).
 * Diagnostic builds that dropped the shifts, the FMAs or the decode one at a time did not
 * move it; dropping the lane-crossing vpermq did (0.9x the time), but that needs another
 * code order inside the tile layout, which every level and the packer share, or x arranged
 * per 128-bit half. Built on Zen 4 with x so arranged (a copy of 4 floats per k, two full
 * loads instead of four broadcasts per 64 weights) and each block's two halves added before
 * its scale (four lane permutes per block): 0.95-0.97x the time with the weight in L2,
 * 0.99-1.01x in L3 (4096 x 4096, interleaved A/B runs), so not kept.
 * Zen 4 (2-vCPU EPYC; cycles against an FMA loop of known cost, 10th percentile of 31
 * timings): 10.2-10.4 cycles per 64 weights with the weight in L1 or L2, 10.7-10.9 in L3.
 * The same instructions run in 6.5 cycles with their data dependencies removed and the
 * decode alone (no FMAs) in 6.9, so the bound is how the core schedules the decode's chain
 * of dependent shuffles, not the number of ports. Not faster: eight FMA chains in
 * hand-scheduled asm without spills (11.0 cycles, against 10.5 for this code in the same
 * runs), -mtune=haswell / skylake / znver3 (10.4-10.5), an int8 decode into vcvtdq2ps (it
 * shares the shift ports: 7.6-8.2 cycles for the bare instructions against 6.5).
 * Hence the decode is software-pipelined (nv256_pipe): the loads and vpermq three groups
 * ahead, the nibble split one ahead, so that ready shuffles sit beside each group's FMAs.
 * Interleaved A/B runs (one thread, Zen 4, quiet spells): 0.94-0.965x the time at
 * 1024 x 4096 and 4096 x 4096, fastest call 0.93-0.95x; in busy spells of the shared
 * machine the two are even. One group ahead for the loads only: 0.96-1.04x; the whole
 * decode one group ahead: 1.01-1.08x (the pipe then holds four more vectors). The same
 * pipe in the MC >= 2 decoding loop is no faster (1.00-1.10x at MC = 2..32: its FMAs
 * already give the core independent work), so that loop keeps nv256_decode4. With the pipe,
 * a diagnostic build without the vpermq (wrong results, same timing) is only 0.965-0.98x
 * the time, too little for a new code order in the tile layout that every level shares.
 * Emerald Rapids (Golden Cove cores, 2-vCPU VM, about 3.0 GHz): 10.9-11.0 cycles per 64
 * weights in L2 / L3, and it is port-bound there. A block (4 groups) compiles to about 122
 * vector ALU operations: per group 8 FMAs, 8 shift / and to split the bfloat16 pairs,
 * 4 vpshufb, 4 vpunpck, 3 for the nibbles and the vpermq; per block the scale decode and
 * 2 adds and 2 FMAs. Mixes of these run at 3 per cycle on this core (0.34-0.36 cycles per
 * operation in unrolled independent chains), so the floor is 10.2 cycles; llvm-mca
 * (-mcpu=sapphirerapids) predicts 11.0 for the compiled loop. Measured and not kept
 * (interleaved A/B, one thread, 4096 x 4096 and 1024 x 4096, medians of 41 rounds; a second
 * copy of the same library came out at 0.97-1.01x): the pipe's clamp hoisted out of all
 * but the last block (0.99-1.00x); the scale bytes moved by one vpshufb to the high byte
 * of each 16-bit lane (one vpmovzxbw fewer: 0.99x); the scales as float32 straight from
 * the byte (byte << 20 is e4m3 * 2^-120 exactly, times 2^112: the same bits), 6.6x slower
 * on a weight whose scale bytes are all subnormal (0x01-0x07), as a subnormal input to
 * vmulps takes a microcode assist on this core (the float16 route costs nothing extra);
 * the pipe two groups ahead (1.00x); without vpermq, x copied per 128-bit half and each
 * block's halves combined by a blend and a lane permute (1.01x: the same operation
 * count); work items of 1 or 2 tiles instead of 4 (1.00-1.03x, two threads); the code
 * prefetch 2, 8 or 16 KiB ahead (1.00-1.11x at 14336 x 8192, two threads). Without the
 * pipe the fastest call takes 1.04-1.05x as long. */
static void k256_one(const nv_weight *w, int64_t t, const nv_chunk *c) {
    const int64_t k = w->k, nblocks = k / NV_BLOCK;
    const uint8_t *tc = w->codes + t * nv_tile_code_bytes(k);
    const uint8_t *ts = w->scales + t * nv_tile_scale_bytes(k);
    const int64_t left = nv_codes_left(w, t);
    const int64_t ngroups = nblocks * (NV_BLOCK / 4); /* groups of 4 elements x 16 rows */
    __m256i tlo, thi;
    nv256_bf16_tables(&tlo, &thi);
    nv256_pipe pipe;
    nv256_pipe_start(&pipe, tc);
    __m256 acc_e = _mm256_setzero_ps(), acc_o = _mm256_setzero_ps();
    for (int64_t b = 0; b < nblocks; b++) {
        const float *xb = nv_chunk_f32(c) + b * NV_BLOCK; /* x[16b] */
        __m256 pe[2], po[2];                       /* [k parity] */
        nv256_prefetch_block(tc, b, left);
#pragma GCC unroll 4
        for (int jj = 0; jj < NV_BLOCK / 4; jj++) { /* pairs 2jj, 2jj+1: k = 16b + 4jj + q */
            __m256i wq[4];
            nv256_pipe_next(&pipe, tc, b * (NV_BLOCK / 4) + jj, ngroups, tlo, thi, wq);
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) {
                const __m256 x = _mm256_broadcast_ss(xb + 4 * jj + q);
                if (jj == 0 && q < 2) {
                    pe[q] = _mm256_mul_ps(nv256_even(wq[q]), x);
                    po[q] = _mm256_mul_ps(nv256_odd(wq[q]), x);
                } else {
                    pe[q & 1] = _mm256_fmadd_ps(nv256_even(wq[q]), x, pe[q & 1]);
                    po[q & 1] = _mm256_fmadd_ps(nv256_odd(wq[q]), x, po[q & 1]);
                }
            }
        }
        __m256 se, so;
        nv256_scales_eo(ts + b * NV_TILE, &se, &so);
        acc_e = _mm256_fmadd_ps(_mm256_add_ps(pe[0], pe[1]), se, acc_e);
        acc_o = _mm256_fmadd_ps(_mm256_add_ps(po[0], po[1]), so, acc_o);
    }
    const int64_t n0 = t * NV_TILE;
    __m256 r0, r1;
    nv256_interleave(acc_e, acc_o, &r0, &r1);
    float *o = c->out + c->out_rows[0] * c->ldo + n0;
    nv256_store_rows(o, _mm256_mul_ps(r0, _mm256_loadu_ps(w->rowg + n0)), w->n - n0);
    nv256_store_rows(o + 8, _mm256_mul_ps(r1, _mm256_loadu_ps(w->rowg + n0 + 8)), w->n - n0 - 8);
}

/* ------------------------------------------------------------- float16 decode, M = 1 */

/* The vpshufb table of the float16 decode, in both 128-bit lanes: byte c is the high byte of
 * the float16 of 256 * e2m1(c). Every such float16 has a zero low byte (e2m1 has one mantissa
 * bit, float16 ten), so the byte alone, placed in the high half of a zeroed 16-bit lane, is
 * that float16 exactly (256 * 6 = 1536 and 256 * 0.5 = 128 are normal float16s). */
NV_INLINE __m256i nv256_f16_table(void) {
    uint8_t h[16];
    for (int c = 0; c < 16; c++) {
        const float v = nv_e2m1_lut[c] * NV_E4M3_F16_FACTOR; /* exact: a power of two */
        const unsigned short bits = _cvtss_sh(v, 0);
        h[c] = (uint8_t)(bits >> 8);
    }
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)h));
}

/* vcvtph2ps with its 8 float16s read from memory: one load and one arithmetic uop on Golden
 * Cove-class cores, against two arithmetic uops for the register form. Written as asm so that
 * the compiler keeps the memory operand (it would otherwise forward the store it sees and
 * extract the half in a register). */
NV_INLINE __m256 nv256_cvtph_mem(const uint16_t *p) {
    __m256 r;
    __asm__("vcvtph2ps %1, %0" : "=x"(r) : "m"(*(const __m128i *)p));
    return r;
}

/* The 32 code bytes of a group at p (k0 = the group's first k) -> their 64 float16 patterns at
 * h: h[0..15] rows 0..7 at k0, then rows 0..7 at k0 + 2 (low nibbles; lane 0 of the unpack
 * holds pair j, lane 1 pair j + 1); h[16..31] rows 8..15 at k0, k0 + 2; h[32..47] rows 0..7
 * at k0 + 1, k0 + 3 (high nibbles); h[48..63] rows 8..15 at k0 + 1, k0 + 3. */
NV_INLINE void nv256_f16_decode(const uint8_t *p, __m256i table, uint16_t *h) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), zero = _mm256_setzero_si256();
    const __m256i v = _mm256_loadu_si256((const __m256i *)p);
    const __m256i e = _mm256_and_si256(v, m4);
    const __m256i o = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    const __m256i he = _mm256_shuffle_epi8(table, e), ho = _mm256_shuffle_epi8(table, o);
    _mm256_store_si256((__m256i *)(h + 0), _mm256_unpacklo_epi8(zero, he));
    _mm256_store_si256((__m256i *)(h + 16), _mm256_unpackhi_epi8(zero, he));
    _mm256_store_si256((__m256i *)(h + 32), _mm256_unpacklo_epi8(zero, ho));
    _mm256_store_si256((__m256i *)(h + 48), _mm256_unpackhi_epi8(zero, ho));
}

/* One row of x (MC = 1) through the float16 decode: each group's 32 code bytes (pair j and
 * pair j + 1 of the 16 rows: 128-bit lane 0 holds pair j, lane 1 pair j + 1) are split into
 * low and high nibbles, looked up (one vpshufb each) and unpacked against zero into float16
 * patterns, stored to an L1 buffer in which each 16-byte half holds rows 0..7 or 8..15 of one
 * k, and read back 8 at a time by vcvtph2ps from memory. Rows come out in order, so no
 * lane-crossing permute or even / odd split is needed. Per 64 weights: 3 nibble operations,
 * 2 vpshufb, 4 vpunpck, 8 vcvtph2ps and 8 FMAs (25 arithmetic uops against 28 for the
 * bfloat16-pair decode), 4 stores and 12 loads. Each block's products are summed in four
 * chains (rows 0..7 and 8..15, even and odd k), added, and multiplied by the block's scales
 * into the running sums: k256_one's products and order, hence its bits.
 *
 * Why (Emerald Rapids, Golden Cove cores): k256_one is bound by the three vector ports (about
 * 124 arithmetic uops per block, 11.0 cycles per 64 weights against a floor of 10.3). There
 * vcvtph2ps from memory is one uop on port 0 or 1 and one load (two cvt + FMA pairs per
 * cycle, measured), while from a register it is two; this loop is about 108 uops per block,
 * 73 of them for ports 0 / 1 (conversions, FMAs, shifts), a floor of 9.1 cycles. Measured,
 * one thread, interleaved A/B against k256_one (medians of 31 rounds, a second copy of each
 * library within 0.99-1.01x): without a pipe 0.93x the time (10.2 cycles); the decode one
 * group ahead 0.89-0.90x; two groups ahead 0.86x (9.4 cycles, 4096 x 4096 and
 * 1024 x 4096); three ahead the same as two. The store-to-load round trip through L1 costs
 * the stores and loads only, which these ports have to spare (four stores, twelve loads per
 * 64 weights). Zen 4, where k256_one was tuned, keeps it until this one is measured there. */
static void k256_one_f16(const nv_weight *w, int64_t t, const nv_chunk *c) {
    const int64_t k = w->k, nblocks = k / NV_BLOCK;
    const uint8_t *tc = w->codes + t * nv_tile_code_bytes(k);
    const uint8_t *ts = w->scales + t * nv_tile_scale_bytes(k);
    const int64_t left = nv_codes_left(w, t);
    const int64_t ngroups = nblocks * (NV_BLOCK / 4);
    const __m256i table = nv256_f16_table();
    uint16_t hb[4][64] __attribute__((aligned(32))); /* group g's float16s in slot g mod 4 */
    uint16_t sb[NV_TILE] __attribute__((aligned(32)));
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(); /* rows 0..7, 8..15 */
    nv256_f16_decode(tc, table, hb[0]);
    nv256_f16_decode(tc + NV256_GROUP_BYTES, table, hb[1]);
    for (int64_t b = 0; b < nblocks; b++) {
        const float *xb = nv_chunk_f32(c) + b * NV_BLOCK; /* x[16b] */
        nv256_prefetch_block(tc, b, left);
        __m256 p0[2], p1[2]; /* rows 0..7 / 8..15, [k parity] */
#pragma GCC unroll 4
        for (int jj = 0; jj < NV_BLOCK / 4; jj++) {
            const int64_t g = b * (NV_BLOCK / 4) + jj;
            /* group g + 2 first, into the slot g + 2 reads (near the end, group g again: in
             * bounds and never read) */
            nv256_f16_decode(tc + (g + 2 < ngroups ? g + 2 : g) * NV256_GROUP_BYTES, table,
                             hb[(jj + 2) & 3]);
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) { /* k = k0 + q: nibble half q & 1, lane q >> 1 */
                const uint16_t *h = hb[jj & 3] + 32 * (q & 1) + 8 * (q >> 1);
                const __m256 x = _mm256_broadcast_ss(xb + 4 * jj + q);
                const __m256 w0 = nv256_cvtph_mem(h), w1 = nv256_cvtph_mem(h + 16);
                if (jj == 0 && q < 2) {
                    p0[q] = _mm256_mul_ps(w0, x);
                    p1[q] = _mm256_mul_ps(w1, x);
                } else {
                    p0[q & 1] = _mm256_fmadd_ps(w0, x, p0[q & 1]);
                    p1[q & 1] = _mm256_fmadd_ps(w1, x, p1[q & 1]);
                }
            }
        }
        /* scale bytes -> float16 patterns (byte << 7 = e4m3 / 256, see the top of the file) */
        const __m256i s16 =
            _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(ts + b * NV_TILE)));
        _mm256_store_si256((__m256i *)sb, _mm256_slli_epi16(s16, 7));
        acc0 = _mm256_fmadd_ps(_mm256_add_ps(p0[0], p0[1]), nv256_cvtph_mem(sb), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_add_ps(p1[0], p1[1]), nv256_cvtph_mem(sb + 8), acc1);
    }
    const int64_t n0 = t * NV_TILE;
    float *o = c->out + c->out_rows[0] * c->ldo + n0;
    nv256_store_rows(o, _mm256_mul_ps(acc0, _mm256_loadu_ps(w->rowg + n0)), w->n - n0);
    nv256_store_rows(o + 8, _mm256_mul_ps(acc1, _mm256_loadu_ps(w->rowg + n0 + 8)), w->n - n0 - 8);
}

/* MC >= 2 rows of x: decode into L1 once, with register-blocked FMAs.
 *
 * The k range is cut into panels of NV_AVX2_KP consecutive k. A panel's weights are decoded
 * (bfloat16-pair decode: 256 * e2m1, the block scale not applied) into wbuf[kk][0..15] = the
 * 16 rows' weights at k0 + kk, even rows in 0..7 and odd rows in 8..15 (nv256_decode4's
 * order), and its block scales / 256 into sbuf[block][0..15] (same order). The first
 * MB0 <= 4 activation rows take their FMAs in the decoding loop itself, straight from the
 * registers (the decode's shuffles and these FMAs interleave in one instruction stream, so
 * the core overlaps them); when MC <= 4 that is all, and nothing is stored. The other rows
 * run over wbuf in groups of MB <= NV_AVX2_MB: per k, two weight loads, MB broadcasts and
 * 2 * MB FMAs into partial sums in registers. Every row sums each block's 16 products in
 * registers (two chains, even and odd k, where a group is too small to hide the FMA latency
 * otherwise), then adds partial * scale to its running sum acc[m][16] (same row order): one
 * scale multiply per block instead of one per weight, as at MC = 1. The epilogue puts the
 * rows back in order.
 * The grouping depends on MC alone, so the result does not depend on the thread count. */
#define NV_AVX2_KP 32 /* k per decoded panel: 2 blocks, wbuf 2 KiB */
/* The largest row group: 2 * MB partial sums (4 * MB when split, MB <= 3) + 2 weights + 1
 * broadcast of the 16 ymm registers. */
#define NV_AVX2_MB 6

/* The row grouping of a chunk of MC rows: MB0 rows in the decoding loop, the others in
 * groups of at most mb rows (as few groups as possible, sizes within one). Chosen per MC by
 * measurement (one thread, a weight in L2, Zen 4), against MB0 = 3 with groups of at most 5
 * (the default): MC = 9 takes MB0 = 3 and one group of 6 (0.77x the cycles), MC = 10, 14
 * and >= 19 take MB0 = 2 and groups of at most 6 (0.95x, 0.93x, 0.94-0.98x). Some
 * combinations spill partial sums (groups of 6 after MB0 = 3 at MC = 15, 20, 32: 1.2-1.4x
 * slower), hence the table rather than one rule. MC = 8 checked again with the pipelined
 * decode in place: MB0 = 4 with a group of 4, and MB0 = 2 with a group of 6, ran 1.02x the
 * time of MB0 = 3 with a group of 5 at 14336 x 8192 and 1.00-1.01x at 4096 x 4096. */
NV_INLINE int k256_mb0(const int MC) {
    if (MC <= 4) return MC;
    return (MC == 5 || MC == 10 || MC == 14 || MC >= 19) ? 2 : 3;
}
NV_INLINE int k256_mb(const int MC) { return (MC == 9 || MC == 10 || MC == 14 || MC >= 19) ? 6 : 5; }

/* acc[16 m .. 16 m + 15] += (pe | po) * (se | so): one block's partial sums of row m, scaled.
 * p = the row's [even / odd rows][k parity] partial sums; with SPLIT the two k-parity chains
 * are added first (pe = p[0][0] + p[0][1]), else p[.][0] alone holds the sum. */
NV_INLINE void k256_acc_block(float *acc, int m, const __m256 p[2][2], __m256 se, __m256 so,
                              const int SPLIT) {
    __m256 pe = p[0][0], po = p[1][0];
    if (SPLIT) {
        pe = _mm256_add_ps(pe, p[0][1]);
        po = _mm256_add_ps(po, p[1][1]);
    }
    float *a = acc + m * NV_TILE;
    _mm256_store_ps(a, _mm256_fmadd_ps(pe, se, _mm256_load_ps(a)));
    _mm256_store_ps(a + 8, _mm256_fmadd_ps(po, so, _mm256_load_ps(a + 8)));
}

/* Rows m0 .. m0 + MB - 1 of the chunk over the nb decoded blocks of wbuf (panel slice xp,
 * block scales sbuf): per block, partial sums in registers (SPLIT: separate ones for even
 * and odd k, so that small groups still have enough independent FMA chains), then one
 * scaled add into acc. */
NV_INLINE void k256_rows(const float *wbuf, const float *sbuf, int nb, const float *xp,
                         const int MC, const int m0, float *acc, const int MB, const int SPLIT) {
    for (int bb = 0; bb < nb; bb++) {
        __m256 p[NV_AVX2_MB][2][2]; /* [row][even / odd rows][k parity, SPLIT only] */
#pragma GCC unroll 16
        for (int kk = 0; kk < NV_BLOCK; kk++) {
            const float *wk = wbuf + (bb * NV_BLOCK + kk) * NV_TILE;
            const __m256 we = _mm256_load_ps(wk);     /* even rows at k0 + 16 bb + kk */
            const __m256 wo = _mm256_load_ps(wk + 8); /* odd rows */
            const float *x = xp + (bb * NV_BLOCK + kk) * MC + m0; /* panel[k0 + 16bb + kk][m0] */
            const int par = SPLIT ? (kk & 1) : 0;
#pragma GCC unroll 6
            for (int i = 0; i < MB; i++) {
                const __m256 xb = _mm256_broadcast_ss(x + i);
                if (kk < (SPLIT ? 2 : 1)) {
                    p[i][0][par] = _mm256_mul_ps(we, xb);
                    p[i][1][par] = _mm256_mul_ps(wo, xb);
                } else {
                    p[i][0][par] = _mm256_fmadd_ps(we, xb, p[i][0][par]);
                    p[i][1][par] = _mm256_fmadd_ps(wo, xb, p[i][1][par]);
                }
            }
        }
        const __m256 se = _mm256_load_ps(sbuf + bb * NV_TILE);    /* even rows' scales */
        const __m256 so = _mm256_load_ps(sbuf + bb * NV_TILE + 8); /* odd rows' */
#pragma GCC unroll 6
        for (int i = 0; i < MB; i++) k256_acc_block(acc, m0 + i, p[i], se, so, SPLIT);
    }
}

/* Decode blocks b0 .. b0 + nb - 1: unscaled weights into wbuf and scales into sbuf (when
 * STORE) and, in the same pass, the products of rows 0 .. MB0 - 1 of the chunk (panel slice
 * xp), per block in partial sums (even / odd k apart), then scaled into acc. */
NV_INLINE void k256_decode_rows(const uint8_t *tc, const uint8_t *ts, int64_t left, int64_t b0,
                                int nb, __m256i tlo, __m256i thi, float *wbuf, float *sbuf,
                                const float *xp, const int MC, float *acc, const int MB0,
                                const int SPLIT, const int STORE) {
    for (int bb = 0; bb < nb; bb++) {
        const int64_t b = b0 + bb;
        nv256_prefetch_block(tc, b, left);
        __m256 p[4][2][2]; /* [row][even / odd rows][k parity, SPLIT only] */
#pragma GCC unroll 4
        for (int jj = 0; jj < NV_BLOCK / 4; jj++) { /* pairs 2jj, 2jj+1: k = 16b + 4jj + q */
            __m256i wq[4];
            nv256_decode4(tc + (b * (NV_BLOCK / 2) + 2 * jj) * NV_TILE, tlo, thi, wq);
            const int kk0 = bb * NV_BLOCK + 4 * jj; /* k0 + kk0: the first of the 4 k */
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) {
                const __m256 we = nv256_even(wq[q]), wo = nv256_odd(wq[q]);
                if (STORE) {
                    _mm256_store_ps(wbuf + (kk0 + q) * NV_TILE, we);
                    _mm256_store_ps(wbuf + (kk0 + q) * NV_TILE + 8, wo);
                }
                const float *x = xp + (kk0 + q) * MC; /* panel[k0 + kk0 + q][0] */
#pragma GCC unroll 4
                for (int i = 0; i < MB0; i++) {
                    const __m256 xb = _mm256_broadcast_ss(x + i);
                    const int par = SPLIT ? (q & 1) : 0;
                    if (jj == 0 && q < (SPLIT ? 2 : 1)) {
                        p[i][0][par] = _mm256_mul_ps(we, xb);
                        p[i][1][par] = _mm256_mul_ps(wo, xb);
                    } else {
                        p[i][0][par] = _mm256_fmadd_ps(we, xb, p[i][0][par]);
                        p[i][1][par] = _mm256_fmadd_ps(wo, xb, p[i][1][par]);
                    }
                }
            }
        }
        __m256 se, so;
        nv256_scales_eo(ts + b * NV_TILE, &se, &so);
        if (STORE) {
            _mm256_store_ps(sbuf + bb * NV_TILE, se);
            _mm256_store_ps(sbuf + bb * NV_TILE + 8, so);
        }
#pragma GCC unroll 4
        for (int i = 0; i < MB0; i++) k256_acc_block(acc, i, p[i], se, so, SPLIT);
    }
}

/* Tile t of w times the MC rows of chunk c (see above), over k in [kb, ke) only: one slab of
 * the plan (plan.h). acc holds the tile's running sums (MC * 16 floats, the even / odd row
 * order) from one slab to the next: zeroed when kb = 0, put back in row order, scaled by
 * the row globals and stored when ke = k. Each block's scaled sum is added to acc in block
 * order whatever the slabs, so every kc gives the same bits. */
NV_INLINE void k256_buf(const nv_weight *w, int64_t t, const nv_chunk *c, const int MC,
                        int64_t kb, int64_t ke, int kp, float *acc_io) {
    const int64_t k = w->k;
    const uint8_t *tc = w->codes + t * nv_tile_code_bytes(k);
    const uint8_t *ts = w->scales + t * nv_tile_scale_bytes(k);
    const int64_t left = nv_codes_left(w, t);
    __m256i tlo, thi;
    nv256_bf16_tables(&tlo, &thi);
    float wbuf[NV_AVX2_KP * NV_TILE] __attribute__((aligned(32)));
    float sbuf[NV_AVX2_KP / NV_BLOCK * NV_TILE] __attribute__((aligned(32)));
    /* the running sums in a local array (the compiler then knows nothing else aliases
     * them: 1.05-1.1x faster at MC = 2..8 than working in acc_io), carried in acc_io from
     * one slab to the next */
    float acc[NV_AVX2_MC_MAX * NV_TILE] __attribute__((aligned(32)));
#pragma GCC unroll 64
    for (int i = 0; i < MC * 2; i++)
        _mm256_store_ps(acc + 8 * i, kb == 0 ? _mm256_setzero_ps() : _mm256_load_ps(acc_io + 8 * i));
    /* rows 0 .. MB0 - 1 run with the decode; the rest, in groups of at most k256_mb(MC) rows
     * (as few as possible, sizes within one), from wbuf */
    const int MB0 = k256_mb0(MC), mb = k256_mb(MC);
    const int rest = MC - MB0;
    const int ng = (rest + mb - 1) / mb;
    const int g_small = ng ? rest / ng : 0, g_big = ng ? ng - rest % ng : 0;
    for (int64_t k0 = kb; k0 < ke; k0 += kp) {
        const int kn = (ke - k0) < kp ? (int)(ke - k0) : kp; /* a multiple of 16, <= KP */
        const float *xp = nv_chunk_f32(c) + k0 * MC; /* panel[k0][0] */
        k256_decode_rows(tc, ts, left, k0 / NV_BLOCK, kn / NV_BLOCK, tlo, thi, wbuf, sbuf, xp, MC,
                         acc, MB0, MB0 <= 2, rest > 0);
#pragma GCC unroll 8
        for (int g = 0; g < ng; g++) {
            /* g_big groups of g_small rows, then groups of g_small + 1 */
            const int m0 =
                MB0 + (g < g_big ? g * g_small : g_big * g_small + (g - g_big) * (g_small + 1));
            if (g < g_big)
                k256_rows(wbuf, sbuf, kn / NV_BLOCK, xp, MC, m0, acc, g_small, g_small <= 3);
            else
                k256_rows(wbuf, sbuf, kn / NV_BLOCK, xp, MC, m0, acc, g_small + 1,
                          g_small + 1 <= 3);
        }
    }
    if (ke < k) {
#pragma GCC unroll 64
        for (int i = 0; i < MC * 2; i++) _mm256_store_ps(acc_io + 8 * i, _mm256_load_ps(acc + 8 * i));
        return;
    }
    const int64_t n0 = t * NV_TILE;
    const __m256 g0 = _mm256_loadu_ps(w->rowg + n0), g1 = _mm256_loadu_ps(w->rowg + n0 + 8);
#pragma GCC unroll 32
    for (int m = 0; m < MC; m++) {
        __m256 r0, r1;
        nv256_interleave(_mm256_load_ps(acc + m * NV_TILE), _mm256_load_ps(acc + m * NV_TILE + 8),
                         &r0, &r1);
        float *o = c->out + c->out_rows[m] * c->ldo + n0;
        nv256_store_rows(o, _mm256_mul_ps(r0, g0), w->n - n0);
        nv256_store_rows(o + 8, _mm256_mul_ps(r1, g1), w->n - n0 - 8);
    }
}

#define NV_BUF(MC)                                                                            \
    static __attribute__((noinline)) void k256_buf_##MC(const nv_weight *w, int64_t t,         \
                                                        const nv_chunk *c, int64_t kb,        \
                                                        int64_t ke, int kp, float *acc) {     \
        k256_buf(w, t, c, MC, kb, ke, kp, acc);                                               \
    }
NV_BUF(2)
NV_BUF(3)
NV_BUF(4)
NV_BUF(5)
NV_BUF(6)
NV_BUF(7)
NV_BUF(8)
NV_BUF(9)
NV_BUF(10)
NV_BUF(11)
NV_BUF(12)
NV_BUF(13)
NV_BUF(14)
NV_BUF(15)
NV_BUF(16)
NV_BUF(17)
NV_BUF(18)
NV_BUF(19)
NV_BUF(20)
NV_BUF(21)
NV_BUF(22)
NV_BUF(23)
NV_BUF(24)
NV_BUF(25)
NV_BUF(26)
NV_BUF(27)
NV_BUF(28)
NV_BUF(29)
NV_BUF(30)
NV_BUF(31)
NV_BUF(32)

typedef void (*k256_fn)(const nv_weight *, int64_t, const nv_chunk *, int64_t, int64_t, int,
                        float *);
static const k256_fn k256_by_mc[NV_AVX2_MC_MAX + 1] = { /* by chunk size MC */
    0, 0 /* MC = 1: k256_qmm_tiles picks the decode */, k256_buf_2, k256_buf_3, k256_buf_4,
    k256_buf_5, k256_buf_6, k256_buf_7, k256_buf_8,
    k256_buf_9, k256_buf_10, k256_buf_11, k256_buf_12, k256_buf_13, k256_buf_14, k256_buf_15,
    k256_buf_16, k256_buf_17, k256_buf_18, k256_buf_19, k256_buf_20, k256_buf_21, k256_buf_22,
    k256_buf_23, k256_buf_24, k256_buf_25, k256_buf_26, k256_buf_27, k256_buf_28, k256_buf_29,
    k256_buf_30, k256_buf_31, k256_buf_32,
};

/* The decode of the one-row kernel (nvfp4cpu_avx2_m1_decode): 0 until first asked, then
 * NV_AVX2_DECODE_F16 (k256_one_f16) or NV_AVX2_DECODE_BF16 (k256_one). Both sum the same exact
 * products in the same order, so they give the same bits; the choice is speed alone. The
 * float16 decode runs 0.86x the time of the bfloat16 pairs on Emerald Rapids (one thread,
 * 4096 x 4096 and 1024 x 4096), where vcvtph2ps from memory is one arithmetic uop and the
 * bfloat16 pairs' shifts and shuffles bound the loop; Zen 4, where the bfloat16 pairs were
 * tuned, keeps them until the float16 decode is measured there. */
static atomic_int k256_m1_decode;

int nv_avx2_m1_decode(int mode) {
    if (mode == NV_AVX2_DECODE_F16 || mode == NV_AVX2_DECODE_BF16) {
        atomic_store(&k256_m1_decode, mode);
    } else if (mode == NV_AVX2_DECODE_AUTO || atomic_load(&k256_m1_decode) == 0) {
        atomic_store(&k256_m1_decode,
                     nv_cpu_is_intel() ? NV_AVX2_DECODE_F16 : NV_AVX2_DECODE_BF16);
    }
    return atomic_load(&k256_m1_decode);
}

/* Tiles [t0, t0 + nt) times chunk c. One row: each tile in one pass (its activation row is
 * K floats, always in L1 / L2). Two rows or more, slab by slab over K (the plan's kc, plan.h):
 * for each slab, every tile of the item in turn, so the slab of the activation panel (kc * MC
 * floats) is read from memory once per item and from L2 by the other tiles. Reading the whole
 * panel per tile (kc = 0, the schedule before the plan) streams K * MC * 4 bytes per tile: at
 * K = 4096 and MC = 32 that is 512 KiB, the whole L2 of a Zen 3 core, so the panel came from
 * L3 for every tile and W4A16 lost half its speed past M = 8 there. */
static void k256_qmm_tiles(const nv_weight *w, int64_t t0, int64_t nt, const nv_chunk *c) {
    if (c->mc == 1) {
        int m1 = atomic_load_explicit(&k256_m1_decode, memory_order_relaxed);
        if (m1 == 0) m1 = nv_avx2_m1_decode(-1);
        for (int64_t t = t0; t < t0 + nt; t++)
            (m1 == NV_AVX2_DECODE_F16 ? k256_one_f16 : k256_one)(w, t, c);
        return;
    }
    const nv_plan plan = nv_plan_now();
    const int64_t k = w->k;
    /* the plan's kc is for a chunk of 32 rows: a smaller chunk gets the same slab bytes
     * (kc * 32 floats), so the chunks whose whole panel fits take K in one pass (a slab costs
     * the weight stream its prefetch run at every restart) */
    int64_t kc = plan.kc * (NV_MC_LIMIT / c->mc) / NV_PLAN_KC_STEP * NV_PLAN_KC_STEP;
    if (kc <= 0 || kc > k) kc = k;
    const int kp = plan.kp > 0 && plan.kp < NV_AVX2_KP ? plan.kp : NV_AVX2_KP;
    const k256_fn fn = k256_by_mc[c->mc];
    /* the running sums of up to NV_PLAN_GROUP_MAX tiles (16 KiB at MC = 32) */
    float acc[NV_PLAN_GROUP_MAX][NV_AVX2_MC_MAX * NV_TILE] __attribute__((aligned(32)));
    for (int64_t g0 = t0; g0 < t0 + nt; g0 += NV_PLAN_GROUP_MAX) {
        const int64_t g1 = g0 + NV_PLAN_GROUP_MAX < t0 + nt ? g0 + NV_PLAN_GROUP_MAX : t0 + nt;
        for (int64_t kb = 0; kb < k; kb += kc) {
            const int64_t ke = kb + kc < k ? kb + kc : k;
            for (int64_t t = g0; t < g1; t++) fn(w, t, c, kb, ke, kp, acc[t - g0]);
        }
    }
}

const nv_isa_kernels nv_kernels_avx2 = {
    {"avx2", NV_AVX2_MC_MAX, k256_qmm_tiles},
    generic_dequant_tiles, /* the plain-C decoder, vectorised by the compiler for AVX2 */
};
