/* nvfp4-cpu: the C entry points called through ctypes, the runtime ISA dispatch, the
 * pthread pool, and the ISA-independent kernels (layout packing, activation quantization).
 *
 * Compiled for the baseline target (no -m flags): nothing here may execute an instruction
 * the oldest supported CPU lacks. The SIMD kernels live in their own translation units and
 * are reached only through nv_isa_kernels tables after CPUID + XGETBV (x86, nv_x86_features)
 * or getauxval(AT_HWCAP) (AArch64 Linux) said yes.
 *
 * Every function returns 0 on success or a negative error code (NV_E*), never aborts, and
 * never reads outside the arrays whose sizes its arguments describe. Expert ids are bounds
 * checked here: a row whose id is outside [0, E) gets an exactly zero output row and reads
 * no weight byte.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nvfp4cpu.h"
#include "route.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h> /* __get_cpuid, __cpuid_count: header-only, the x86 levels' CPU check */
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h> /* getauxval(AT_HWCAP): the NEON level's CPU check */
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1UL << 1)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#endif
#if defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

#define NV_MAX_THREADS 256

float nv_e2m1_lut[16];
float nv_e4m3_lut[256];
static float nv_e2m1_bounds[7];   /* midpoints between E2M1 magnitudes */
static float nv_e2m1_odd[3];      /* the midpoints where round-half-even goes up */
static int nv_initialised = 0;
int nv_is_initialised(void) { return nv_initialised; } /* for the W4A8 driver */
/* The encoder's constants from nvfp4.spec (ENCODER_CONSTANTS), set by nvfp4cpu_init. */
static float nv_e2m1_max;       /* E2M1_MAX: s = block_amax / (e2m1_max * global) */
float nv_e4m3_max;              /* E4M3_MAX: the clamp's upper end */
static float nv_e4m3_min_sub;   /* E4M3_MIN_SUBNORMAL: the clamp's lower end, the subnormal step */
static int nv_e4m3_bias;        /* E4M3_BIAS */
uint8_t nv_e4m3_nan;            /* E4M3_NAN_BYTE: the scale byte of a block holding NaN or Inf */

/* ------------------------------------------------------------------ init and ISA facts */

NV_API int nvfp4cpu_abi_version(void) { return 6; }

/* The spec tables from nvfp4.spec: E2M1_VALUES (16), E4M3_VALUES (256), E2M1_BOUNDS (7),
 * E2M1_ODD_BOUNDS (3), and the encoder's constants (ENCODER_CONSTANTS): E2M1_MAX,
 * E4M3_MAX, E4M3_MIN_SUBNORMAL, E4M3_BIAS, E4M3_NAN_BYTE. Must be called once before
 * anything else. */
NV_API int nvfp4cpu_init(const float *e2m1, const float *e4m3, const float *bounds, const float *odd,
                         float e2m1_max, float e4m3_max, float e4m3_min_sub, int e4m3_bias,
                         int nan_byte) {
    if (!e2m1 || !e4m3 || !bounds || !odd) return NV_EINVAL;
    if (!(e2m1_max > 0.0f) || !(e4m3_max > 0.0f) || !(e4m3_min_sub > 0.0f) || e4m3_bias < 1 ||
        nan_byte < 1 || nan_byte > 0xFF)
        return NV_EINVAL;
    memcpy(nv_e2m1_lut, e2m1, sizeof(nv_e2m1_lut));
    memcpy(nv_e4m3_lut, e4m3, sizeof(nv_e4m3_lut));
    memcpy(nv_e2m1_bounds, bounds, sizeof(nv_e2m1_bounds));
    memcpy(nv_e2m1_odd, odd, sizeof(nv_e2m1_odd));
    nv_e2m1_max = e2m1_max;
    nv_e4m3_max = e4m3_max;
    nv_e4m3_min_sub = e4m3_min_sub;
    nv_e4m3_bias = e4m3_bias;
    nv_e4m3_nan = (uint8_t)nan_byte;
    nv_initialised = 1;
    return 0;
}

/* CPU feature bits, for availability() and the ISA checks. The bits are this file's: Python
 * asks for them by name (nvfp4cpu_cpu_feature_bit). */
enum {
    NV_F_AVX2 = 1 << 0, NV_F_FMA = 1 << 1, NV_F_F16C = 1 << 2, NV_F_AVX512F = 1 << 3,
    NV_F_AVX512BW = 1 << 4, NV_F_AVX512VL = 1 << 5, NV_F_AVX512VNNI = 1 << 6,
    NV_F_AVX512BF16 = 1 << 7, NV_F_X86 = 1 << 30,
    /* AArch64 */
    NV_F_ASIMD = 1 << 8, NV_F_ASIMDDP = 1 << 9, NV_F_AARCH64 = 1 << 29,
};
#define NV_F_DETECTED (1u << 31) /* nvfp4cpu_cpu_features' cache: detection has run */

#if defined(__x86_64__) || defined(__i386__)
/* XCR0, the OS's register-state mask, read with XGETBV (ecx = 0). Written as an asm
 * statement so this baseline unit needs no -mxsave; call it only where CPUID leaf 1 says
 * OSXSAVE (the OS has set CR4.OSXSAVE), else the instruction faults. */
