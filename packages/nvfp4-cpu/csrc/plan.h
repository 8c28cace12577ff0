/* nvfp4-cpu: the cache plan, the blocking the matmul kernels take from the CPU they run on.
 *
 * THE CACHES
 * ----------
 * Three sizes in bytes (L1 data, L2 and L3 as one core sees them), from the first source that
 * answers: NVFP4_CPU_CACHE (parsed by nvfp4cpu_plan_parse_cache; Python passes the variable,
 * so a machine can run the plan another machine would choose), else Linux sysfs
 * (/sys/devices/system/cpu/cpu0/cache/index*), else CPUID (leaf 4 on Intel, 0x8000001D on
 * AMD), else the defaults below.
 *
 * THE PLAN (derived from the caches by nvfp4cpu_plan_derive; the numbers are part of the ABI)
 * -------------------------------------------------------------------------------------------
 *   kc    k per slab: a matmul work item (one chunk of up to 32 activation rows, `group`
 *         tiles) runs slab by slab over K, each slab of the activation panel (kc * 32 floats at
 *         most) reused from L2 for every tile of the item. kc = L2 / 512 bytes, so the slab
 *         is at most a quarter of L2, rounded down to a multiple of NV_PLAN_KC_STEP (16 scale
 *         blocks) and clamped to [NV_PLAN_KC_MIN, NV_PLAN_KC_MAX]. 512 KiB of L2 (Zen 3)
 *         gives kc = 1024, 2 MiB gives 4096. A chunk of MC < 32 rows gets the same slab
 *         bytes: kc * floor(32 / MC), rounded down to the step (K in one pass when that covers
 *         it). 0 means "the whole K in one slab" (the schedule
 *         before this plan: every tile read the whole panel).
 *   kp    k per decoded panel in L1 (the AVX2 kernel decodes kp k of a tile's 16 rows into an
 *         L1 buffer of kp * 64 bytes, reused by every row group): 32, or 16 below 16 KiB of L1.
 *   group tiles (of 16 output rows) per work item: 8 when the item's weight slab
 *         (8 * kc * 8 bytes) and its activation slab (kc * 128 bytes) fit in half of L2, else 4.
 *
 * No plan changes a result: every kernel adds each block's scaled sum to its output in block
 * order whatever the slab, panel and item sizes (the tests compare the bytes across plans).
 */
#ifndef NVFP4CPU_PLAN_H
#define NVFP4CPU_PLAN_H

#include <stdint.h>

#define NV_PLAN_KC_STEP 256    /* 16 blocks of 16 */
#define NV_PLAN_KC_MIN 256
#define NV_PLAN_KC_MAX 16384
#define NV_PLAN_KP_MAX 32      /* the AVX2 kernel's L1 buffer is sized for this */
#define NV_PLAN_GROUP_MAX 8

/* Where the cache sizes came from (part of the ABI). */
enum { NV_CACHE_DEFAULT = 0, NV_CACHE_ENV = 1, NV_CACHE_SYSFS = 2, NV_CACHE_CPUID = 3,
       NV_CACHE_GIVEN = 4 };

typedef struct {
    int64_t l1d, l2, l3; /* bytes */
    int source;          /* NV_CACHE_* */
    int64_t kc;          /* 0 = whole K */
    int kp, group;
} nv_plan;

/* The plan in effect (detected and derived on first use). Readers take it once per call. */
nv_plan nv_plan_now(void);

#endif /* NVFP4CPU_PLAN_H */
