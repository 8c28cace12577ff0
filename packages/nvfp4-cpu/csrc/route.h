/* The work plan of a matmul, and the driver that runs it, shared by the W4A16 (api.c) and
 * W4A8 (w4a8_api.c) matmuls, with one matrix or a stack of experts.
 *
 * The rows of x whose expert id is in [0, E) are grouped by expert (a stable counting sort:
 * within an expert the rows keep their order), and each expert's rows are cut into balanced
 * chunks of at most mc_max rows (the first rows % nch chunks get one row more). A work item
 * is (chunk, group of tiles of that expert's matrix: the plan's `group`, 4 or 8, plan.h). Items are numbered expert by
 * expert, tile group by tile group, and inside a tile group chunk by chunk, so a thread's
 * contiguous range of items streams its tiles once and reuses each from cache for every
 * chunk of rows. The plan depends on the ids, mc_max and the cache plan alone, never on the
 * thread count (and no item split changes a result: each output is one tile's, summed whole).
 *
 * Each chunk's rows are consecutive in `order`, so a driver that gives every row the same
 * number of panel bytes places chunk c's panel at (c's first slot in `order`) * bytes per row.
 */
#ifndef NVFP4CPU_ROUTE_H
#define NVFP4CPU_ROUTE_H

#include "nvfp4cpu.h"


typedef struct {
    const int64_t *rows; /* the chunk's row indices of x (= of out): a slice of order */
    int64_t first;       /* rows - order: the chunk's first slot in order */
    int mc;              /* rows in the chunk, 1 .. mc_max */
} nv_route_chunk;

typedef struct {
    int64_t valid;          /* rows whose id is in [0, E) */
    int64_t nact;           /* experts that have rows */
    int64_t nchunks;        /* chunks over all experts */
    int64_t items;          /* work items over all experts */
    int64_t tiles, groups;  /* tiles per matrix, and groups of `group` of them */
    int64_t group;          /* tiles per work item (the cache plan's, plan.h) */
    int64_t *order;         /* [m]: the valid rows, stable-sorted by expert */
    int64_t *act_expert;    /* [nact]: the active experts, increasing */
    int64_t *act_chunk0;    /* [nact + 1]: each one's first chunk */
    int64_t *act_item0;     /* [nact + 1]: each one's first item */
    nv_route_chunk *chunks; /* [nchunks] */
} nv_route;

/* Plans the rows of x [m] with expert ids (NULL: one matrix, every row valid) over e
 * matrices of n rows. A row whose id is outside [0, e) gets out[r][0 .. n) = 0 here, and no
 * chunk. Returns 0, or NV_ENOMEM with nothing left allocated. */
int nv_route_plan(nv_route *r, const int64_t *ids, int64_t m, int64_t e, int64_t n,
                  int64_t mc_max, float *out);
void nv_route_free(nv_route *r);

/* One work item: the tiles [t0, t0 + nt) of expert `expert`'s matrix w, times chunk `chunk`. */
typedef void (*nv_route_fn)(const void *ctx, const nv_weight *w, int64_t t0, int64_t nt,
                            int64_t chunk);

/* Runs every item of plan r on nth threads (nv_parallel): w's codes, scales and row globals
 * are those of the whole stack, tiled as in nvfp4cpu.h; work estimates the multiply-adds. */
void nv_route_run(const nv_route *r, const uint8_t *codes, const uint8_t *scales,
                  const float *rowg, int64_t n, int64_t k, nv_route_fn fn, const void *ctx,
                  int nth, int64_t work);

/* ------------------------------------------------------------------- the matmul driver
 * What a matmul (W4A16 or W4A8) gives the driver: its level's kernel, the block K must be a
 * multiple of, and how its activation panels are made. The driver checks the dimensions,
 * plans the rows, makes every chunk's panel (in parallel over chunks; rows of out-of-range
 * ids are never read), runs the items and frees what it allocated. */
typedef struct {
    const nv_matmul_kernel *(*kernel)(int isa); /* the level's kernel, NULL where it cannot run */
    int64_t kblock;                  /* K: a positive multiple of it */
    int64_t (*row_bytes)(int64_t k); /* panel bytes of one row of x (the same for every row) */
    nv_task fill;                    /* makes the panels of chunks [lo, hi); ctx: nv_matmul_job */
    int64_t fill_ops;                /* operations per element of x that `fill` costs (0: the
                                        calling thread makes every panel) */
    int64_t macs_per_work;           /* multiply-adds per unit of work: 1, 2 where they cost half */
} nv_matmul;

/* One call's state, the ctx of `fill`. */
typedef struct {
    const nv_matmul_kernel *kern; /* the first member of the level's table (nv_w4a8_kernels) */
    const nv_route *route;
    uint8_t *panels; /* chunk c's panel at panels + c.first * row_bytes */
    int64_t row_bytes;
    const float *x;  /* [m][k] float32 */
    int64_t k;
    float *out;      /* [m][n] float32 */
} nv_matmul_job;

/* Chunk cd's panel (its rows are consecutive in the plan's order, every row the same bytes). */
NV_INLINE uint8_t *nv_matmul_panel(const nv_matmul_job *j, const nv_route_chunk *cd) {
    return j->panels + cd->first * j->row_bytes;
}

/* out[m][n] = matmul mm at level isa of row m of x [m][k] with expert ids[m] of the stack
 * (ids NULL: one matrix), rows of ids outside [0, e) exactly 0; codes, scales and row globals
 * tiled as in nvfp4cpu.h. Returns 0, NV_EINVAL or NV_ENOMEM. */
int nv_matmul_run(const nv_matmul *mm, int isa, int nth, const uint8_t *codes,
                  const uint8_t *scales, const float *rowg, int64_t e, int64_t n, int64_t k,
                  const float *x, int64_t m, const int64_t *ids, float *out);

#endif /* NVFP4CPU_ROUTE_H */