static uint64_t nv_xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* The x86 features from CPUID and XCR0, by the rules of Intel's SDM vol. 1 (14.3, 15.2):
 * an instruction set counts only when the CPU has it AND the OS saves and restores the
 * registers it uses, else a context switch corrupts them (a CPUID flag alone is not
 * enough: a kernel booted with AVX-512 state disabled keeps the CPUID flags).
 * Header-only CPUID (<cpuid.h>) and one XGETBV: no run-time library's CPU model is needed
 * (__builtin_cpu_supports reads libgcc's; under zig cc it reads compiler-rt's, which reports
 * no feature at all, and the library would run portable code everywhere). */
static unsigned nv_x86_features(void) {
    unsigned a, b, c, d, f = NV_F_X86;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return f; /* no CPUID (a 486): baseline only */
    const unsigned max_leaf = a;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    /* Leaf 1, ECX: bit 12 FMA, bit 27 OSXSAVE (XGETBV usable), bit 28 AVX, bit 29 F16C. */
    const unsigned fma = (c >> 12) & 1u, osxsave = (c >> 27) & 1u, avx = (c >> 28) & 1u,
                   f16c = (c >> 29) & 1u;
    if (!osxsave || !avx) return f; /* no YMM state without both: nothing past SSE */
    const uint64_t xcr0 = nv_xgetbv0();
    /* XCR0 bit 1 = SSE (XMM) state, bit 2 = AVX (upper YMM halves): both for any VEX code. */
    if ((xcr0 & 0x6u) != 0x6u) return f;
    if (fma) f |= NV_F_FMA;
    if (f16c) f |= NV_F_F16C;
    if (max_leaf < 7) return f;
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned max_subleaf7 = a;
    /* Leaf 7 subleaf 0, EBX: bit 5 AVX2, bit 16 AVX512F, bit 30 AVX512BW, bit 31 AVX512VL;
     * ECX: bit 11 AVX512_VNNI. */
    if ((b >> 5) & 1u) f |= NV_F_AVX2;
    /* XCR0 bits 5, 6, 7 = opmask (k0-k7), ZMM_Hi256 (upper halves of zmm0-15), Hi16_ZMM
     * (zmm16-31): AVX-512 needs all three (with bits 1 and 2, checked above). */
    if ((xcr0 & 0xE0u) != 0xE0u) return f;
    if ((b >> 16) & 1u) f |= NV_F_AVX512F;
    if ((b >> 30) & 1u) f |= NV_F_AVX512BW;
    if ((b >> 31) & 1u) f |= NV_F_AVX512VL;
    if ((c >> 11) & 1u) f |= NV_F_AVX512VNNI;
    if (max_subleaf7 >= 1) {
        /* Leaf 7 subleaf 1, EAX: bit 5 AVX512_BF16. */
        __cpuid_count(7, 1, a, b, c, d);
        if ((a >> 5) & 1u) f |= NV_F_AVX512BF16;
    }
    return f;
}

/* 1 on an Intel CPU (CPUID leaf 0's vendor "GenuineIntel": EBX "Genu", EDX "ineI", ECX
 * "ntel"), for the AVX2 one-row decode's default (kernels_avx2.c). */
int nv_cpu_is_intel(void) {
    unsigned a, b, c, d;
    return __get_cpuid(0, &a, &b, &c, &d) && b == 0x756E6547u && d == 0x49656E69u &&
           c == 0x6C65746Eu;
}
#endif

static unsigned nv_detect_features(void) {
    unsigned f = 0;
#if defined(__x86_64__) || defined(__i386__)
    f |= nv_x86_features();
#endif
#if defined(__aarch64__)
    f |= NV_F_AARCH64;
#if defined(__linux__)
    const unsigned long hw = getauxval(AT_HWCAP);
    if (hw & HWCAP_ASIMD) f |= NV_F_ASIMD;
    if (hw & HWCAP_ASIMDDP) f |= NV_F_ASIMDDP;
#elif defined(__APPLE__)
    f |= NV_F_ASIMD; /* every Apple AArch64 core has Advanced SIMD */
    {
        int dp = 0;
        size_t len = sizeof(dp);
        if (sysctlbyname("hw.optional.arm.FEAT_DotProd", &dp, &len, NULL, 0) == 0 && dp)
            f |= NV_F_ASIMDDP;
    }
#endif
#endif
    return f;
}

/* Detected once and kept: every dispatch asks, and CPUID traps to the hypervisor in a VM.
 * Bit 31 marks "detected", so that 0 (an architecture without feature bits) is kept too. */
