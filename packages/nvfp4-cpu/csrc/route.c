/* The matmul drivers' work plan (see route.h). Plain C, baseline target. */
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "route.h"

void nv_route_free(nv_route *r) {
    free(r->order);
    free(r->act_expert); /* act_chunk0 and act_item0 live in the same allocation */
    free(r->chunks);
    memset(r, 0, sizeof(*r));
}

int nv_route_plan(nv_route *r, const int64_t *ids, int64_t m, int64_t e, int64_t n,
                  int64_t mc_max, float *out) {
    memset(r, 0, sizeof(*r));
    r->tiles = nv_tiles(n);
    r->group = nv_plan_now().group;
    r->groups = (r->tiles + r->group - 1) / r->group;
    /* count[i + 1] = rows of expert i, then prefix sums: count[i] = expert i's first slot */
    int64_t *count = (int64_t *)calloc((size_t)(e + 1), sizeof(int64_t));
    r->order = (int64_t *)malloc((size_t)(m ? m : 1) * sizeof(int64_t));
    if (!count || !r->order) goto oom;
    for (int64_t row = 0; row < m; row++) {
        const int64_t id = ids ? ids[row] : 0;
        if (id >= 0 && id < e) { count[id + 1]++; r->valid++; }
        else memset(out + row * n, 0, (size_t)n * sizeof(float)); /* out-of-range id: zero row */
    }
    for (int64_t i = 0; i < e; i++) count[i + 1] += count[i];
    for (int64_t i = 0; i < e; i++) {
        const int64_t rows = count[i + 1] - count[i];
        if (rows) { r->nact++; r->nchunks += (rows + mc_max - 1) / mc_max; }
    }
    r->act_expert = (int64_t *)malloc((size_t)(3 * (r->nact + 1)) * sizeof(int64_t));
    r->chunks = (nv_route_chunk *)malloc((size_t)(r->nchunks + 1) * sizeof(nv_route_chunk));
    if (!r->act_expert || !r->chunks) goto oom;
    r->act_chunk0 = r->act_expert + (r->nact + 1);
    r->act_item0 = r->act_expert + 2 * (r->nact + 1);
    { /* the stable counting sort; count[i] advances to expert i's end (= count[i + 1] before) */
        for (int64_t row = 0; row < m; row++) {
            const int64_t id = ids ? ids[row] : 0;
            if (id >= 0 && id < e) r->order[count[id]++] = row;
        }
    }
    int64_t a = 0, ci = 0, item = 0, first = 0;
    for (int64_t i = 0; i < e; i++) {
        const int64_t rows = count[i] - first; /* count[i] is now expert i's end */
        if (rows) {
            const int64_t nch = (rows + mc_max - 1) / mc_max;
            r->act_expert[a] = i;
            r->act_chunk0[a] = ci;
            r->act_item0[a] = item;
            int64_t slot = first; /* balanced chunks: the first rows % nch get one row more */
            for (int64_t q = 0; q < nch; q++) {
                const int mc = (int)(rows / nch + (q < rows % nch ? 1 : 0));
                r->chunks[ci].rows = r->order + slot;
                r->chunks[ci].first = slot;
                r->chunks[ci].mc = mc;
                slot += mc;
                ci++;
            }
            item += r->groups * nch;
            a++;
        }
        first = count[i];
    }
    r->act_chunk0[r->nact] = ci;
    r->act_item0[r->nact] = item;
    r->items = item;
    free(count);
    return 0;
oom:
    free(count);
    nv_route_free(r);
    return NV_ENOMEM;
}

typedef struct {
    const nv_route *r;
    const uint8_t *codes, *scales;
    const float *rowg;
    int64_t n, k;
    nv_route_fn fn;
    const void *ctx;
} nv_route_job;

