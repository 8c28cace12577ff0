/* nvfp4-cpu: the cache plan (see plan.h): cache sizes from NVFP4_CPU_CACHE, sysfs or CPUID,
 * and the blocking derived from them. Plain C, baseline target (CPUID through <cpuid.h>, which
 * needs no -m flag). */
#define _GNU_SOURCE
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "nvfp4cpu.h"
#include "plan.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

/* Used when no source answers: a common server core (32 KiB L1d, 512 KiB L2, 8 MiB L3). */
#define NV_DEFAULT_L1D (32LL << 10)
#define NV_DEFAULT_L2 (512LL << 10)
#define NV_DEFAULT_L3 (8LL << 20)

/* The sizes NVFP4_CPU_CACHE and nvfp4cpu_plan_derive accept (an L3 of 0: none). */
static const struct { const char *key; int64_t lo, hi; } nv_cache_keys[3] = {
    {"l1d", 1LL << 10, 16LL << 20},
    {"l2", 16LL << 10, 1LL << 30},
    {"l3", 0, 64LL << 30},
};

static pthread_mutex_t nv_plan_lock = PTHREAD_MUTEX_INITIALIZER;
static int nv_plan_set_once = 0;
static nv_plan nv_plan_cur;

/* ------------------------------------------------------------------------ sizes */

/* "48K", "2048K", "32M", "1G" or plain bytes -> bytes; -1 when malformed. Digits first (at
 * most 12), then at most one of K, M, G (either case), then the end of the text at `end`. */
static int64_t nv_parse_size(const char *s, const char *end) {
    int64_t v = 0;
    int digits = 0;
    while (s < end && *s >= '0' && *s <= '9') {
        if (++digits > 12) return -1;
        v = v * 10 + (*s++ - '0');
    }
    if (!digits) return -1;
    if (s < end) {
        const char u = (char)toupper((unsigned char)*s++);
        if (u == 'K') v <<= 10;
        else if (u == 'M') v <<= 20;
        else if (u == 'G') v <<= 30;
        else return -1;
    }
    return s == end ? v : -1;
}

/* Copies at most 40 characters of [s, end) into out, each non-printable one as \xNN, so an
 * error message stays one line whatever the input holds. */
static void nv_quote(char *out, size_t cap, const char *s, const char *end) {
    size_t o = 0;
    for (int n = 0; s < end && n < 40 && o + 5 < cap; s++, n++) {
        const unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c < 0x7F && c != '\'') out[o++] = (char)c;
        else o += (size_t)snprintf(out + o, cap - o, "\\x%02X", c);
    }
    if (s < end && o + 4 < cap) { memcpy(out + o, "...", 3); o += 3; }
    out[o] = 0;
}

/* NVFP4_CPU_CACHE's text: "key=size" items separated by commas, keys l1d, l2, l3 (each at
 * most once, any subset), sizes as nv_parse_size reads them and within nv_cache_keys' range.
 * The keys given replace caches[0..2] (which hold the detected sizes on entry). On a refusal
 * returns NV_EINVAL with one line in err (the item and what was expected) and changes nothing. */
NV_API int nvfp4cpu_plan_parse_cache(const char *text, int64_t *caches, char *err, int errlen) {
    char q[200];
    if (!text || !caches || !err || errlen < 1) return NV_EINVAL;
    err[0] = 0;
    int64_t v[3] = {caches[0], caches[1], caches[2]};
    int seen = 0;
    const char *s = text, *end = text + strlen(text);
    if (s == end) {
        snprintf(err, (size_t)errlen, "empty; expected items like l1d=32K,l2=512K,l3=32M");
        return NV_EINVAL;
    }
    for (;;) {
        const char *comma = memchr(s, ',', (size_t)(end - s));
        const char *ie = comma ? comma : end;
        const char *eq = memchr(s, '=', (size_t)(ie - s));
        nv_quote(q, sizeof q, s, ie);
        int key = -1;
        if (eq)
            for (int i = 0; i < 3; i++)
                if ((size_t)(eq - s) == strlen(nv_cache_keys[i].key) &&
                    memcmp(s, nv_cache_keys[i].key, (size_t)(eq - s)) == 0)
                    key = i;
        if (key < 0) {
            snprintf(err, (size_t)errlen,
                     "item '%s': expected key=size with key l1d, l2 or l3 (e.g. l2=512K)", q);
            return NV_EINVAL;
        }
        if (seen & (1 << key)) {
            snprintf(err, (size_t)errlen, "item '%s': %s given twice", q, nv_cache_keys[key].key);
            return NV_EINVAL;
        }
        seen |= 1 << key;
        const int64_t size = nv_parse_size(eq + 1, ie);
        if (size < 0) {
            snprintf(err, (size_t)errlen,
                     "item '%s': expected a size in bytes, optionally followed by K, M or G", q);
            return NV_EINVAL;
        }
        if (size < nv_cache_keys[key].lo || size > nv_cache_keys[key].hi) {
            snprintf(err, (size_t)errlen, "item '%s': %s must be %lld to %lld bytes, found %lld", q,
                     nv_cache_keys[key].key, (long long)nv_cache_keys[key].lo,
                     (long long)nv_cache_keys[key].hi, (long long)size);
            return NV_EINVAL;
        }
        v[key] = size;
        if (!comma) break;
        s = comma + 1;
    }
    memcpy(caches, v, sizeof v);
    return 0;
}