NV_API unsigned nvfp4cpu_cpu_features(void) {
    static atomic_uint cached;
    unsigned v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (!(v & NV_F_DETECTED)) {
        v = nv_detect_features() | NV_F_DETECTED; /* racing first callers store the same value */
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v & ~NV_F_DETECTED;
}

/* The bit of a feature of nvfp4cpu_cpu_features(), by name ("avx2", "fma", "f16c",
 * "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx512bf16", "x86"; "asimd",
 * "asimddp", "aarch64"); 0 for a name this library does not know. */
NV_API unsigned nvfp4cpu_cpu_feature_bit(const char *name) {
    static const struct { const char *name; unsigned bit; } bits[] = {
        {"avx2", NV_F_AVX2},       {"fma", NV_F_FMA},           {"f16c", NV_F_F16C},
        {"avx512f", NV_F_AVX512F}, {"avx512bw", NV_F_AVX512BW}, {"avx512vl", NV_F_AVX512VL},
        {"avx512vnni", NV_F_AVX512VNNI}, {"avx512bf16", NV_F_AVX512BF16}, {"x86", NV_F_X86},
        {"asimd", NV_F_ASIMD}, {"asimddp", NV_F_ASIMDDP}, {"aarch64", NV_F_AARCH64},
    };
    if (!name) return 0;
    for (size_t i = 0; i < sizeof(bits) / sizeof(bits[0]); i++)
        if (strcmp(bits[i].name, name) == 0) return bits[i].bit;
    return 0;
}

/* 1 when the ISA level's translation unit is linked into this library. */
NV_API int nvfp4cpu_isa_compiled(int isa) {
    switch (isa) {
    case NV_ISA_PORTABLE: return 1;
#if defined(NVFP4CPU_HAVE_AVX2)
    case NV_ISA_AVX2: return 1;
#endif
#if defined(NVFP4CPU_HAVE_AVX512)
    case NV_ISA_AVX512: return 1;
#endif
#if defined(NVFP4CPU_HAVE_NEON)
    case NV_ISA_NEON: return 1;
#endif
    default: return 0;
    }
}

/* Every E2M1 value, and 256 times it, is a bfloat16: the low 16 bits of its float32 pattern
 * are zero (the AVX2 decoder looks up the two high bytes of 256 * e2m1). And 256 times it is
 * zero or a normal float16 whose low byte is zero (the float16 decoder looks up the high
 * byte): a float32 exponent within float16's normal range and no mantissa bit below the
 * float16 pattern's top two, i.e. float32 mantissa bits 20..0 clear. */
static int nv_e2m1_avx2_decodable(void) {
    for (int i = 0; i < 16; i++) {
        union { float f; uint32_t u; } a = {nv_e2m1_lut[i]}, b = {nv_e2m1_lut[i] * NV_E4M3_F16_FACTOR};
        if ((a.u & 0xFFFFu) != 0 || (b.u & 0xFFFFu) != 0) return 0;
        const int e = (int)((b.u >> 23) & 0xFFu) - 127; /* unbiased exponent of 256 * e2m1 */
        if ((b.u & 0x7FFFFFFFu) != 0 && (e < -14 || e > 15 || (b.u & 0x1FFFFFu) != 0)) return 0;
    }
    return 1;
}

/* 1 when the level is compiled in and this CPU (and OS) can run it. */
NV_API int nvfp4cpu_isa_supported(int isa) {
    if (!nvfp4cpu_isa_compiled(isa)) return 0;
    const unsigned f = nvfp4cpu_cpu_features();
    switch (isa) {
    case NV_ISA_PORTABLE: return 1;
    case NV_ISA_AVX2: {
        const unsigned need = NV_F_AVX2 | NV_F_FMA | NV_F_F16C;
        return (f & need) == need && nv_e2m1_avx2_decodable();
    }
    case NV_ISA_AVX512: {
        const unsigned need = NV_F_AVX512F | NV_F_AVX512BW | NV_F_AVX512VL | NV_F_FMA | NV_F_F16C;
        return (f & need) == need;
    }
#if defined(NVFP4CPU_HAVE_NEON)
    case NV_ISA_NEON: return (f & NV_F_ASIMD) && nv_neon_tables_ok();
#endif
    default: return 0;
    }
}

/* The decode the AVX2 level's one-row (M = 1) W4A16 kernel uses: mode 1 = float16 patterns
 * through vcvtph2ps, 2 = bfloat16 pairs, 0 = this CPU's default (float16 on Intel, bfloat16
 * pairs elsewhere), -1 = only ask. Both give the same bits; the choice is speed alone.
 * Returns the decode in effect (1 or 2), or 0 when this CPU or build has no AVX2 level. */
NV_API int nvfp4cpu_avx2_m1_decode(int mode) {
#if defined(NVFP4CPU_HAVE_AVX2)
    if (!nvfp4cpu_isa_supported(NV_ISA_AVX2)) return 0;
    return nv_avx2_m1_decode(mode);
#else
    (void)mode;
    return 0;
#endif
}

static const nv_isa_kernels *nv_kernels_for(int isa) {
    if (!nv_initialised || !nvfp4cpu_isa_supported(isa)) return NULL;
    switch (isa) {
#if defined(NVFP4CPU_HAVE_NEON)
    case NV_ISA_NEON: return &nv_kernels_neon;
#endif
#if defined(NVFP4CPU_HAVE_AVX512)
    case NV_ISA_AVX512: return &nv_kernels_avx512;
#endif
#if defined(NVFP4CPU_HAVE_AVX2)
    case NV_ISA_AVX2: return &nv_kernels_avx2;
#endif
    case NV_ISA_PORTABLE: return &nv_kernels_portable;
    default: return NULL;
    }
}

/* ------------------------------------------------------------------------ thread pool */
/* A persistent pool with dynamic scheduling. A job is a range of items [0, nitems) handed
 * out `grain` at a time from an atomic counter; the calling thread always works on it, and
 * up to nth - 1 pool workers help. Workers are created on first need, then wait for the next
 * job spinning briefly (back-to-back matmuls start in microseconds) and then sleeping on a
 * condition variable (an idle pool costs nothing).
 *
 * Why dynamic: on a shared or oversubscribed machine a worker may not be scheduled for a
 * whole time slice. With a static split the caller would wait for its share; here the
 * caller takes the items the worker never claimed and waits only for workers that actually
 * joined. Items are fixed by the problem, never by the thread count, so the results are
 * bit-identical for every thread count.
 *
 * Joining protocol (all sequentially consistent): a worker increments `active`, then reads
 * `open`; the caller, once the items are exhausted, clears `open`, then waits for `active`
 * to drop to 0. Either the caller sees the worker in `active` (and waits for it), or the
 * worker sees `open` cleared (and never touches the job, which lives on the caller's
 * stack). One job runs at a time (run_lock); ctypes releases the GIL, so concurrent Python
 * threads queue here. After fork() the child starts with an empty pool.
 *
 * Workers and their caller on one CPU. The kernel sometimes wakes a sleeping worker on the
 * waker's own CPU although another is idle (on a VM, an idle vCPU the host has descheduled
 * does not count as idle to the guest). The worker then waits in that CPU's run queue
 * while the caller does every item itself, and keeps sharing that CPU with the caller
 * (spinning between calls) until the load balancer moves it, milliseconds later. Two
 * defences: a worker that joins a job on its caller's CPU moves itself off it
 * (nv_leave_caller_cpu), and a caller whose broadcast woke sleeping workers yields once, so
 * that one queued behind it runs at once and moves (a microsecond when none is queued; a
 * slice of another runnable thread of the process when one is). Measured on a 2-vCPU EPYC
 * (Zen 5), 4096 x 4096 at M = 1, bursts of calls after a 0.2 s pause: AVX2, 30-call
 * bursts at one-thread speed in 10 of 60 without either defence, 0 of 60 with the move;
 * AVX-512 (0.14 ms a call), 8-call bursts at one-thread speed in 8 of 24 with the move
 * alone, 0 of 24 with the yield too (first call after the pause 0.26 -> 0.21 ms). */

/* nv_task (process items [lo, hi)) is declared in nvfp4cpu.h */

typedef struct {
    nv_task fn;
    void *ctx;
    int64_t nitems, grain;
    atomic_llong next; /* first unclaimed item */
} nv_job;

static struct {
    pthread_mutex_t run_lock;
    pthread_mutex_t mtx;
    pthread_cond_t cv;
    int nworkers;       /* created workers */
    unsigned start_gen; /* generation a newly created worker has already seen */
    atomic_uint gen;    /* bumped for each job, under mtx, to wake the workers */
    atomic_int open;    /* 1 while the current job admits helpers */
    atomic_int active;  /* workers between joining and leaving a job */
    atomic_int helpers; /* helpers admitted to the current job */
    int max_helpers;    /* nth - 1 for the current job */
    int sleepers;       /* workers waiting on cv (under mtx) */
    atomic_int caller_cpu; /* the CPU the current job's caller started on, or -1 */
    nv_job *job;
    atomic_int join_cpu; /* where the last worker to join a job ran once it had left the
                            caller's CPU, or -1 (read by nvfp4cpu_pool_join_cpu) */
} nv_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
             0, 0, 0, 0, 0, 0, 0, 0, -1, NULL, -1};

