/* trunk.c - pinned prefix + streaming slots for the dense trunk (see trunk.h). */
#define _GNU_SOURCE
#include "coordinator/trunk.h"
#include "common/direct_read.h"
#include "common/mono_clock.h"
#include "common/weight_mem.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define IO_ALIGN DIRECT_ALIGN
#define ROUND_UP(x) (((x) + IO_ALIGN - 1) / IO_ALIGN * IO_ALIGN)

/* bytes a tensor (or part of one) of n bytes needs in a buffer: room for the aligned window */
static uint64_t region_bytes(uint64_t n) { return ROUND_UP(n + 2 * IO_ALIGN); }

typedef struct {
    uint8_t *buf;
    const void *data[UNIT_MAX_TENSORS];
} unit_buffer;

struct trunk {
    k3_model *m;
    int n_layer_units, n_lm, n_walk, n_pinned, n_slots;
    size_t lm_rows;
    uint64_t slot_bytes, pinned_bytes;
    unit_buffer *pinned;      /* [n_pinned] */
    unit_buffer *slots;       /* [n_slots] */
    int *direct_fd;           /* per shard: -1 unopened, -2 refused */
    int direct_ok, warned;
    unsigned char *checked;   /* per walk unit: its values were found finite (first read) */
    /* streaming state */
    pthread_t reader;
    int reader_running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t filled, consumed, released, bytes_streamed;
    int stop, reader_failed;
    k3_error reader_err;
    double wait_s;            /* compute waiting for the reader */
    dr_pool *pool;            /* reads in flight (NULL: none started) */
    int mapped;               /* the pinned units are the checkpoint's mapped pages (trunk_config.map_pinned) */
    trunk_place_fn place;     /* NUMA placement of each matrix's rows before it is read (NULL: none) */
    void *place_ctx;
};

int trunk_walk_units(const k3_model *m, size_t lm_rows) {
    size_t V = (size_t)m->cfg.vocab_size;
    return m->n_units + (int)((V + lm_rows - 1) / lm_rows);
}

static size_t lm_elsize(const k3_model *m) { return m->lm_head.dtype == DTYPE_F32 ? 4 : 2; }

/* lm chunk c (walk unit n_units + c): its first row (*r0) and its rows (the last chunk may be short) */
static size_t lm_chunk_span(const trunk *t, int c, size_t *r0) {
    size_t V = (size_t)t->m->cfg.vocab_size;
    *r0 = (size_t)c * t->lm_rows;
    return V - *r0 < t->lm_rows ? V - *r0 : t->lm_rows;
}

/* Buffer bytes walk unit i needs (tensor regions with alignment room). */
static uint64_t walk_buffer_bytes(const k3_model *m, size_t lm_rows, int i) {
    if (i < m->n_units) {
        uint64_t b = 0;
        for (int j = 0; j < m->units[i].n; j++) b += region_bytes(m->units[i].e[j]->t->end - m->units[i].e[j]->t->begin);
        return b;
    }
    size_t V = (size_t)m->cfg.vocab_size, c = (size_t)(i - m->n_units), r0 = c * lm_rows;
    size_t rows = V - r0 < lm_rows ? V - r0 : lm_rows;
    return region_bytes((uint64_t)rows * (uint64_t)m->cfg.hidden_size * lm_elsize(m));
}

uint64_t trunk_walk_unit_bytes(const k3_model *m, size_t lm_rows, int i) { return walk_buffer_bytes(m, lm_rows, i); }

uint64_t trunk_slot_bytes(const k3_model *m, size_t lm_rows) {
    uint64_t mx = 0;
    int n = trunk_walk_units(m, lm_rows);
    for (int i = 0; i < n; i++) {
        uint64_t b = walk_buffer_bytes(m, lm_rows, i);
        if (b > mx) mx = b;
    }
    return mx;
}

static int direct_fd(trunk *t, int shard) {
    if (t->direct_fd[shard] == -1) {
        int fd = direct_open(t->m->ck.shards[shard].file.path);
        t->direct_fd[shard] = fd >= 0 ? fd : -2;
    }
    return t->direct_fd[shard];
}