/* ---------------------------------------------------------------------- detection */

/* One line of a sysfs file into buf (newline stripped); 0 on success. */
static int nv_read_line(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    const int ok = fgets(buf, (int)cap, f) != NULL;
    fclose(f);
    if (!ok) return -1;
    buf[strcspn(buf, "\r\n")] = 0;
    return 0;
}

/* Linux sysfs: cpu0's cache/index*: level, type (Data / Instruction / Unified), size. */
static int nv_caches_sysfs(int64_t out[3]) {
    int64_t v[3] = {0, 0, 0};
    char path[128], level[16], type[32], size[32];
    for (int i = 0; i < 16; i++) {
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        if (nv_read_line(path, level, sizeof level)) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        if (nv_read_line(path, type, sizeof type)) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (nv_read_line(path, size, sizeof size)) continue;
        if (strcmp(type, "Instruction") == 0) continue;
        const int64_t bytes = nv_parse_size(size, size + strlen(size));
        if (bytes <= 0) continue;
        if (strcmp(level, "1") == 0) v[0] = bytes;
        else if (strcmp(level, "2") == 0) v[1] = bytes;
        else if (strcmp(level, "3") == 0) v[2] = bytes;
    }
    if (!v[0] || !v[1]) return -1; /* L3 may be absent */
    memcpy(out, v, sizeof v);
    return 0;
}

/* CPUID's deterministic cache parameters: leaf 4 (Intel), 0x8000001D (AMD, with TOPOEXT).
 * Subleaf i: eax[4:0] type (0 none, 1 data, 2 instruction, 3 unified), eax[7:5] level;
 * size = ways * partitions * line * sets, each field stored minus one (ebx[31:22],
 * ebx[21:12], ebx[11:0], ecx). */
static int nv_caches_cpuid(int64_t out[3]) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d, leaf = 4;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return -1;
    const int amd = b == 0x68747541u; /* "Auth"enticAMD */
    if (amd) {
        if (!__get_cpuid(0x80000000u, &a, &b, &c, &d) || a < 0x8000001Du) return -1;
        if (!__get_cpuid(0x80000001u, &a, &b, &c, &d) || !(c & (1u << 22))) return -1; /* TOPOEXT */
        leaf = 0x8000001Du;
    } else if (a < 4) {
        return -1;
    }
    int64_t v[3] = {0, 0, 0};
    for (unsigned i = 0; i < 16; i++) {
        if (!__get_cpuid_count(leaf, i, &a, &b, &c, &d)) return -1;
        const unsigned type = a & 31u, level = (a >> 5) & 7u;
        if (type == 0) break;
        if (type == 2 || level < 1 || level > 3) continue;
        const int64_t bytes = (int64_t)((b >> 22) + 1) * (((b >> 12) & 0x3FFu) + 1) *
                              ((b & 0xFFFu) + 1) * ((int64_t)c + 1);
        v[level - 1] = bytes;
    }
    if (!v[0] || !v[1]) return -1;
    memcpy(out, v, sizeof v);
    return 0;
#else
    (void)out;
    return -1;
#endif
}

/* This machine's caches into out[3]; returns the source (NV_CACHE_SYSFS, _CPUID or
 * _DEFAULT). */
NV_API int nvfp4cpu_plan_detect(int64_t *out) {
    if (!out) return NV_EINVAL;
    if (nv_caches_sysfs(out) == 0) return NV_CACHE_SYSFS;
    if (nv_caches_cpuid(out) == 0) return NV_CACHE_CPUID;
    out[0] = NV_DEFAULT_L1D;
    out[1] = NV_DEFAULT_L2;
    out[2] = NV_DEFAULT_L3;
    return NV_CACHE_DEFAULT;
}