static pthread_once_t nv_atfork_once = PTHREAD_ONCE_INIT;

static inline void nv_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static double nv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define NV_SPIN_SECONDS 2e-4 /* how long an idle worker spins before it sleeps */

/* The CPU this thread runs on now, or -1 where that cannot be asked (fast: a vDSO call). */
static int nv_current_cpu(void) {
#ifdef __linux__
    return sched_getcpu();
#else
    return -1;
#endif
}

/* Called by a worker joining a job: if it runs on the caller's CPU, move to another CPU this
 * thread may use (an affinity mask without the caller's CPU migrates it at once), then give
 * it back its own mask (a running thread stays where it is). Two system calls, only when the
 * two collide; a mask the user set is kept. Where the worker then runs is recorded in
 * join_cpu, read between the two calls (after the second the scheduler may move it again, so
 * only that moment says what this function did). */
static void nv_leave_caller_cpu(void) {
#ifdef __linux__
    const int caller = atomic_load(&nv_pool.caller_cpu);
    int now = nv_current_cpu();
    if (caller >= 0 && caller < CPU_SETSIZE && now == caller) {
        cpu_set_t mine, others;
        if (sched_getaffinity(0, sizeof mine, &mine) == 0) {
            others = mine;
            CPU_CLR(caller, &others);
            /* an empty set: nowhere else to go */
            if (CPU_COUNT(&others) > 0 && sched_setaffinity(0, sizeof others, &others) == 0) {
                now = nv_current_cpu();
                (void)sched_setaffinity(0, sizeof mine, &mine);
            }
        }
    }
    atomic_store(&nv_pool.join_cpu, now);
#endif
}

NV_API int nvfp4cpu_pool_join_cpu(void) { return atomic_load(&nv_pool.join_cpu); }