/* Reads bytes [off, off+len) of tensor e into region dst; *data gets where they start
 * (common/direct_read: O_DIRECT window, or buffered when the filesystem refuses it). */
static int read_region(trunk *t, const ckpt_entry *e, uint64_t off, uint64_t len, uint8_t *dst, const void **data,
                       k3_error *err) {
    checkpoint *ck = &t->m->ck;
    const char *path = ck->shards[e->shard].file.path;
    int dfd = t->direct_ok ? t->direct_fd[e->shard] : -1, refused = 0, rc = -1;
    char what[300];
    snprintf(what, sizeof what, "tensor '%s'", e->name);
    const uint8_t *d;
    if (dfd >= 0) rc = direct_read(path, dfd, -1, e->t->begin + off, len, dst, &d, &refused, what, err);
    if (dfd < 0 || refused) { /* buffered: no O_DIRECT for this file, or its alignment was refused */
        int bfd;
#pragma omp critical(k3_trunk_buffered_read) /* checkpoint_shard_fd opens shards lazily: one at a time */
        bfd = checkpoint_shard_fd(ck, e->shard, err);
        if (bfd < 0) return -1;
        rc = direct_read(path, -1, bfd, e->t->begin + off, len, dst, &d, NULL, what, err);
    }
    if (rc) return -1;
    *data = d;
    return 0;
}

/* Refuses a NaN or Inf among the n values at p (element first + i of tensor e). */
static int check_finite(const trunk *t, const ckpt_entry *e, const void *p, size_t n, size_t first, k3_error *err) {
    size_t i = floats_first_nonfinite(p, e->t->dtype, n);
    if (i == n) return 0;
    return k3_fail(err, "tensor '%s' (%s): element %zu is not finite: refusing non-finite weights", e->name,
                   t->m->ck.shards[e->shard].file.path, first + i);
}

/* A region read through the pool (several reads in flight): pooled_submit starts bytes
 * [off, off+len) of tensor e into dst when there is a pool and the shard reads O_DIRECT
 * (else it leaves rd->buf NULL); pooled_finish waits for it, and reads through read_region
 * what was not submitted or whose alignment the kernel refused. rd and its `what` stay
 * untouched between the two. */
typedef struct {
    dr_read rd;
    char what[300];
} pooled_read;

static void pooled_submit(trunk *t, const ckpt_entry *e, uint64_t off, uint64_t len, uint8_t *dst, pooled_read *pr) {
    int dfd = t->direct_ok ? t->direct_fd[e->shard] : -1;
    pr->rd.buf = NULL;
    if (!t->pool || dfd < 0) return;
    snprintf(pr->what, sizeof pr->what, "tensor '%s'", e->name);
    pr->rd = (dr_read){.path = t->m->ck.shards[e->shard].file.path, .dfd = dfd, .bfd = -1, .off = e->t->begin + off,
                       .len = len, .buf = dst, .what = pr->what};
    dr_submit(t->pool, &pr->rd, 0);
}

static int pooled_finish(trunk *t, const ckpt_entry *e, uint64_t off, uint64_t len, uint8_t *dst, pooled_read *pr,
                         const void **data, k3_error *err) {
    if (pr->rd.buf) {
        if (dr_wait(t->pool, &pr->rd) == 0) {
            *data = pr->rd.data;
            return 0;
        }
        if (!pr->rd.direct_refused) {
            *err = pr->rd.err;
            return -1;
        }
    }
    return read_region(t, e, off, len, dst, data, err);
}

/* Reads walk unit i into ub (its buffer sized by walk_buffer_bytes); the first
 * read of each unit also checks every value is finite (one pass over bytes in
 * cache, once per unit and run: pinned units at load, streamed ones on the first pass). */
