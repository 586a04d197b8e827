/* trunk.h - the dense trunk in memory: a pinned set plus streaming slots.
 *
 * The big trunk tensors are grouped in units (model.h: one layer's attention,
 * one layer's FFN) and the lm head is cut into row chunks of at most one slot.
 * The forward walks the same units in the same order every pass, so plain LRU
 * would hit 0 %: a PREFIX of that order is pinned (read once at start), the
 * rest streams through n_slots >= 2 slots filled by a reader thread that runs
 * ahead of the compute; a slot is refilled only after its unit was released,
 * so a slot in use is never overwritten. Reads use O_DIRECT into aligned
 * buffers (buffered where the file system refuses it, warned once), tensor by
 * tensor. Embedding rows are read on demand; nothing of [vocab, E] is resident
 * unless the lm head is pinned. Acquire order must follow the walk order: a
 * mismatch is reported as an error, never a wrong weight. A pass (trunk_pass)
 * that fails half way is abandoned and the next one starts clean. */
#ifndef K3_TRUNK_H
#define K3_TRUNK_H

#include "coordinator/model.h"

typedef struct trunk trunk;

typedef struct {
    int n_pinned_units;      /* prefix of the walk order held resident (units, then lm chunks) */
    int n_slots;             /* streaming slots (>= 2 unless everything is pinned) */
    size_t lm_chunk_rows;    /* rows of the lm head per chunk */
    int read_threads;        /* streamed units' reads in flight (common/direct_read dr_pool: every matrix of a unit
                              * submitted at once, each cut in 4 MiB pieces); 0: one pread at a time. The
                              * pinned units' load reads as without it (two readers, one pread each). */
    int map_pinned;          /* the pinned units' matrices are the checkpoint's own pages (checkpoint_data: a
                              * read-only shared mapping of each shard), not copies: nothing is read into fresh
                              * memory, and a repeated run finds them in the page cache. Their values are still
                              * checked finite at load (a pass that also faults the pages in); no NUMA placement;
                              * the files must not change while the run maps them. */
} trunk_config;

/* NUMA (coordinator/numa_place.h): called before a matrix of `rows` rows is read
 * into a buffer at data (refill: a streaming slot's pages were used before). */
typedef void (*trunk_place_fn)(void *ctx, uint8_t *data, size_t rows, size_t row_bytes, int refill);

/* Bytes of one streaming slot for the given lm chunk size (max over units). */
uint64_t trunk_slot_bytes(const k3_model *m, size_t lm_chunk_rows);
/* Number of walk units (layer parts + lm chunks) for an lm chunk size. */
int trunk_walk_units(const k3_model *m, size_t lm_chunk_rows);
/* Bytes of walk unit i (for planning the pinned prefix). */
uint64_t trunk_walk_unit_bytes(const k3_model *m, size_t lm_chunk_rows, int i);

trunk *trunk_create(k3_model *m, const trunk_config *tc, k3_error *err);
/* trunk_create, with place() called before every read of a matrix (NULL: none). */
trunk *trunk_create_placed(k3_model *m, const trunk_config *tc, trunk_place_fn place, void *place_ctx, k3_error *err);
void trunk_free(trunk *t);

/* One pass over the walk (one forward call). Layer code gets each matrix from the
 * pass by its place in the walk (dense_weight.unit/.slot, set once by
 * trunk_create): the pass releases the unit it holds when a matrix of the next
 * unit is asked for, and a matrix that is not in the next unit is an
 * out-of-order error, never a wrong weight. Nothing is written into the model.
 * trunk_pass_end(p, failed): after a complete pass nothing is left to do; after
 * a failed or abandoned one the streaming reader is restarted at the start of
 * the walk, so the next pass starts clean. */
typedef struct {
    trunk *t;
    int cur;                                   /* walk unit held now, -1 none */
    int next;                                  /* next layer unit of the walk */
    const void *data[UNIT_MAX_TENSORS];        /* data of the held unit's matrices */
} trunk_pass;

void trunk_pass_begin(trunk *t, trunk_pass *p);
void trunk_pass_end(trunk_pass *p, int failed);
/* view = w with its data readable (valid until the unit is released). */
int trunk_get(trunk_pass *p, const dense_weight *w, dense_weight *view, k3_error *err);
/* trunk_get, then matmul_dense. */
int trunk_matmul(trunk_pass *p, const kernels *k, const dense_weight *w, const float *x, size_t ntok, float *y,
                 k3_error *err);
/* trunk_matmul of w[i] by x[i] into y[i] for i < n, in walk order (no y[i] may be an
 * x[j], j > i): each run of consecutive weights in one unit is ONE parallel region
 * (matmul_dense_many), the same bits as n trunk_matmul calls. */
int trunk_matmul_many(trunk_pass *p, const kernels *k, const dense_weight *const *w, const float *const *x,
                      size_t ntok, float *const *y, size_t n, k3_error *err);
/* Releases the unit held, if any (end of a layer part). */
void trunk_release_current(trunk_pass *p);
/* lm head: number of chunks, and chunk c as a dense weight over rows [row0, row0+rows). */
int trunk_lm_chunks(const trunk *t);
size_t trunk_lm_chunk_rows(const trunk *t);
int trunk_acquire_lm(trunk_pass *p, int c, dense_weight *w, size_t *row0, k3_error *err);
void trunk_release_lm(trunk_pass *p, int c);
/* Embedding row of a token as floats (read from the shard). */
int trunk_embed_row(trunk *t, int32_t token, float *out, k3_error *err);
/* A hint before trunk_embed_row of n tokens: their rows' reads start now, all at once (a
 * prompt chunk's cold rows then cost about one read's latency instead of n in a row). */
void trunk_embed_prefetch(trunk *t, const int32_t *tokens, size_t n);

typedef struct {
    uint64_t pinned_bytes, slot_bytes, bytes_streamed, units_streamed;
    int n_slots, n_pinned, n_walk, direct_io, read_threads;
    double wait_s;           /* the compute's waits for the reader (a streamed unit not read yet) */
} trunk_stats;
trunk_stats trunk_get_stats(trunk *t);

#endif