/* Claim and process items until none is left. */
static void nv_drain(nv_job *job) {
    for (;;) {
        const int64_t lo = atomic_fetch_add_explicit(&job->next, job->grain, memory_order_relaxed);
        if (lo >= job->nitems) return;
        const int64_t hi = lo + job->grain < job->nitems ? lo + job->grain : job->nitems;
        job->fn(job->ctx, lo, hi);
    }
}

static void *nv_worker(void *arg) {
    (void)arg;
    /* the generation current when this worker was created (under run_lock, before the job
     * that needed it was published): it must not miss that job however late it starts */
    unsigned seen = nv_pool.start_gen;
    for (;;) {
        unsigned g = atomic_load(&nv_pool.gen);
        if (g == seen) {
            const double t0 = nv_now();
            int spins = 0;
            while ((g = atomic_load(&nv_pool.gen)) == seen) {
                nv_relax();
                if (++spins % 64 == 0 && nv_now() - t0 > NV_SPIN_SECONDS) {
                    pthread_mutex_lock(&nv_pool.mtx);
                    nv_pool.sleepers++;
                    while ((g = atomic_load(&nv_pool.gen)) == seen)
                        pthread_cond_wait(&nv_pool.cv, &nv_pool.mtx);
                    nv_pool.sleepers--;
                    pthread_mutex_unlock(&nv_pool.mtx);
                    break;
                }
            }
        }
        seen = g;
        atomic_fetch_add(&nv_pool.active, 1);
        if (atomic_load(&nv_pool.open) && atomic_fetch_add(&nv_pool.helpers, 1) < nv_pool.max_helpers) {
            nv_leave_caller_cpu();
            nv_drain(nv_pool.job); /* valid: the caller waits while we are active */
        }
        atomic_fetch_sub(&nv_pool.active, 1);
    }
    return NULL;
}

static void nv_atfork_child(void) {
    /* the workers did not survive the fork: forget them and reset the locks */
    pthread_mutex_init(&nv_pool.run_lock, NULL);
    pthread_mutex_init(&nv_pool.mtx, NULL);
    pthread_cond_init(&nv_pool.cv, NULL);
    nv_pool.nworkers = 0;
    nv_pool.sleepers = 0;
    atomic_store(&nv_pool.open, 0);
    atomic_store(&nv_pool.active, 0);
    atomic_store(&nv_pool.helpers, 0);
}

static void nv_register_atfork(void) { pthread_atfork(NULL, NULL, nv_atfork_child); }

/* Runs fn over items [0, nitems), `grain` items per claim, on the calling thread and up to
 * nth - 1 pool workers. */
void nv_parallel(nv_task fn, void *ctx, int64_t nitems, int64_t grain, int nth) {
    if (nitems <= 0) return;
    if (grain < 1) grain = 1;
    if (nth > NV_MAX_THREADS) nth = NV_MAX_THREADS;
    if (nth <= 1 || nitems <= grain) {
        fn(ctx, 0, nitems);
        return;
    }
    pthread_once(&nv_atfork_once, nv_register_atfork);
    pthread_mutex_lock(&nv_pool.run_lock);
    nv_pool.start_gen = atomic_load(&nv_pool.gen);
    while (nv_pool.nworkers < nth - 1) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int rc = pthread_create(&th, &attr, nv_worker, NULL);
        pthread_attr_destroy(&attr);
        if (rc != 0) break; /* run with the workers we have */
        nv_pool.nworkers++;
    }
    nv_job job;
    job.fn = fn;
    job.ctx = ctx;
    job.nitems = nitems;
    job.grain = grain;
    atomic_init(&job.next, 0);
    nv_pool.job = &job;
    nv_pool.max_helpers = nth - 1;
    atomic_store(&nv_pool.caller_cpu, nv_current_cpu());
    atomic_store(&nv_pool.helpers, 0);
    atomic_store(&nv_pool.open, 1); /* publishes job and max_helpers to joining workers */
    pthread_mutex_lock(&nv_pool.mtx);
    atomic_fetch_add(&nv_pool.gen, 1u);
    const int woken = nv_pool.sleepers; /* workers this broadcast wakes */
    pthread_cond_broadcast(&nv_pool.cv);
    pthread_mutex_unlock(&nv_pool.mtx);
    if (woken) sched_yield(); /* a worker woken onto this CPU runs now and moves off it */
    nv_drain(&job);
    atomic_store(&nv_pool.open, 0);
    while (atomic_load(&nv_pool.active) != 0) nv_relax(); /* helpers still on their items */
    pthread_mutex_unlock(&nv_pool.run_lock);
}

/* Threads worth using: at most one per work item, and one alone below about 10 us of work
 * (`work` in multiply-adds or bytes), where waking workers costs more than it saves. */
#define NV_MIN_WORK_PER_THREAD (1 << 18)
/* Items per claim so that each claim is at least ~64 K units of work (a few microseconds). */
int64_t nv_grain(int64_t work_per_item) {
    const int64_t g = (int64_t)65536 / (work_per_item > 0 ? work_per_item : 1);
    return g < 1 ? 1 : g;
}