static int read_walk_unit(trunk *t, int i, unit_buffer *ub, k3_error *err) {
    const k3_model *m = t->m;
    uint64_t at = 0;
    int check = !t->checked[i];
    if (i < m->n_units) {
        const trunk_unit *u = &m->units[i];
        pooled_read pr[UNIT_MAX_TENSORS];
        /* every matrix of the unit in flight at once (through the pool, if any), then the checks */
        for (int j = 0; j < u->n; j++) {
            uint64_t n = u->e[j]->t->end - u->e[j]->t->begin;
            if (t->place && u->w[j]->rows) /* where the data will start: the O_DIRECT window keeps the offset in a page */
                t->place(t->place_ctx, ub->buf + at + (t->direct_ok ? u->e[j]->t->begin % IO_ALIGN : 0), u->w[j]->rows,
                            (size_t)(n / u->w[j]->rows), i >= t->n_pinned);
            pooled_submit(t, u->e[j], 0, n, ub->buf + at, &pr[j]);
            at += region_bytes(n);
        }
        int rc = 0;
        at = 0;
        for (int j = 0; j < u->n; j++) { /* every submitted read is waited for, even after a failure */
            uint64_t n = u->e[j]->t->end - u->e[j]->t->begin;
            k3_error e = {0};
            if (rc && !pr[j].rd.buf) { /* failed already: no further reads of our own */
                at += region_bytes(n);
                continue;
            }
            if (pooled_finish(t, u->e[j], 0, n, ub->buf + at, &pr[j], &ub->data[j], &e) && !rc) {
                *err = e;
                rc = -1;
            }
            if (!rc && check && check_finite(t, u->e[j], ub->data[j], n / st_dtype_size(u->e[j]->t->dtype), 0, err)) rc = -1;
            at += region_bytes(n);
        }
        if (rc) return -1;
        t->checked[i] = 1;
        return 0;
    }
    size_t r0, rows = lm_chunk_span(t, i - m->n_units, &r0), row_bytes = (size_t)m->cfg.hidden_size * lm_elsize(m);
    if (t->place)
        t->place(t->place_ctx, ub->buf + (t->direct_ok ? (m->lm_head_entry->t->begin + r0 * row_bytes) % IO_ALIGN : 0), rows,
                 row_bytes, i >= t->n_pinned);
    pooled_read pr;
    uint64_t off = (uint64_t)r0 * row_bytes, len = (uint64_t)rows * row_bytes;
    pooled_submit(t, m->lm_head_entry, off, len, ub->buf, &pr);
    if (pooled_finish(t, m->lm_head_entry, off, len, ub->buf, &pr, &ub->data[0], err)) return -1;
    size_t E = (size_t)m->cfg.hidden_size;
    if (check && check_finite(t, m->lm_head_entry, ub->data[0], rows * E, r0 * E, err)) return -1;
    t->checked[i] = 1;
    return 0;
}

/* map_pinned: walk unit i's matrices are the checkpoint's pages (ub->buf stays NULL); the
 * kernel is asked to read them ahead, then every value is checked finite, which faults the
 * pages in (from the page cache when a run before left them there). */
static int map_walk_unit(trunk *t, int i, unit_buffer *ub, k3_error *err) {
    const k3_model *m = t->m;
    checkpoint *ck = &t->m->ck;
    const ckpt_entry *es[UNIT_MAX_TENSORS];
    uint64_t off[UNIT_MAX_TENSORS], len[UNIT_MAX_TENSORS];
    int n = 0;
    if (i < m->n_units) {
        const trunk_unit *u = &m->units[i];
        for (int j = 0; j < u->n; j++) {
            es[n] = u->e[j];
            off[n] = 0;
            len[n++] = u->e[j]->t->end - u->e[j]->t->begin;
        }
    } else {
        size_t r0, rows = lm_chunk_span(t, i - m->n_units, &r0), row_bytes = (size_t)m->cfg.hidden_size * lm_elsize(m);
        es[n] = m->lm_head_entry;
        off[n] = (uint64_t)r0 * row_bytes;
        len[n++] = (uint64_t)rows * row_bytes;
    }
    for (int j = 0; j < n; j++) {
        const uint8_t *base;
#pragma omp critical(k3_trunk_map) /* checkpoint_data maps a shard on first use: one at a time */
        base = checkpoint_data(ck, es[j], err);
        if (!base) return -1;
        ub->data[j] = base + off[j];
        uintptr_t a = (uintptr_t)ub->data[j] & ~(uintptr_t)4095, b = (uintptr_t)ub->data[j] + len[j];
        madvise((void *)a, b - a, MADV_WILLNEED); /* advice only: a failure changes nothing */
    }
    if (!t->checked[i])
        for (int j = 0; j < n; j++) {
            size_t sz = st_dtype_size(es[j]->t->dtype), first = (size_t)(off[j] / sz);
            if (check_finite(t, es[j], ub->data[j], (size_t)(len[j] / sz), first, err)) return -1;
        }
    t->checked[i] = 1;
    return 0;
}

