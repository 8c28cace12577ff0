/* A STREAM-style read-bandwidth probe for the CPU benchmark (not part of any package).
 *
 * read_probe(buf, bytes, nth) reads every whole MiB of buf with nth POSIX threads and returns
 * the sum of its 64-bit words, so the reads cannot be optimised away; the caller times the
 * call. Compiled once per ISA level with that level's flags (benchmarks/read_probe.py): the
 * inner loop keeps eight independent sums, which the compiler turns into one vector load and
 * add per 64 bytes at the widest vector width the flags allow.
 *
 * The threads claim the MiBs one at a time from a shared counter, as nvfp4-cpu's pool hands
 * out its work items, instead of each reading a fixed share. On a shared VM one vCPU can run
 * at half speed for milliseconds; with fixed shares the call then waits for the slow half and
 * measures that vCPU, not the memory. On a 2-vCPU Xeon (Emerald Rapids), four passes of 34
 * calls alternated with the cold GEMV (AVX-512, 14336 x 8192): fixed shares read 16-27 GB/s
 * (median per pass), claimed MiBs 26-27 GB/s, the GEMV 23-24 GB/s of the same memory. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define MIB_WORDS ((int64_t)1 << 17) /* 64-bit words per MiB */
#define MAX_THREADS 256

typedef struct {
    const uint64_t *p;
    int64_t mibs;
    atomic_llong next; /* the first MiB not yet claimed */
} job;

typedef struct {
    job *j;
    uint64_t sum;
} share;

static uint64_t sum_words(const uint64_t *p, int64_t words) {
    uint64_t a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t i = 0; i + 8 <= words; i += 8)
        for (int q = 0; q < 8; q++) a[q] += p[i + q];
    return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

static void *run_share(void *arg) {
    share *s = (share *)arg;
    for (;;) {
        const int64_t mib = atomic_fetch_add(&s->j->next, 1);
        if (mib >= s->j->mibs) return 0;
        s->sum += sum_words(s->j->p + mib * MIB_WORDS, MIB_WORDS);
    }
}

uint64_t read_probe(const void *buf, int64_t bytes, int nth) {
    if (bytes < 0 || nth < 1) return 0;
    if (nth > MAX_THREADS) nth = MAX_THREADS;
    job j;
    j.p = (const uint64_t *)buf;
    j.mibs = bytes >> 20;
    atomic_init(&j.next, 0);
    share shares[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    uint64_t total = 0;
    for (int t = 0; t < nth; t++) {
        shares[t].j = &j;
        shares[t].sum = 0;
    }
    int started = 1; /* threads 1 .. started - 1 run (the caller drains whatever is left) */
    while (started < nth && pthread_create(&tid[started], 0, run_share, &shares[started]) == 0)
        started++;
    run_share(&shares[0]);
    for (int t = 1; t < started; t++) pthread_join(tid[t], 0);
    for (int t = 0; t < nth; t++) total += shares[t].sum;
    return total;
}