int nv_threads_for(int nth, int64_t items, int64_t work) {
    if (nth < 1) nth = 1;
    if (items < nth) nth = items < 1 ? 1 : (int)items;
    const int64_t by_work = work / NV_MIN_WORK_PER_THREAD;
    if (by_work < nth) nth = by_work < 1 ? 1 : (int)by_work;
    return nth;
}

/* --------------------------------------------------------------------------- matmul */
/* The driver of route.h (rows grouped by expert, chunks of at most mc_max rows, items
 * (chunk, tile group)); each chunk's activation panel (nvfp4cpu.h) is built once, before the
 * items run. */

void *nv_aligned_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    return p;
}

static int64_t nv_mm_row_bytes(int64_t k) { return k * (int64_t)sizeof(float); }

/* The panels of chunks [lo, hi): panel[kk][ii] = x[rows[ii]][kk]. */
static void nv_mm_fill(void *ctx, int64_t lo, int64_t hi) {
    const nv_matmul_job *j = (const nv_matmul_job *)ctx;
    const int64_t k = j->k;
    for (int64_t ci = lo; ci < hi; ci++) {
        const nv_route_chunk *cd = &j->route->chunks[ci];
        float *panel = (float *)nv_matmul_panel(j, cd);
        for (int64_t kk = 0; kk < k; kk++)
            for (int ii = 0; ii < cd->mc; ii++) panel[kk * cd->mc + ii] = j->x[cd->rows[ii] * k + kk];
    }
}

static const nv_matmul_kernel *nv_w4a16_kernel(int isa) {
    const nv_isa_kernels *kern = nv_kernels_for(isa);
    return kern ? &kern->mm : NULL;
}

/* W4A16: float32 panels, a transposition the calling thread makes alone (fill_ops 0: one
 * thread), as before the driver was shared. Made in parallel they measured 1.11x and 1.13x
 * the time at M = 128 (4096 x 4096, AVX2 and AVX-512, best of 3 on a 2-vCPU VM at load 5-8,
 * whose noise is as large): no gain shown, so the old schedule stays. */
static const nv_matmul nv_w4a16 = {nv_w4a16_kernel, NV_BLOCK, nv_mm_row_bytes, nv_mm_fill, 0, 1};

/* W4A16 y = x @ w^T: codes/scales tiled (see nvfp4cpu.h), rowg [tiles * 16], x [m][k]
 * float32 contiguous, out [m][n] float32. */
NV_API int nvfp4cpu_qmm(int isa, int nth, const uint8_t *codes, const uint8_t *scales,
                        const float *rowg, int64_t n, int64_t k, const float *x, int64_t m, float *out) {
    return nv_matmul_run(&nv_w4a16, isa, nth, codes, scales, rowg, 1, n, k, x, m, NULL, out);
}

/* MoE: weights [e] tiled matrices, rowg [e][tiles * 16], ids [m] int64 (any values). */
NV_API int nvfp4cpu_gather_qmm(int isa, int nth, const uint8_t *codes, const uint8_t *scales,
                               const float *rowg, int64_t e, int64_t n, int64_t k, const float *x,
                               int64_t m, const int64_t *ids, float *out) {
    if (!ids) return NV_EINVAL;
    return nv_matmul_run(&nv_w4a16, isa, nth, codes, scales, rowg, e, n, k, x, m, ids, out);
}

/* ------------------------------------------------------------------------ dequantize */

typedef struct {
    const nv_isa_kernels *kern;
    const uint8_t *codes, *scales;
    const float *rowg;
    int64_t n, k, tiles;
    void *out;
    int kind;
} nv_dq_job;

static void nv_dq_task(void *ctx, int64_t lo, int64_t hi) { /* global tiles [lo, hi) */
    const nv_dq_job *j = (const nv_dq_job *)ctx;
    const int64_t tcb = nv_tile_code_bytes(j->k), tsb = nv_tile_scale_bytes(j->k);
    const size_t esize = j->kind == NV_OUT_F32 ? 4 : 2;
    const int64_t per = nv_tiles(j->n);
    while (lo < hi) {
        const int64_t e = lo / per, t0 = lo % per;
        const int64_t nt = (hi - lo) < (per - t0) ? (hi - lo) : (per - t0);
        nv_weight w = {j->codes + e * per * tcb, j->scales + e * per * tsb, j->rowg + e * per * NV_TILE, j->n, j->k};
        j->kern->dequant_tiles(&w, t0, nt, (char *)j->out + (size_t)(e * j->n * j->k) * esize, j->kind);
        lo += nt;
    }
}

/* out [e][n][k] of `kind` (NV_OUT_*), exactly decoded. */
NV_API int nvfp4cpu_dequantize(int isa, int nth, const uint8_t *codes, const uint8_t *scales,
                               const float *rowg, int64_t e, int64_t n, int64_t k, int kind, void *out) {
    const nv_isa_kernels *kern = nv_kernels_for(isa);
    if (!kern || e < 1 || n < 1 || k < NV_BLOCK || k % NV_BLOCK || kind < 0 || kind > 2) return NV_EINVAL;
    nv_dq_job job = {kern, codes, scales, rowg, n, k, e * nv_tiles(n), out, kind};
    nv_parallel(nv_dq_task, &job, job.tiles, nv_grain(NV_TILE * k), nv_threads_for(nth, job.tiles, e * n * k));
    return 0;
}