/* Bytes of the checkpoint that walk unit i covers (what a read of it costs). */
static uint64_t walk_tensor_bytes(const trunk *t, int i) {
    const k3_model *m = t->m;
    if (i < m->n_units) return m->units[i].bytes;
    size_t r0, rows = lm_chunk_span(t, i - m->n_units, &r0);
    return (uint64_t)rows * (uint64_t)m->cfg.hidden_size * lm_elsize(m);
}

static void *reader_main(void *arg) {
    trunk *t = arg;
    int n_stream = t->n_walk - t->n_pinned;
    for (uint64_t r = 0;; r++) {
        pthread_mutex_lock(&t->mu);
        while (!t->stop && r >= t->released + (uint64_t)t->n_slots) pthread_cond_wait(&t->cv, &t->mu);
        int stop = t->stop;
        pthread_mutex_unlock(&t->mu);
        if (stop) break;
        int unit = t->n_pinned + (int)(r % (uint64_t)n_stream);
        k3_error e = {0};
        int rc = read_walk_unit(t, unit, &t->slots[r % (uint64_t)t->n_slots], &e);
        pthread_mutex_lock(&t->mu);
        if (rc) {
            t->reader_failed = 1;
            t->reader_err = e;
        } else {
            t->filled = r + 1;
            t->bytes_streamed += walk_tensor_bytes(t, unit);
        }
        pthread_cond_broadcast(&t->cv);
        pthread_mutex_unlock(&t->mu);
        if (rc) break;
    }
    return NULL;
}

static int reader_start(trunk *t, k3_error *err) {
    if (!t->n_slots) return 0;
    if (pthread_create(&t->reader, NULL, reader_main, t) != 0) return k3_fail(err, "cannot start the trunk reader");
    t->reader_running = 1;
    return 0;
}

static void reader_stop(trunk *t) {
    if (!t->reader_running) return;
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->reader, NULL);
    t->reader_running = 0;
}

/* weight memory: 2 MiB aligned (a multiple of IO_ALIGN), transparent huge pages (weight_mem.h) */
static uint8_t *alloc_aligned(uint64_t n) { return n > SIZE_MAX ? NULL : weight_mem_alloc((size_t)n); }

trunk *trunk_create(k3_model *m, const trunk_config *tc, k3_error *err) { return trunk_create_placed(m, tc, NULL, NULL, err); }

