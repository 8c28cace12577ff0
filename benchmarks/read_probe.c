/* A STREAM-style read-bandwidth probe for the CPU benchmark (not part of any package).
 *
 * read_probe(buf, bytes, nth) reads every whole MiB of buf with nth POSIX threads, each
 * summing a contiguous share of the MiBs as 64-bit words, and returns the sum so the
 * reads cannot be optimised away; the caller times the call. Compiled once per ISA level
 * with that level's flags (benchmarks/read_probe.py): the inner loop keeps eight
 * independent sums, which the compiler turns into one vector load and add per 64 bytes at
 * the widest vector width the flags allow. */
#include <pthread.h>
#include <stdint.h>

#define MIB_WORDS ((int64_t)1 << 17) /* 64-bit words per MiB */
#define MAX_THREADS 256

typedef struct {
    const uint64_t *p;
    int64_t words;
    uint64_t sum;
} share;

static uint64_t sum_words(const uint64_t *p, int64_t words) {
    uint64_t a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= words; i += 8)
        for (int q = 0; q < 8; q++) a[q] += p[i + q];
    for (; i < words; i++) a[0] += p[i];
    return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

static void *run_share(void *arg) {
    share *s = (share *)arg;
    s->sum = sum_words(s->p, s->words);
    return 0;
}

uint64_t read_probe(const void *buf, int64_t bytes, int nth) {
    if (bytes < 0 || nth < 1) return 0;
    if (nth > MAX_THREADS) nth = MAX_THREADS;
    const int64_t mibs = bytes >> 20;
    share shares[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    uint64_t total = 0;
    for (int t = 0; t < nth; t++) { /* MiBs [mibs * t / nth, mibs * (t + 1) / nth) */
        const int64_t lo = mibs * t / nth, hi = mibs * (t + 1) / nth;
        shares[t].p = (const uint64_t *)buf + lo * MIB_WORDS;
        shares[t].words = (hi - lo) * MIB_WORDS;
        shares[t].sum = 0;
    }
    for (int t = 1; t < nth; t++) pthread_create(&tid[t], 0, run_share, &shares[t]);
    run_share(&shares[0]);
    for (int t = 1; t < nth; t++) pthread_join(tid[t], 0);
    for (int t = 0; t < nth; t++) total += shares[t].sum;
    return total;
}