/* ---------------------------------------------------------------- layout pack / unpack */

typedef struct {
    uint8_t *canon_codes, *canon_scales; /* [e][n][k/2], [e][n][k/16] */
    uint8_t *tiled_codes, *tiled_scales;
    int64_t n, k, tiles_total;
    int to_tiled;
} nv_pack_job;

static void nv_pack_task(void *ctx, int64_t lo, int64_t hi) { /* global tiles [lo, hi) */
    const nv_pack_job *j = (const nv_pack_job *)ctx;
    const int64_t half = j->k / 2, kb = j->k / NV_BLOCK, per = nv_tiles(j->n);
    for (int64_t gt = lo; gt < hi; gt++) { /* global tile index = e * per + t */
        const int64_t e = gt / per, t = gt % per;
        uint8_t *tc = j->tiled_codes + gt * half * NV_TILE;
        uint8_t *ts = j->tiled_scales + gt * kb * NV_TILE;
        for (int r = 0; r < NV_TILE; r++) {
            const int64_t row = t * NV_TILE + r;
            if (row >= j->n) { /* padding row: zero codes and scales (it decodes to 0) */
                if (j->to_tiled) {
                    for (int64_t q = 0; q < half; q++) tc[q * NV_TILE + r] = 0;
                    for (int64_t b = 0; b < kb; b++) ts[b * NV_TILE + r] = 0;
                }
                continue;
            }
            uint8_t *cc = j->canon_codes + (e * j->n + row) * half; /* canonical row */
            uint8_t *cs = j->canon_scales + (e * j->n + row) * kb;
            if (j->to_tiled) {
                for (int64_t q = 0; q < half; q++) tc[q * NV_TILE + r] = cc[q];
                for (int64_t b = 0; b < kb; b++) ts[b * NV_TILE + r] = cs[b];
            } else {
                for (int64_t q = 0; q < half; q++) cc[q] = tc[q * NV_TILE + r];
                for (int64_t b = 0; b < kb; b++) cs[b] = ts[b * NV_TILE + r];
            }
        }
    }
}

/* Canonical planes [e][n][k/2], [e][n][k/16] -> the tiled layout (padding rows zero). */
NV_API int nvfp4cpu_pack(int nth, const uint8_t *codes, const uint8_t *scales, int64_t e, int64_t n,
                         int64_t k, uint8_t *tiled_codes, uint8_t *tiled_scales) {
    if (e < 1 || n < 1 || k < NV_BLOCK || k % NV_BLOCK) return NV_EINVAL;
    nv_pack_job job = {(uint8_t *)codes, (uint8_t *)scales, tiled_codes, tiled_scales, n, k, e * nv_tiles(n), 1};
    nv_parallel(nv_pack_task, &job, job.tiles_total, nv_grain(NV_TILE * k / 2),
                nv_threads_for(nth, job.tiles_total, e * n * k / 2));
    return 0;
}

/* The inverse of nvfp4cpu_pack. */
NV_API int nvfp4cpu_unpack(int nth, const uint8_t *tiled_codes, const uint8_t *tiled_scales, int64_t e,
                           int64_t n, int64_t k, uint8_t *codes, uint8_t *scales) {
    if (e < 1 || n < 1 || k < NV_BLOCK || k % NV_BLOCK) return NV_EINVAL;
    nv_pack_job job = {codes, scales, (uint8_t *)tiled_codes, (uint8_t *)tiled_scales, n, k, e * nv_tiles(n), 0};
    nv_parallel(nv_pack_task, &job, job.tiles_total, nv_grain(NV_TILE * k / 2),
                nv_threads_for(nth, job.tiles_total, e * n * k / 2));
    return 0;
}

/* ---------------------------------------------------------- activation quantization */
/* Bit-exact with nvfp4.reference.quantize_activations: every step is one float32 operation
 * in the reference's order (this file is compiled with -ffp-contract=off, so no FMA fuses a
 * product into a sum):
 *   s = block_amax / (E2M1_MAX * g)   (the product first, then one division)
 *   s == 0 -> 1; clamp to [E4M3_MIN_SUBNORMAL, E4M3_MAX]; round to E4M3, nearest-even
 *   q = x / (e4m3(s) * g)      (the product first, then one true division)
 *   code = E2M1 nearest-even of |q|, saturating at 6; sign bit = x < 0
 * A block holding NaN or Inf gets scale byte E4M3_NAN_BYTE and zero codes (it decodes to NaN, so the
 * output rows that read it are non-finite); the other blocks of its row are unaffected. */

#define NV_E4M3_MANTISSA_BITS 3 /* the "M3" of E4M3 */

/* E4M3 round-to-nearest-even of s in [E4M3_MIN_SUBNORMAL, E4M3_MAX], exactly as
 * nvfp4.spec.e4m3_round: step = 2^(max(binade, 1 - bias) - 3), rint(s / step) * step (both
 * exact: powers of two). */
float nv_e4m3_round(float s) { /* also the FP8 activation encoder's (w4a8_fp8.c) */
    int ex;
    frexpf(s, &ex); /* s = mant * 2^ex, mant in [0.5, 1): the binade is ex - 1 */
    int binade = ex - 1;
    if (binade < 1 - nv_e4m3_bias) binade = 1 - nv_e4m3_bias;
    const float step = ldexpf(1.0f, binade - NV_E4M3_MANTISSA_BITS);
    return rintf(s / step) * step;
}