trunk *trunk_create_placed(k3_model *m, const trunk_config *tc, trunk_place_fn place, void *place_ctx, k3_error *err) {
    trunk *t = calloc(1, sizeof *t);
    if (!t) { k3_fail(err, "out of memory"); return NULL; }
    t->m = m;
    t->place = place;
    t->place_ctx = place_ctx;
    t->lm_rows = tc->lm_chunk_rows ? tc->lm_chunk_rows : (size_t)m->cfg.vocab_size;
    t->n_layer_units = m->n_units;
    t->n_walk = trunk_walk_units(m, t->lm_rows);
    t->n_lm = t->n_walk - m->n_units;
    t->n_pinned = tc->n_pinned_units < t->n_walk ? tc->n_pinned_units : t->n_walk;
    t->n_slots = t->n_pinned == t->n_walk ? 0 : tc->n_slots;
    t->direct_ok = 1;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    if (t->n_pinned < t->n_walk && t->n_slots < 2) {
        trunk_free(t);
        k3_fail(err, "trunk streaming needs at least 2 slots (a single slot would be overwritten while in use)");
        return NULL;
    }
    t->direct_fd = malloc((size_t)m->ck.n_shards * sizeof *t->direct_fd);
    t->checked = calloc((size_t)t->n_walk + 1, 1);
    t->pinned = calloc((size_t)t->n_pinned + 1, sizeof *t->pinned);
    t->slots = calloc((size_t)t->n_slots + 1, sizeof *t->slots);
    if (!t->direct_fd || !t->pinned || !t->slots || !t->checked) { trunk_free(t); k3_fail(err, "out of memory"); return NULL; }
    for (int s = 0; s < m->ck.n_shards; s++) {
        t->direct_fd[s] = -1;
        if (direct_fd(t, s) == -2 && t->direct_ok) {
            t->direct_ok = 0;
            fprintf(stderr, "k3: O_DIRECT refused for %s; trunk reads are buffered\n", m->ck.shards[s].file.path);
        }
    }
    if (tc->read_threads > 0 && t->direct_ok && !(t->pool = dr_pool_create(tc->read_threads, DR_PIECE_DEFAULT, err))) {
        trunk_free(t);
        return NULL;
    }
    int tty = isatty(2);
    t->mapped = tc->map_pinned;
    for (int i = 0; i < t->n_pinned; i++) {
        if (t->mapped) { /* the checkpoint's pages: no buffer */
            t->pinned_bytes += walk_tensor_bytes(t, i);
            continue;
        }
        uint64_t n = walk_buffer_bytes(m, t->lm_rows, i);
        if (!(t->pinned[i].buf = alloc_aligned(n))) {
            trunk_free(t);
            k3_fail(err, "cannot allocate %llu bytes for pinned trunk unit %d", (unsigned long long)n, i);
            return NULL;
        }
        t->pinned_bytes += n;
    }
    /* Two units at once, each with all its matrices in flight through the read pool when
     * there is one (--read-threads; else one synchronous reader per unit): while reads wait
     * for the device, other reads' first touch of fresh memory (the kernel clearing the
     * pages they read into) proceeds. Measured on rw6 (docs/PERFORMANCE.md "Loading"): the
     * same rate as two synchronous readers on this VM, the device's. */
    int failed = 0, done = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(2)
    for (int i = 0; i < t->n_pinned; i++) {
        int stop;
#pragma omp atomic read
        stop = failed;
        if (stop) continue;
        k3_error e = {0};
        int rc = t->mapped ? map_walk_unit(t, i, &t->pinned[i], &e) : read_walk_unit(t, i, &t->pinned[i], &e);
#pragma omp critical(k3_trunk_pin)
        {
            if (rc && !failed) {
                failed = 1;
                *err = e;
            } else if (!rc && tty) fprintf(stderr, "\rk3: pinning trunk %d/%d", ++done, t->n_pinned);
        }
    }
    if (failed) { trunk_free(t); return NULL; }
    if (tty && t->n_pinned) fprintf(stderr, "\n");
    t->slot_bytes = trunk_slot_bytes(m, t->lm_rows);
    for (int s = 0; s < t->n_slots; s++)
        if (!(t->slots[s].buf = alloc_aligned(t->slot_bytes))) {
            trunk_free(t);
            k3_fail(err, "cannot allocate a %llu-byte streaming slot", (unsigned long long)t->slot_bytes);
            return NULL;
        }
    /* every trunk matrix learns its place in the walk, the name a pass asks for it by */
    for (int u = 0; u < m->n_units; u++)
        for (int j = 0; j < m->units[u].n; j++) {
            m->units[u].w[j]->unit = u;
            m->units[u].w[j]->slot = j;
        }
    if (reader_start(t, err)) { trunk_free(t); return NULL; }
    return t;
}