/* ------------------------------------------------------------------------ the plan */

/* The plan of plan.h from caches[3] into plan[3] = {kc, kp, group}; NV_EINVAL when a size is
 * outside the range NVFP4_CPU_CACHE accepts. */
NV_API int nvfp4cpu_plan_derive(const int64_t *caches, int64_t *plan) {
    if (!caches || !plan) return NV_EINVAL;
    for (int i = 0; i < 3; i++)
        if (caches[i] < nv_cache_keys[i].lo || caches[i] > nv_cache_keys[i].hi) return NV_EINVAL;
    const int64_t l1d = caches[0], l2 = caches[1];
    /* the activation slab, kc * 32 rows * 4 bytes, at most a quarter of L2 */
    int64_t kc = l2 / (4 * NV_MC_LIMIT * 4) / NV_PLAN_KC_STEP * NV_PLAN_KC_STEP;
    if (kc < NV_PLAN_KC_MIN) kc = NV_PLAN_KC_MIN;
    if (kc > NV_PLAN_KC_MAX) kc = NV_PLAN_KC_MAX;
    plan[0] = kc;
    plan[1] = l1d >= (16 << 10) ? 32 : 16;
    /* 8 tiles' codes for one slab (kc / 2 bytes per row, 128 rows) + the activation slab */
    plan[2] = (8 * NV_TILE * (kc / 2) + kc * NV_MC_LIMIT * 4) <= l2 / 2 ? 8 : 4;
    return 0;
}

static int nv_plan_valid(const int64_t *plan) {
    const int64_t kc = plan[0];
    if (kc != 0 && (kc < NV_PLAN_KC_MIN || kc > NV_PLAN_KC_MAX || kc % NV_PLAN_KC_STEP)) return 0;
    if (plan[1] != 16 && plan[1] != 32) return 0;
    return plan[2] == 4 || plan[2] == 8;
}

/* Puts a plan in effect for every later call: the caches it was derived from (for the
 * record), their source (NV_CACHE_*), and plan[3] = {kc (0: whole K, or a multiple of 256 in
 * [256, 16384]), kp (16 or 32), group (4 or 8)}; NV_EINVAL (nothing changed) otherwise. */
NV_API int nvfp4cpu_plan_set(const int64_t *caches, int source, const int64_t *plan) {
    if (!caches || !plan || source < NV_CACHE_DEFAULT || source > NV_CACHE_GIVEN) return NV_EINVAL;
    for (int i = 0; i < 3; i++)
        if (caches[i] < nv_cache_keys[i].lo || caches[i] > nv_cache_keys[i].hi) return NV_EINVAL;
    if (!nv_plan_valid(plan)) return NV_EINVAL;
    pthread_mutex_lock(&nv_plan_lock);
    nv_plan_cur = (nv_plan){caches[0], caches[1], caches[2], source, plan[0], (int)plan[1],
                            (int)plan[2]};
    nv_plan_set_once = 1;
    pthread_mutex_unlock(&nv_plan_lock);
    return 0;
}

nv_plan nv_plan_now(void) {
    pthread_mutex_lock(&nv_plan_lock);
    if (!nv_plan_set_once) { /* nobody set one: this machine's caches and their plan */
        int64_t c[3], p[3];
        const int source = nvfp4cpu_plan_detect(c);
        if (nvfp4cpu_plan_derive(c, p) != 0) { /* a size outside the accepted range */
            c[0] = NV_DEFAULT_L1D, c[1] = NV_DEFAULT_L2, c[2] = NV_DEFAULT_L3;
            nvfp4cpu_plan_derive(c, p);
        }
        nv_plan_cur = (nv_plan){c[0], c[1], c[2], source, p[0], (int)p[1], (int)p[2]};
        nv_plan_set_once = 1;
    }
    const nv_plan p = nv_plan_cur;
    pthread_mutex_unlock(&nv_plan_lock);
    return p;
}

/* The plan in effect: out[7] = {l1d, l2, l3, source, kc, kp, group}. */
NV_API int nvfp4cpu_plan_get(int64_t *out) {
    if (!out) return NV_EINVAL;
    const nv_plan p = nv_plan_now();
    const int64_t v[7] = {p.l1d, p.l2, p.l3, p.source, p.kc, p.kp, p.group};
    memcpy(out, v, sizeof v);
    return 0;
}