/* Items [lo, hi): item -> (active expert a, its tile group, its chunk). */
static void nv_route_task(void *ctx, int64_t lo, int64_t hi) {
    const nv_route_job *j = (const nv_route_job *)ctx;
    const nv_route *r = j->r;
    int64_t a = 0; /* the active expert holding item lo (binary search) */
    for (int64_t l = 0, h = r->nact - 1; l <= h;) {
        const int64_t mid = (l + h) / 2;
        if (r->act_item0[mid] <= lo) { a = mid; l = mid + 1; } else { h = mid - 1; }
    }
    const int64_t tcb = nv_tile_code_bytes(j->k), tsb = nv_tile_scale_bytes(j->k);
    for (int64_t i = lo; i < hi; i++) {
        while (i >= r->act_item0[a + 1]) a++;
        const int64_t e = r->act_expert[a];
        const int64_t nch = r->act_chunk0[a + 1] - r->act_chunk0[a];
        const int64_t local = i - r->act_item0[a];
        const int64_t group = local / nch, ci = local % nch;
        nv_weight w;
        w.codes = j->codes + e * r->tiles * tcb; /* expert e's first tile */
        w.scales = j->scales + e * r->tiles * tsb;
        w.rowg = j->rowg + e * r->tiles * NV_TILE;
        w.n = j->n;
        w.k = j->k;
        const int64_t t0 = group * r->group;
        const int64_t nt = (r->tiles - t0) < r->group ? (r->tiles - t0) : r->group;
        j->fn(j->ctx, &w, t0, nt, r->act_chunk0[a] + ci);
    }
}

void nv_route_run(const nv_route *r, const uint8_t *codes, const uint8_t *scales,
                  const float *rowg, int64_t n, int64_t k, nv_route_fn fn, const void *ctx,
                  int nth, int64_t work) {
    if (!r->nact) return;
    nv_route_job job = {r, codes, scales, rowg, n, k, fn, ctx};
    nv_parallel(nv_route_task, &job, r->items, 1, nv_threads_for(nth, r->items, work));
}

/* ------------------------------------------------------------------- the matmul driver */

static void nv_matmul_item(const void *ctx, const nv_weight *w, int64_t t0, int64_t nt, int64_t ci) {
    const nv_matmul_job *j = (const nv_matmul_job *)ctx;
    const nv_route_chunk *cd = &j->route->chunks[ci];
    const nv_chunk c = {nv_matmul_panel(j, cd), cd->mc, j->out, w->n, cd->rows};
    j->kern->qmm_tiles(w, t0, nt, &c);
}

int nv_matmul_run(const nv_matmul *mm, int isa, int nth, const uint8_t *codes,
                  const uint8_t *scales, const float *rowg, int64_t e, int64_t n, int64_t k,
                  const float *x, int64_t m, const int64_t *ids, float *out) {
    const nv_matmul_kernel *kern = mm->kernel(isa);
    if (!kern || e < 1 || n < 1 || k < mm->kblock || k % mm->kblock || m < 0) return NV_EINVAL;
    if (m == 0) return 0;
    nv_route r;
    if (nv_route_plan(&r, ids, m, e, n, kern->mc_max, out)) return NV_ENOMEM;
    /* every valid row's panel bytes; chunk panels start on 4-byte boundaries (W4A8 records of
     * mc rows are 44 * mc bytes), the whole is 64-byte aligned */
    const int64_t row_bytes = mm->row_bytes(k);
    uint8_t *panels = (uint8_t *)nv_aligned_alloc((size_t)(r.valid * row_bytes));
    if (!panels) { nv_route_free(&r); return NV_ENOMEM; }
    const nv_matmul_job job = {kern, &r, panels, row_bytes, x, k, out};
    if (r.nact) {
        nv_parallel(mm->fill, (void *)&job, r.nchunks, 1,
                    nv_threads_for(nth, r.nchunks, mm->fill_ops * r.valid * k));
        /* work: multiply-adds, counting each expert's weights at least once (M = 1 streams) */
        nv_route_run(&r, codes, scales, rowg, n, k, nv_matmul_item, &job, nth,
                     (r.valid + r.nact) * r.tiles * NV_TILE * k / mm->macs_per_work);
    }
    free(panels);
    nv_route_free(&r);
    return 0;
}