void trunk_free(trunk *t) {
    if (!t) return;
    reader_stop(t);
    dr_pool_free(t->pool);
    for (int i = 0; t->pinned && i < t->n_pinned; i++) weight_mem_free(t->pinned[i].buf);
    free(t->checked);
    for (int s = 0; t->slots && s < t->n_slots; s++) weight_mem_free(t->slots[s].buf);
    if (t->direct_fd)
        for (int s = 0; s < t->m->ck.n_shards; s++)
            if (t->direct_fd[s] >= 0) close(t->direct_fd[s]);
    free(t->pinned);
    free(t->slots);
    free(t->direct_fd);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t);
}

static const char *walk_label(const trunk *t, int i, char *buf, size_t len) {
    if (i < t->m->n_units) return t->m->units[i].label;
    snprintf(buf, len, "lm head chunk %d", i - t->m->n_units);
    return buf;
}

/* Data pointers of walk unit i: pinned buffer or the slot the reader filled. */
static const unit_buffer *acquire_walk(trunk *t, int i, k3_error *err) {
    if (i < t->n_pinned) return &t->pinned[i];
    int n_stream = t->n_walk - t->n_pinned;
    uint64_t k = t->consumed;
    int expect = t->n_pinned + (int)(k % (uint64_t)n_stream);
    if (i != expect) {
        char a[48], b[48];
        k3_fail(err, "trunk walk out of order: asked for %s, the reader holds %s", walk_label(t, i, a, sizeof a),
                walk_label(t, expect, b, sizeof b));
        return NULL;
    }
    pthread_mutex_lock(&t->mu);
    if (t->filled <= k && !t->reader_failed) {
        double t0 = k3_now_s();
        while (t->filled <= k && !t->reader_failed) pthread_cond_wait(&t->cv, &t->mu);
        t->wait_s += k3_now_s() - t0;
    }
    int failed = t->filled <= k;
    pthread_mutex_unlock(&t->mu);
    if (failed) { k3_fail(err, "%s", t->reader_err.msg); return NULL; }
    t->consumed++;
    return &t->slots[k % (uint64_t)t->n_slots];
}