/* The byte of an exactly representable positive E4M3 value in [E4M3_MIN_SUBNORMAL,
 * E4M3_MAX]. */
uint8_t nv_e4m3_byte(float r) {
    union { float f; uint32_t u; } v = {r};
    const int unbiased = (int)((v.u >> 23) & 0xFFu) - 127; /* float32's own bias */
    if (unbiased >= 1 - nv_e4m3_bias) /* normal: exponent field unbiased + bias, top mantissa bits */
        return (uint8_t)(((unbiased + nv_e4m3_bias) << NV_E4M3_MANTISSA_BITS) |
                         ((v.u >> (23 - NV_E4M3_MANTISSA_BITS)) & ((1u << NV_E4M3_MANTISSA_BITS) - 1u)));
    return (uint8_t)(r / nv_e4m3_min_sub); /* subnormal: r = m * min_sub, m = 1..7 (exact) */
}

/* E2M1 code of q, as nvfp4.reference.e2m1_encode: the number of midpoints strictly below
 * |q| (searchsorted 'left'), +1 at the three midpoints whose even neighbour is above;
 * NaN sorts after every midpoint (numpy's order), so it gets 7. */
static uint8_t nv_e2m1_code(float q, int negative) {
    const float mag = fabsf(q);
    unsigned idx = 0;
    if (mag != mag) {
        idx = 7;
    } else {
        for (int i = 0; i < 7; i++) idx += nv_e2m1_bounds[i] < mag;
        for (int i = 0; i < 3; i++) idx += mag == nv_e2m1_odd[i];
    }
    return (uint8_t)(idx | (negative ? 8u : 0u));
}

typedef struct {
    const float *x;
    int64_t m, k;
    float g;
    uint8_t *codes, *scales;
} nv_qa_job;

static void nv_qa_task(void *ctx, int64_t lo, int64_t hi) { /* rows [lo, hi) */
    const nv_qa_job *j = (const nv_qa_job *)ctx;
    const float g = j->g;
    const float denom = nv_e2m1_max * g;   /* E2M1_MAX * global, float32 */
    const float smin = nv_e4m3_min_sub, smax = nv_e4m3_max;
    for (int64_t r = lo; r < hi; r++) {
        for (int64_t b = 0; b < j->k / NV_BLOCK; b++) {
            const float *xb = j->x + r * j->k + b * NV_BLOCK;
            uint8_t *cb = j->codes + r * (j->k / 2) + b * (NV_BLOCK / 2);
            float clean[NV_BLOCK];
            float amax = 0.0f;
            int bad = 0;
            for (int i = 0; i < NV_BLOCK; i++) {
                const float v = xb[i];
                const int finite = isfinite(v);
                bad |= !finite;
                clean[i] = finite ? v : 0.0f; /* the reference quantizes where(finite, x, 0) */
                const float a = fabsf(clean[i]);
                if (a > amax) amax = a;
            }
            if (bad) {
                j->scales[r * (j->k / NV_BLOCK) + b] = nv_e4m3_nan; /* the block decodes to NaN */
                memset(cb, 0, NV_BLOCK / 2);
                continue;
            }
            float s = amax / denom;
            if (s == 0.0f) s = 1.0f;
            if (s < smin) s = smin;
            if (s > smax) s = smax; /* also catches +inf */
            const float sr = nv_e4m3_round(s);
            j->scales[r * (j->k / NV_BLOCK) + b] = nv_e4m3_byte(sr);
            const float d = sr * g; /* e4m3(s) * global, float32, then one division */
            for (int i = 0; i < NV_BLOCK; i += 2) {
                const uint8_t lo4 = nv_e2m1_code(clean[i] / d, clean[i] < 0.0f);
                const uint8_t hi4 = nv_e2m1_code(clean[i + 1] / d, clean[i + 1] < 0.0f);
                cb[i / 2] = (uint8_t)(lo4 | (hi4 << 4));
            }
        }
    }
}

/* Activations x [m][k] float32 -> canonical codes [m][k/2], scales [m][k/16] with the
 * decode global g (finite, > 0; the caller computes it). */
NV_API int nvfp4cpu_quantize_activations(int nth, const float *x, int64_t m, int64_t k, float g,
                                         uint8_t *codes, uint8_t *scales) {
    if (!nv_initialised || m < 0 || k < NV_BLOCK || k % NV_BLOCK || !(g > 0.0f) || !isfinite(g))
        return NV_EINVAL;
    nv_qa_job job = {x, m, k, g, codes, scales};
    nv_parallel(nv_qa_task, &job, m, nv_grain(k), nv_threads_for(nth, m, 16 * m * k)); /* ~16 ops/element */
    return 0;
}

/* max |x| over the finite values (0 when none): the dynamic activation amax. */
NV_API float nvfp4cpu_finite_absmax(const float *x, int64_t count) {
    float amax = 0.0f;
    for (int64_t i = 0; i < count; i++) {
        const float a = fabsf(x[i]);
        if (isfinite(a) && a > amax) amax = a;
    }
    return amax;
}