static void release_walk(trunk *t, int i) {
    if (i < t->n_pinned) return;
    pthread_mutex_lock(&t->mu);
    t->released++;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

void trunk_pass_begin(trunk *t, trunk_pass *p) {
    memset(p, 0, sizeof *p);
    p->t = t;
    p->cur = -1;
}

void trunk_release_current(trunk_pass *p) {
    if (p->cur < 0) return;
    release_walk(p->t, p->cur);
    p->cur = -1;
    memset(p->data, 0, sizeof p->data);
}

void trunk_pass_end(trunk_pass *p, int failed) {
    trunk *t = p->t;
    trunk_release_current(p);
    if (!failed) return;
    /* abandon: the reader may be anywhere in its cycle; start it over at the walk's start */
    reader_stop(t);
    t->stop = 0;
    t->filled = t->consumed = t->released = 0;
    t->reader_failed = 0;
    t->reader_err = (k3_error){0};
    k3_error e = {0};
    if (reader_start(t, &e)) {
        t->reader_failed = 1; /* every later acquire reports it */
        t->reader_err = e;
    }
}

int trunk_get(trunk_pass *p, const dense_weight *w, dense_weight *view, k3_error *err) {
    trunk *t = p->t;
    if (w->unit != p->cur) {
        trunk_release_current(p);
        int u = p->next;
        if (u >= t->n_layer_units || w->unit != u)
            return k3_fail(err, "trunk walk out of order: a tensor of %s was needed, the next unit is %s",
                           w->unit >= 0 && w->unit < t->n_layer_units ? t->m->units[w->unit].label : "no unit",
                           u < t->n_layer_units ? t->m->units[u].label : "the lm head");
        const unit_buffer *ub = acquire_walk(t, u, err);
        if (!ub) return -1;
        memcpy(p->data, ub->data, sizeof p->data);
        p->cur = u;
        p->next = u + 1;
    }
    *view = *w;
    view->data = p->data[w->slot];
    return 0;
}

int trunk_matmul(trunk_pass *p, const kernels *k, const dense_weight *w, const float *x, size_t ntok, float *y,
                 k3_error *err) {
    dense_weight v;
    if (trunk_get(p, w, &v, err)) return -1;
    matmul_dense(k, &v, x, ntok, y);
    return 0;
}

int trunk_matmul_many(trunk_pass *p, const kernels *k, const dense_weight *const *w, const float *const *x,
                      size_t ntok, float *const *y, size_t n, k3_error *err) {
    for (size_t i = 0; i < n;) {
        size_t j = i;
        dense_weight v[K3_MATMUL_MANY_MAX];
        /* a run of the same unit: its buffer stays current for all of them */
        for (; j < n && j - i < K3_MATMUL_MANY_MAX && w[j]->unit == w[i]->unit; j++)
            if (trunk_get(p, w[j], &v[j - i], err)) return -1;
        matmul_dense_many(k, v, x + i, ntok, y + i, j - i);
        i = j;
    }
    return 0;
}

int trunk_lm_chunks(const trunk *t) { return t->n_lm; }
size_t trunk_lm_chunk_rows(const trunk *t) { return t->lm_rows; }

int trunk_acquire_lm(trunk_pass *p, int c, dense_weight *w, size_t *row0, k3_error *err) {
    trunk *t = p->t;
    trunk_release_current(p);
    if (p->next != t->n_layer_units) return k3_fail(err, "trunk walk out of order: lm head before the last layer");
    const unit_buffer *ub = acquire_walk(t, t->n_layer_units + c, err);
    if (!ub) return -1;
    size_t rows = lm_chunk_span(t, c, row0);
    *w = (dense_weight){t->m->lm_head.dtype, rows, t->m->lm_head.cols, ub->data[0], -1, 0};
    return 0;
}

void trunk_release_lm(trunk_pass *p, int c) {
    release_walk(p->t, p->t->n_layer_units + c);
}

void trunk_embed_prefetch(trunk *t, const int32_t *tokens, size_t n) {
    const k3_model *m = t->m;
    size_t E = (size_t)m->cfg.hidden_size, es = m->embed.dtype == DTYPE_F32 ? 4 : 2;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] >= 0 && tokens[i] < m->cfg.vocab_size)
            checkpoint_willneed(&t->m->ck, m->embed_entry, (uint64_t)tokens[i] * E * es, E * es);
}

int trunk_embed_row(trunk *t, int32_t token, float *out, k3_error *err) {
    const k3_model *m = t->m;
    size_t E = (size_t)m->cfg.hidden_size, es = m->embed.dtype == DTYPE_F32 ? 4 : 2;
    uint16_t buf16[256];
    /* read in pieces through a small stack buffer: no [vocab, E] table anywhere */
    for (size_t i = 0; i < E;) {
        size_t n = E - i < 128 ? E - i : 128;
        if (checkpoint_read(&t->m->ck, m->embed_entry, ((uint64_t)token * E + i) * es, buf16, n * es, err)) return -1;
        for (size_t j = 0; j < n; j++) {
            if (es == 4) memcpy(&out[i + j], (const char *)buf16 + 4 * j, 4);
            else out[i + j] = bf16_to_f32(buf16[j]);
        }
        if (check_finite(t, m->embed_entry, buf16, n, (size_t)token * E + i, err)) return -1;
        i += n;
    }
    return 0;
}

trunk_stats trunk_get_stats(trunk *t) {
    trunk_stats s = {0};
    s.pinned_bytes = t->pinned_bytes;
    s.slot_bytes = t->slot_bytes;
    s.n_slots = t->n_slots;
    s.n_pinned = t->n_pinned;
    s.n_walk = t->n_walk;
    s.direct_io = t->direct_ok;
    pthread_mutex_lock(&t->mu);
    s.bytes_streamed = t->bytes_streamed;
    s.units_streamed = t->filled;
    s.wait_s = t->wait_s;
    pthread_mutex_unlock(&t->mu);
    s.read_threads = dr_pool_threads(t->pool);
    return s;
}
