/* verify.c - every byte of a checkpoint checked once (see verify.h).
 *
 * Structure first (config, index, shard headers, the layer schema), then one
 * pass over the data: chunks (8 MiB) in file order (with SHA-256, round robin
 * over up to n_threads shards, so that shards hash in parallel) are handed to reader
 * threads; each reads its chunk (plus ALIGN bytes of overlap so an element that
 * starts in the chunk is whole), checks the values of the tensors that start
 * elements in it, and, with --sha256, deposits the buffer for the shard's hasher,
 * which consumes the shard's chunks strictly in order (one thread at a time per
 * shard; different shards hash in parallel). A thread needs a free buffer to take
 * a chunk; a shard's chunks are taken in order, so its oldest unhashed chunk is
 * always being read or ready, and the pipeline cannot stall. */
#define _GNU_SOURCE /* O_DIRECT */
#include "coordinator/verify.h"
#include "common/mono_clock.h"
#include "common/config.h"
#include "common/safetensors.h"
#include "common/sha256.h"
#include "common/layer_schema.h"
#include "coordinator/model.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ALIGN 4096u
#define MAX_FIRST 4 /* elements listed per bad tensor */

enum { EXIT_OK_ = 0, EXIT_RUNTIME_ = 1, EXIT_PROBLEMS_ = 2 };

typedef struct {
    int phase;          /* 0 structure (in order found), 1 data (by shard, offset) */
    int shard;          /* -1: none */
    uint64_t offset;    /* UINT64_MAX: none */
    size_t seq;
    char *tensor;       /* NULL: none */
    int64_t element;    /* -1: none */
    char *msg;
} problem;

typedef struct {
    uint64_t count;
    uint64_t first[MAX_FIRST];
    unsigned char kind[MAX_FIRST]; /* 0 NaN, 1 +Inf, 2 -Inf, 3 scale byte 255 */
    int nfirst;
} tstat;

typedef struct {
    char *name, *path;
    int in_index, on_disk, header_ok;
    st_file f;
    tstat *ts;                  /* parallel to f.tensors */
    uint64_t n_chunks, next_assign, chunks_read, next_hash;
    int fd, direct, open_failed, hashing, hash_failed, hashed;
    sha256_ctx sha;
    char hex[65];
    char *expect;               /* expected digest (hex) or NULL */
} vshard;

typedef struct { const char *name; int shard; const st_tensor *t; } name_ref;

typedef struct {
    uint8_t *data;
    int state;                  /* 0 free, 1 reading, 2 read (waiting for its shard's hasher) */
    int shard;
    uint64_t idx, valid;
} vbuf;

typedef struct {
    const verify_options *o;
    char *dir;
    int n_shards;
    vshard *sh;
    problem *pv;
    size_t np, pcap;
    int oom;
    /* data pass */
    pthread_mutex_t mu;
    pthread_cond_t buf_cv, done_cv;
    vbuf *bufs;
    int n_bufs, n_threads, threads_left;
    int cur_shard;              /* shards before it are fully handed out */
    unsigned rr;                /* round robin among the shards in flight */
    uint64_t bytes_total, bytes_done;
    int any_direct, any_buffered;
    uint64_t chunk;             /* read size, a multiple of ALIGN */
    name_ref *refs;             /* every tensor of every readable shard, by name */
    size_t n_refs;
    char note_unused[640];      /* printed after the summary line */
    int note_missing;
} verifier;

/* ---- problems ---- */

static void add_problem(verifier *v, int phase, int shard, const char *tensor, int64_t element, uint64_t offset,
                        const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static void add_problem(verifier *v, int phase, int shard, const char *tensor, int64_t element, uint64_t offset,
                        const char *fmt, ...) {
    if (v->np == v->pcap) {
        size_t nc = v->pcap ? 2 * v->pcap : 16;
        problem *nv = realloc(v->pv, nc * sizeof *nv);
        if (!nv) { v->oom = 1; return; }
        v->pv = nv;
        v->pcap = nc;
    }
    char buf[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    problem *p = &v->pv[v->np];
    *p = (problem){phase, shard, offset, v->np, tensor ? strdup(tensor) : NULL, element, strdup(buf)};
    if (!p->msg || (tensor && !p->tensor)) { free(p->msg); free(p->tensor); v->oom = 1; return; }
    v->np++;
}

static int cmp_problem(const void *a, const void *b) {
    const problem *x = a, *y = b;
    if (x->phase != y->phase) return x->phase - y->phase;
    if (x->phase == 1) {
        if (x->shard != y->shard) return x->shard - y->shard;
        if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    }
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* ---- structure ---- */

static int has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

static int shard_index(verifier *v, const char *name) {
    for (int i = 0; i < v->n_shards; i++)
        if (!strcmp(v->sh[i].name, name)) return i;
    return -1;
}

static int add_shard(verifier *v, const char *name) {
    int i = shard_index(v, name);
    if (i >= 0) return i;
    vshard *ns = realloc(v->sh, (size_t)(v->n_shards + 1) * sizeof *ns);
    if (!ns) { v->oom = 1; return -1; }
    v->sh = ns;
    vshard *s = &v->sh[v->n_shards];
    memset(s, 0, sizeof *s);
    s->fd = -1;
    s->name = strdup(name);
    size_t pl = strlen(v->dir) + strlen(name) + 2;
    s->path = malloc(pl);
    if (!s->name || !s->path) { free(s->name); free(s->path); v->oom = 1; return -1; }
    snprintf(s->path, pl, "%s/%s", v->dir, name);
    return v->n_shards++;
}

static int cmp_shard(const void *a, const void *b) { return strcmp(((const vshard *)a)->name, ((const vshard *)b)->name); }

static int cmp_ref(const void *a, const void *b) { return strcmp(((const name_ref *)a)->name, ((const name_ref *)b)->name); }

/* The index, the directory listing and every shard header; returns the number
 * of structural problems found. */
static size_t check_structure(verifier *v, json_t **index_out) {
    size_t before = v->np;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", v->dir);
    json_t *index = NULL, *wmap = NULL;
    if (access(path, F_OK) == 0) {
        json_error_t jerr;
        index = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
        if (!index) add_problem(v, 0, -1, NULL, -1, UINT64_MAX, "model.safetensors.index.json: invalid JSON at line %d: %s", jerr.line, jerr.text);
        else if (!json_is_object(wmap = json_object_get(index, "weight_map"))) {
            add_problem(v, 0, -1, NULL, -1, UINT64_MAX, "model.safetensors.index.json: missing or non-object 'weight_map'");
            wmap = NULL;
        }
    }
    if (wmap) {
        const char *k;
        json_t *val;
        int last = -1;
        json_object_foreach(wmap, k, val) {
            const char *sn = json_string_value(val);
            if (!sn || !sn[0] || strchr(sn, '/') || !strcmp(sn, ".") || !strcmp(sn, "..")) {
                add_problem(v, 0, -1, k, -1, UINT64_MAX, "model.safetensors.index.json: weight_map entry '%s' is not a plain shard file name", k);
                continue;
            }
            if (last >= 0 && !strcmp(v->sh[last].name, sn)) continue; /* the index names few shards, in runs */
            last = add_shard(v, sn);
            if (last >= 0) v->sh[last].in_index = 1;
        }
    }
    DIR *d = opendir(v->dir);
    if (!d) add_problem(v, 0, -1, NULL, -1, UINT64_MAX, "%s: cannot open directory: %s", v->dir, strerror(errno));
    else {
        struct dirent *de;
        while ((de = readdir(d)))
            if (has_suffix(de->d_name, ".safetensors")) {
                int i = add_shard(v, de->d_name);
                if (i >= 0) v->sh[i].on_disk = 1;
            }
        closedir(d);
    }
    if (v->n_shards) qsort(v->sh, (size_t)v->n_shards, sizeof *v->sh, cmp_shard);
    if (v->n_shards == 0) add_problem(v, 0, -1, NULL, -1, UINT64_MAX, "%s: no safetensors shards found", v->dir);
    for (int i = 0; i < v->n_shards; i++) {
        vshard *s = &v->sh[i];
        if (!s->on_disk) {
            add_problem(v, 0, i, NULL, -1, UINT64_MAX, "shard %s is named by the index but missing from the directory", s->name);
            continue;
        }
        if (wmap && !s->in_index)
            add_problem(v, 0, i, NULL, -1, UINT64_MAX, "shard %s is in the directory but the index names none of its tensors", s->name);
        k3_error e = {0};
        if (safetensors_open(s->path, &s->f, &e)) {
            add_problem(v, 0, i, NULL, -1, UINT64_MAX, "%s", e.msg);
            continue;
        }
        s->header_ok = 1;
        s->ts = calloc(s->f.n_tensors ? s->f.n_tensors : 1, sizeof *s->ts);
        if (!s->ts) v->oom = 1;
    }
    /* every tensor in exactly one shard */
    size_t total = 0;
    for (int i = 0; i < v->n_shards; i++) total += v->sh[i].header_ok ? v->sh[i].f.n_tensors : 0;
    name_ref *refs = malloc((total ? total : 1) * sizeof *refs);
    if (!refs) { v->oom = 1; *index_out = index; return v->np - before; }
    size_t nr = 0;
    for (int i = 0; i < v->n_shards; i++)
        for (size_t t = 0; v->sh[i].header_ok && t < v->sh[i].f.n_tensors; t++) refs[nr++] = (name_ref){v->sh[i].f.tensors[t].name, i, &v->sh[i].f.tensors[t]};
    qsort(refs, nr, sizeof *refs, cmp_ref);
    for (size_t t = 1; t < nr; t++)
        if (!strcmp(refs[t].name, refs[t - 1].name))
            add_problem(v, 0, refs[t].shard, refs[t].name, -1, UINT64_MAX, "tensor '%s' is in two shards: %s and %s", refs[t].name,
                        v->sh[refs[t - 1].shard].name, v->sh[refs[t].shard].name);
    if (wmap) {
        const char *k;
        json_t *val;
        int si = -1;
        json_object_foreach(wmap, k, val) {
            const char *want = json_string_value(val);
            if (!want) continue; /* already named: not a plain shard file name */
            if (si < 0 || strcmp(v->sh[si].name, want)) si = shard_index(v, want);
            if (si < 0 || !v->sh[si].header_ok) continue; /* already named: missing or unreadable shard */
            name_ref key = {k, 0, NULL};
            name_ref *r = bsearch(&key, refs, nr, sizeof *refs, cmp_ref);
            if (r && r->shard == si) continue;
            if (r) add_problem(v, 0, si, k, -1, UINT64_MAX, "index maps tensor '%s' to %s, but it is in %s", k, want, v->sh[r->shard].name);
            else add_problem(v, 0, si, k, -1, UINT64_MAX, "index maps tensor '%s' to %s, but no shard contains it", k, want);
        }
        for (size_t t = 0; t < nr; t++) {
            json_t *mapped = json_object_get(wmap, refs[t].name);
            if (!mapped)
                add_problem(v, 0, refs[t].shard, refs[t].name, -1, UINT64_MAX, "tensor '%s' in shard %s is not in the index", refs[t].name,
                            v->sh[refs[t].shard].name);
        }
    }
    v->refs = refs;
    v->n_refs = nr;
    *index_out = index;
    return v->np - before;
}

/* ---- the layer schema ---- */

#define MAX_MISSING_NAMED 50

typedef struct {
    verifier *v;
    const k3_config *c;
    unsigned char *used;     /* per ref: expected by the schema */
    uint64_t missing;
    int skip_missing;        /* a shard is unreadable: its tensors would all look missing */
} schema_walk;

/* The rows of one table for one layer / expert: presence, dtype and shape (ls_check,
 * the loader's own check). */
static void check_table(schema_walk *w, ls_kind kind, int layer, int expert) {
    verifier *v = w->v;
    const ls_table *tb = ls_table_get(kind);
    char name[512];
    for (int i = 0; i < tb->n; i++) {
        const ls_tensor *t = &tb->rows[i];
        if (!ls_cond_holds(w->c, t->cond) || ls_tensor_name(tb, t, layer, expert, name, sizeof name)) continue;
        name_ref key = {name, 0, NULL};
        const name_ref *r = v->n_refs ? bsearch(&key, v->refs, v->n_refs, sizeof *v->refs, cmp_ref) : NULL;
        if (!r) {
            if (!w->skip_missing && w->missing++ < MAX_MISSING_NAMED)
                add_problem(v, 0, -1, name, -1, UINT64_MAX, "schema: missing tensor '%s' (%s)", name, tb->name);
            continue;
        }
        w->used[r - v->refs] = 1;
        ckpt_entry e = {r->name, r->t, r->shard};
        k3_error err = {0};
        if (ls_check(w->c, t, &e, &err)) add_problem(v, 0, r->shard, name, -1, r->t->begin, "schema: %s (shard %s)", err.msg, v->sh[r->shard].name);
    }
}

/* Every tensor the layer schema (common/layer_schema.h) expects for this config:
 * each missing one (the first MAX_MISSING_NAMED by name, then a count) and each
 * dtype or shape that differs. Tensors the engine does not use are counted in a note. */
static void check_schema(verifier *v, const k3_config *c, int skip_missing) {
    schema_walk w = {v, c, calloc(v->n_refs ? v->n_refs : 1, 1), 0, skip_missing};
    if (!w.used) { v->oom = 1; return; }
    check_table(&w, LS_MODEL, -1, -1);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        check_table(&w, LS_LAYER, l, -1);
        check_table(&w, ls_attn_kind(c, l), l, -1);
        ls_kind ffn = ls_ffn_kind(c, l);
        check_table(&w, ffn, l, -1);
        for (int e = 0; ffn == LS_MOE && e < c->num_experts; e++) check_table(&w, LS_EXPERT, l, e);
    }
    if (w.missing > MAX_MISSING_NAMED)
        add_problem(v, 0, -1, NULL, -1, UINT64_MAX, "schema: %llu more tensors are missing (the first %d are named above)",
                    (unsigned long long)(w.missing - MAX_MISSING_NAMED), MAX_MISSING_NAMED);
    size_t unused = 0, first = 0;
    for (size_t i = 0; i < v->n_refs; i++)
        if (!w.used[i] && !unused++) first = i;
    if (unused)
        snprintf(v->note_unused, sizeof v->note_unused,
                 "note: %zu tensor(s) that the engine does not use (e.g. '%s'); not a problem (other parts of a release, e.g. vision)\n",
                 unused, v->refs[first].name);
    free(w.used);
}

/* ---- data pass ---- */

typedef struct { uint64_t count, first[MAX_FIRST]; unsigned char kind[MAX_FIRST]; int nfirst; } local_bad;

static void note_bad(local_bad *lb, uint64_t el, unsigned char kind) {
    if (lb->count++ < MAX_FIRST) { lb->first[lb->nfirst] = el; lb->kind[lb->nfirst++] = kind; }
}

static unsigned char float_kind(int neg, int nan) { return nan ? 0 : neg ? 2 : 1; }

/* Checks elements [e0, e0 + n) of a tensor; element e0 is at p (unaligned). */
static void scan_values(st_dtype dt, int is_scale, const uint8_t *p, uint64_t e0, uint64_t n, local_bad *lb) {
    const uint64_t BLK = 256;
    switch (dt) {
    case ST_BF16:
    case ST_F16: {
        uint16_t m = dt == ST_BF16 ? 0x7f80 : 0x7c00, mant = dt == ST_BF16 ? 0x007f : 0x03ff;
        for (uint64_t b = 0; b < n; b += BLK) {
            uint64_t end = b + BLK < n ? b + BLK : n;
            int any = 0;
#pragma omp simd reduction(| : any) /* a vectorised screen; the exact pass below runs only on a hit */
            for (uint64_t j = b; j < end; j++) { uint16_t u; memcpy(&u, p + 2 * j, 2); any |= (u & m) == m; }
            if (!any) continue;
            for (uint64_t j = b; j < end; j++) {
                uint16_t u;
                memcpy(&u, p + 2 * j, 2);
                if ((u & m) == m) note_bad(lb, e0 + j, float_kind(u >> 15, (u & mant) != 0));
            }
        }
        break;
    }
    case ST_F32:
        for (uint64_t b = 0; b < n; b += BLK) {
            uint64_t end = b + BLK < n ? b + BLK : n;
            int any = 0;
#pragma omp simd reduction(| : any) /* a vectorised screen; the exact pass below runs only on a hit */
            for (uint64_t j = b; j < end; j++) { uint32_t u; memcpy(&u, p + 4 * j, 4); any |= (u & 0x7f800000u) == 0x7f800000u; }
            if (!any) continue;
            for (uint64_t j = b; j < end; j++) {
                uint32_t u;
                memcpy(&u, p + 4 * j, 4);
                if ((u & 0x7f800000u) == 0x7f800000u) note_bad(lb, e0 + j, float_kind((int)(u >> 31), (u & 0x7fffffu) != 0));
            }
        }
        break;
    case ST_F64:
        for (uint64_t j = 0; j < n; j++) {
            uint64_t u;
            memcpy(&u, p + 8 * j, 8);
            if ((u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull) note_bad(lb, e0 + j, float_kind((int)(u >> 63), (u & 0xfffffffffffffull) != 0));
        }
        break;
    case ST_U8:
        if (!is_scale) break;
        for (uint64_t j = 0; j < n;) {
            const uint8_t *hit = memchr(p + j, 255, (size_t)(n - j));
            if (!hit) break;
            j = (uint64_t)(hit - p);
            note_bad(lb, e0 + j, 3);
            j++;
        }
        break;
    default: break;
    }
}

/* Checks every element that starts in [off, off+span) of shard s; buf holds the
 * file bytes from off, got of them valid. Merges findings under v->mu. */
static void scan_chunk(verifier *v, vshard *s, uint64_t off, const uint8_t *buf, uint64_t span, uint64_t got) {
    const st_tensor *T = s->f.tensors;
    size_t n = s->f.n_tensors, lo = 0, hi = n;
    while (lo < hi) { /* first tensor with end > off */
        size_t mid = (lo + hi) / 2;
        if (T[mid].end > off) hi = mid; else lo = mid + 1;
    }
    for (size_t i = lo; i < n && T[i].begin < off + span; i++) {
        const st_tensor *t = &T[i];
        uint64_t es = st_dtype_size(t->dtype);
        if (!es || t->end == t->begin) continue;
        uint64_t from = t->begin > off ? t->begin : off, to = t->end < off + span ? t->end : off + span;
        uint64_t e0 = (from - t->begin + es - 1) / es, e1 = (to - t->begin + es - 1) / es;
        if (e1 <= e0) continue;
        if (t->begin + e1 * es > off + got) continue; /* not read (a read error was reported) */
        int is_scale = has_suffix(t->name, "weight_scale");
        local_bad lb = {0};
        scan_values(t->dtype, is_scale, buf + (t->begin + e0 * es - off), e0, e1 - e0, &lb);
        if (!lb.count) continue;
        pthread_mutex_lock(&v->mu);
        tstat *ts = &s->ts[i];
        ts->count += lb.count;
        for (int k = 0; k < lb.nfirst; k++) { /* keep the MAX_FIRST smallest elements */
            int at = ts->nfirst;
            while (at > 0 && ts->first[at - 1] > lb.first[k]) at--;
            if (at >= MAX_FIRST) continue;
            int last = ts->nfirst < MAX_FIRST ? ts->nfirst : MAX_FIRST - 1;
            for (int q = last; q > at; q--) { ts->first[q] = ts->first[q - 1]; ts->kind[q] = ts->kind[q - 1]; }
            ts->first[at] = lb.first[k];
            ts->kind[at] = lb.kind[k];
            if (ts->nfirst < MAX_FIRST) ts->nfirst++;
        }
        pthread_mutex_unlock(&v->mu);
    }
}

/* Opens a shard for the data pass: O_DIRECT when the file system takes it. Under v->mu. */
static void open_shard(verifier *v, vshard *s) {
    s->fd = open(s->path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    s->direct = s->fd >= 0;
    if (s->fd >= 0) {
        void *probe = NULL;
        if (posix_memalign(&probe, ALIGN, ALIGN) == 0) {
            if (pread(s->fd, probe, ALIGN, 0) < 0 && errno == EINVAL) { close(s->fd); s->fd = -1; s->direct = 0; }
            free(probe);
        }
    }
    if (s->fd < 0) s->fd = open(s->path, O_RDONLY | O_CLOEXEC);
    if (s->fd < 0) {
        add_problem(v, 1, (int)(s - v->sh), NULL, -1, 0, "shard %s: cannot open: %s", s->name, strerror(errno));
        s->open_failed = 1;
    } else {
        if (s->direct) v->any_direct = 1; else v->any_buffered = 1;
#ifdef POSIX_FADV_SEQUENTIAL
        if (!s->direct) posix_fadvise(s->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
    }
}

/* Hashes the shard's consecutive ready chunks; one hasher per shard. Under v->mu (dropped while hashing). */
static void run_hasher(verifier *v, int si) {
    vshard *s = &v->sh[si];
    if (s->hashing) return;
    s->hashing = 1;
    for (;;) {
        int b;
        for (b = 0; b < v->n_bufs; b++)
            if (v->bufs[b].state == 2 && v->bufs[b].shard == si && v->bufs[b].idx == s->next_hash) break;
        if (b == v->n_bufs) break;
        vbuf *vb = &v->bufs[b];
        pthread_mutex_unlock(&v->mu);
        if (!s->hash_failed) sha256_update(&s->sha, vb->data, (size_t)vb->valid);
        pthread_mutex_lock(&v->mu);
        vb->state = 0;
        pthread_cond_broadcast(&v->buf_cv);
        s->next_hash++;
    }
    if (s->next_hash == s->n_chunks && !s->hashed && !s->hash_failed) {
        uint8_t d[32];
        sha256_final(&s->sha, d);
        sha256_hex(d, s->hex);
        s->hashed = 1;
    }
    s->hashing = 0;
}

static void *reader(void *arg) {
    verifier *v = arg;
    int sha = v->o->sha256 || v->o->expect_path;
    pthread_mutex_lock(&v->mu);
    for (;;) {
        /* the next chunk: in file order, one shard after the other; with SHA-256 round
         * robin over up to n_threads shards at once, so that many hashers can run */
        while (v->cur_shard < v->n_shards && (!v->sh[v->cur_shard].header_ok || v->sh[v->cur_shard].next_assign == v->sh[v->cur_shard].n_chunks))
            v->cur_shard++;
        if (v->cur_shard >= v->n_shards) break;
        int b;
        for (b = 0; b < v->n_bufs && v->bufs[b].state != 0; b++) {}
        if (b == v->n_bufs) { pthread_cond_wait(&v->buf_cv, &v->mu); continue; }
        int cand[16], nc = 0, window = sha ? (v->n_threads < 16 ? v->n_threads : 16) : 1;
        for (int i = v->cur_shard; i < v->n_shards && nc < window; i++)
            if (v->sh[i].header_ok && v->sh[i].next_assign < v->sh[i].n_chunks) cand[nc++] = i;
        int si = cand[v->rr++ % (unsigned)nc];
        vshard *s = &v->sh[si];
        uint64_t idx = s->next_assign++;
        if (s->fd < 0 && idx == 0) open_shard(v, s);
        vbuf *vb = &v->bufs[b];
        vb->state = 1;
        vb->shard = si;
        vb->idx = idx;
        int fd = s->fd;
        pthread_mutex_unlock(&v->mu);

        uint64_t off = idx * v->chunk, size = s->f.file_size;
        uint64_t span = size - off < v->chunk ? size - off : v->chunk;
        uint64_t need = size - off < v->chunk + ALIGN ? size - off : v->chunk + ALIGN;
        uint64_t got = 0;
        int err = 0;
        while (fd >= 0 && !err && got < need) {
            size_t want = (size_t)(((need - got) + ALIGN - 1) / ALIGN * ALIGN);
            ssize_t r = pread(fd, vb->data + got, want, (off_t)(off + got));
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) { err = errno; break; }
            if (r == 0) break;
            got += (uint64_t)r;
        }
        if (got > need) got = need;
        scan_chunk(v, s, off, vb->data, span, got);

        pthread_mutex_lock(&v->mu);
        if (err) add_problem(v, 1, si, NULL, -1, off + got, "shard %s: read error at offset %llu: %s", s->name, (unsigned long long)(off + got), strerror(err));
        else if (got < span && fd >= 0) add_problem(v, 1, si, NULL, -1, off + got, "shard %s: ends at offset %llu, but its header says %llu bytes (truncated while verifying?)", s->name, (unsigned long long)(off + got), (unsigned long long)size);
        if (got < span) s->hash_failed = 1;
        v->bytes_done += got < span ? got : span;
        vb->valid = span;
        if (++s->chunks_read == s->n_chunks && s->fd >= 0) { close(s->fd); s->fd = -1; }
        if (sha) { vb->state = 2; run_hasher(v, si); }
        else { vb->state = 0; pthread_cond_broadcast(&v->buf_cv); }
    }
    if (--v->threads_left == 0) pthread_cond_broadcast(&v->done_cv);
    pthread_cond_broadcast(&v->buf_cv);
    pthread_mutex_unlock(&v->mu);
    return NULL;
}

static void fmt_secs(double s, char *buf, size_t len) {
    if (s < 120) snprintf(buf, len, "%.0f s", s);
    else if (s < 7200) snprintf(buf, len, "%.0f min", s / 60);
    else snprintf(buf, len, "%.1f h", s / 3600);
}

/* Returns 0, or -1 when out of memory / no thread could start. */
static int data_pass(verifier *v, double *secs) {
    int sha = v->o->sha256 || v->o->expect_path;
    for (int i = 0; i < v->n_shards; i++) {
        vshard *s = &v->sh[i];
        if (!s->header_ok) continue;
        s->n_chunks = (s->f.file_size + v->chunk - 1) / v->chunk;
        v->bytes_total += s->f.file_size;
        sha256_init(&s->sha);
        if (s->n_chunks == 0) { uint8_t d[32]; sha256_final(&s->sha, d); sha256_hex(d, s->hex); s->hashed = 1; }
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = v->o->threads > 0 ? v->o->threads : (int)(cores > 2 ? 2 * cores : 4);
    if (nt > 16 && v->o->threads <= 0) nt = 16;
    v->n_threads = nt;
    v->n_bufs = sha ? 3 * nt : nt;
    v->bufs = calloc((size_t)v->n_bufs, sizeof *v->bufs);
    pthread_t *th = calloc((size_t)nt, sizeof *th);
    if (!v->bufs || !th) { free(th); return -1; }
    for (int b = 0; b < v->n_bufs; b++)
        if (posix_memalign((void **)&v->bufs[b].data, ALIGN, v->chunk + 2 * ALIGN)) { v->bufs[b].data = NULL; free(th); return -1; }
    pthread_mutex_init(&v->mu, NULL);
    pthread_cond_init(&v->buf_cv, NULL);
    pthread_cond_init(&v->done_cv, NULL);
    double t0 = k3_now_s();
    int started = 0;
    pthread_mutex_lock(&v->mu);
    for (int t = 0; t < nt; t++)
        if (pthread_create(&th[t], NULL, reader, v) == 0) { started++; v->threads_left++; }
    int tty = isatty(2);
    while (v->threads_left > 0 && started > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 500000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&v->done_cv, &v->mu, &ts);
        if (tty && v->threads_left > 0) {
            double el = k3_now_s() - t0, rate = el > 0 ? v->bytes_done / el : 0;
            char left[32] = "?";
            if (rate > 0) fmt_secs((double)(v->bytes_total - v->bytes_done) / rate, left, sizeof left);
            fprintf(stderr, "\rk3: verify: %.2f / %.2f GB read, %.2f GB/s, %s left   ", v->bytes_done / 1e9, v->bytes_total / 1e9, rate / 1e9, left);
        }
    }
    pthread_mutex_unlock(&v->mu);
    if (tty) fprintf(stderr, "\r%72s\r", "");
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    *secs = k3_now_s() - t0;
    free(th);
    pthread_mutex_destroy(&v->mu);
    pthread_cond_destroy(&v->buf_cv);
    pthread_cond_destroy(&v->done_cv);
    return started ? 0 : -1;
}

/* One problem per tensor with bad values, in file order. */
static void report_values(verifier *v) {
    for (int i = 0; i < v->n_shards; i++) {
        vshard *s = &v->sh[i];
        for (size_t t = 0; s->header_ok && t < s->f.n_tensors; t++) {
            tstat *ts = &s->ts[t];
            if (!ts->count) continue;
            const st_tensor *T = &s->f.tensors[t];
            uint64_t es = st_dtype_size(T->dtype), cols = T->ndim >= 2 ? T->shape[T->ndim - 1] : 0;
            char list[512];
            size_t o = 0;
            for (int k = 0; k < ts->nfirst && o < sizeof list; k++) {
                static const char *const kinds[] = {"NaN", "+Inf", "-Inf", "255"};
                uint64_t el = ts->first[k];
                if (cols) o += (size_t)snprintf(list + o, sizeof list - o, "%s%llu (row %llu, col %llu, offset %llu: %s)", k ? ", " : "",
                                                (unsigned long long)el, (unsigned long long)(el / cols), (unsigned long long)(el % cols),
                                                (unsigned long long)(T->begin + el * es), kinds[ts->kind[k]]);
                else o += (size_t)snprintf(list + o, sizeof list - o, "%s%llu (offset %llu: %s)", k ? ", " : "", (unsigned long long)el,
                                           (unsigned long long)(T->begin + el * es), kinds[ts->kind[k]]);
            }
            const char *more = ts->count > (uint64_t)ts->nfirst ? ", ..." : "";
            if (T->dtype == ST_U8)
                add_problem(v, 1, i, T->name, (int64_t)ts->first[0], T->begin + ts->first[0] * es,
                            "shard %s: tensor '%s': %llu MXFP4 scale byte(s) are 255 (NaN in OCP MXFP4; the engine refuses them) at element %s%s",
                            s->name, T->name, (unsigned long long)ts->count, list, more);
            else
                add_problem(v, 1, i, T->name, (int64_t)ts->first[0], T->begin + ts->first[0] * es,
                            "shard %s: tensor '%s' (%s): %llu non-finite value(s) at element %s%s", s->name, T->name,
                            st_dtype_name(T->dtype), (unsigned long long)ts->count, list, more);
        }
    }
}

/* ---- digests ---- */

typedef struct { char hex[65]; char *name; } expect_line;

/* Parses a sha256sum file ("HEX  NAME" or "HEX *NAME"; blank and # lines skipped).
 * Returns the count, or -1 (message printed). */
static int parse_expect(const char *path, expect_line **out) {
    FILE *f = fopen(path, "r");
    if (!f) { fprintf(stderr, "k3: --expect %s: cannot open: %s\n", path, strerror(errno)); return -1; }
    char line[8192];
    int n = 0, cap = 0, lineno = 0;
    expect_line *v = NULL;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        size_t len = strlen(line);
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (!len || line[0] == '#') continue;
        int ok = len > 66 && line[64] == ' ' && (line[65] == ' ' || line[65] == '*');
        for (int i = 0; ok && i < 64; i++) {
            char c = line[i];
            if (c >= 'A' && c <= 'F') line[i] = (char)(c - 'A' + 'a');
            else if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) ok = 0;
        }
        if (!ok) {
            fprintf(stderr, "k3: --expect %s line %d: expected '<64 hex digits>  <file name>' (sha256sum format)\n", path, lineno);
            goto bad;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            expect_line *nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv) goto oom;
            v = nv;
        }
        memcpy(v[n].hex, line, 64);
        v[n].hex[64] = 0;
        const char *name = line + 66, *slash = strrchr(name, '/');
        if (!(v[n].name = strdup(slash ? slash + 1 : name))) goto oom;
        n++;
    }
    fclose(f);
    *out = v;
    return n;
oom:
    fprintf(stderr, "k3: out of memory\n");
bad:
    for (int i = 0; i < n; i++) free(v[i].name);
    free(v);
    fclose(f);
    return -1;
}

/* SHA-256 of a small file of the model directory (not a shard). */
static int hash_file(const char *path, char hex[65]) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    sha256_ctx c;
    sha256_init(&c);
    char buf[1 << 16];
    size_t r;
    while ((r = fread(buf, 1, sizeof buf, f)) > 0) sha256_update(&c, buf, r);
    int bad = ferror(f);
    fclose(f);
    if (bad) return -1;
    uint8_t d[32];
    sha256_final(&c, d);
    sha256_hex(d, hex);
    return 0;
}

static void check_digests(verifier *v, const expect_line *ex, int n_ex) {
    for (int k = 0; k < n_ex; k++) {
        int si = shard_index(v, ex[k].name);
        if (si >= 0 && v->sh[si].on_disk) {
            vshard *s = &v->sh[si];
            if (!s->expect) s->expect = strdup(ex[k].hex);
            if (!s->hashed) continue; /* unreadable: already a problem */
            if (strcmp(s->hex, ex[k].hex))
                add_problem(v, 0, si, NULL, -1, UINT64_MAX, "shard %s: SHA-256 %s, but %s expects %s", s->name, s->hex, v->o->expect_path, ex[k].hex);
            continue;
        }
        char path[4096], hex[65];
        snprintf(path, sizeof path, "%s/%s", v->dir, ex[k].name);
        if (hash_file(path, hex))
            add_problem(v, 0, si, NULL, -1, UINT64_MAX, "%s is listed in %s but cannot be read: %s", ex[k].name, v->o->expect_path, strerror(errno));
        else if (strcmp(hex, ex[k].hex))
            add_problem(v, 0, -1, NULL, -1, UINT64_MAX, "%s: SHA-256 %s, but %s expects %s", ex[k].name, hex, v->o->expect_path, ex[k].hex);
    }
    for (int i = 0; i < v->n_shards; i++)
        if (v->sh[i].on_disk && !v->sh[i].expect)
            add_problem(v, 0, i, NULL, -1, UINT64_MAX, "shard %s has no expected digest in %s", v->sh[i].name, v->o->expect_path);
}

/* ---- report ---- */

static int write_json(const verifier *v, const char *path, int schema_checked, double secs, uint64_t n_tensors) {
    json_t *j = json_object();
    json_object_set_new(j, "model_dir", json_string(v->dir));
    json_object_set_new(j, "ok", json_boolean(v->np == 0));
    json_object_set_new(j, "schema_checked", json_boolean(schema_checked));
    json_object_set_new(j, "tensors", json_integer((json_int_t)n_tensors));
    json_object_set_new(j, "bytes_read", json_integer((json_int_t)v->bytes_done));
    json_object_set_new(j, "seconds", json_real(secs));
    json_object_set_new(j, "gb_per_s", json_real(secs > 0 ? v->bytes_done / secs / 1e9 : 0));
    json_object_set_new(j, "read_mode", json_string(v->any_direct ? (v->any_buffered ? "mixed" : "O_DIRECT") : "buffered"));
    json_object_set_new(j, "threads", json_integer(v->n_threads));
    json_t *sa = json_array();
    for (int i = 0; i < v->n_shards; i++) {
        const vshard *s = &v->sh[i];
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(s->name));
        json_object_set_new(o, "bytes", json_integer(s->header_ok ? (json_int_t)s->f.file_size : -1));
        json_object_set_new(o, "tensors", json_integer(s->header_ok ? (json_int_t)s->f.n_tensors : -1));
        if (s->hashed) json_object_set_new(o, "sha256", json_string(s->hex));
        if (s->expect) json_object_set_new(o, "expected_sha256", json_string(s->expect));
        json_array_append_new(sa, o);
    }
    json_object_set_new(j, "shards", sa);
    json_t *pa = json_array();
    for (size_t i = 0; i < v->np; i++) {
        const problem *p = &v->pv[i];
        json_t *o = json_object();
        if (p->shard >= 0) json_object_set_new(o, "shard", json_string(v->sh[p->shard].name));
        if (p->tensor) json_object_set_new(o, "tensor", json_string(p->tensor));
        if (p->element >= 0) json_object_set_new(o, "element", json_integer(p->element));
        if (p->offset != UINT64_MAX) json_object_set_new(o, "offset", json_integer((json_int_t)p->offset));
        json_object_set_new(o, "message", json_string(p->msg));
        json_array_append_new(pa, o);
    }
    json_object_set_new(j, "problems", pa);
    int bad = json_dump_file(j, path, JSON_INDENT(1));
    json_decref(j);
    return bad;
}

int verify_run(const verify_options *o) {
    verifier v = {.o = o, .chunk = o->chunk_kib && o->chunk_kib % 4 == 0 ? (uint64_t)o->chunk_kib << 10 : (uint64_t)8 << 20};
    expect_line *ex = NULL;
    int n_ex = 0, status = EXIT_RUNTIME_;
    if (o->expect_path && (n_ex = parse_expect(o->expect_path, &ex)) < 0) return EXIT_PROBLEMS_;
    size_t dl = strlen(o->model_dir);
    while (dl > 1 && o->model_dir[dl - 1] == '/') dl--;
    if (!(v.dir = strndup(o->model_dir, dl))) goto out;
    int sha = o->sha256 || o->expect_path;

    k3_config cfg;
    k3_error e = {0};
    int cfg_ok = config_load(v.dir, &cfg, &e) == 0;
    if (!cfg_ok) add_problem(&v, 0, -1, NULL, -1, UINT64_MAX, "%s", e.msg);
    json_t *index = NULL;
    check_structure(&v, &index);
    json_decref(index);
    int schema_checked = 0;
    if (cfg_ok && !v.oom) {
        /* every tensor of the layer schema, all problems; then, when all is sound, the
         * engine's loader itself (anything else it would refuse) */
        fprintf(stderr, "k3: verify: checking every tensor's presence, dtype and shape against config.json (layer schema)\n");
        int unreadable = 0;
        for (int i = 0; i < v.n_shards; i++) unreadable |= !v.sh[i].header_ok;
        v.note_missing = unreadable;
        check_schema(&v, &cfg, unreadable);
        schema_checked = 1;
    }
    if (cfg_ok) config_free(&cfg);
    uint64_t n_tensors = 0;
    for (int i = 0; i < v.n_shards; i++) n_tensors += v.sh[i].header_ok ? v.sh[i].f.n_tensors : 0;
    fprintf(stderr, "k3: verify: reading %d shard(s), %llu tensors%s\n", v.n_shards, (unsigned long long)n_tensors,
            sha ? ", with SHA-256" : "");
    double secs = 0;
    if (v.oom || data_pass(&v, &secs)) { fprintf(stderr, "k3: verify: out of memory or cannot start threads\n"); goto out; }
    report_values(&v);
    if (cfg_ok && v.np == 0 && !v.oom) { /* all sound so far: the engine's loader must agree (anything else it refuses) */
        k3_model m;
        k3_error me = {0};
        if (model_load(v.dir, &m, &me)) add_problem(&v, 0, -1, NULL, -1, UINT64_MAX, "loader: %s", me.msg);
        else model_free(&m);
    }
    if (o->expect_path) check_digests(&v, ex, n_ex);
    if (v.oom) { fprintf(stderr, "k3: verify: out of memory\n"); goto out; }
    if (v.np) qsort(v.pv, v.np, sizeof *v.pv, cmp_problem);

    printf("k3 verify %s: %d shard(s), %llu tensors, %.3f GB read in %.2f s (%.2f GB/s, %s, %d threads)\n", v.dir, v.n_shards,
           (unsigned long long)n_tensors, v.bytes_done / 1e9, secs, secs > 0 ? v.bytes_done / secs / 1e9 : 0.0,
           v.any_direct ? (v.any_buffered ? "O_DIRECT and buffered" : "O_DIRECT") : "buffered", v.n_threads);
    if (sha) {
        printf("SHA-256 (sha256sum format):\n");
        for (int i = 0; i < v.n_shards; i++)
            if (v.sh[i].hashed) printf("%s  %s\n", v.sh[i].hex, v.sh[i].name);
    }
    if (!schema_checked) printf("note: the presence/dtype/shape check against config.json was skipped: config.json is refused\n");
    if (v.note_missing) printf("note: missing tensors are not listed while a shard is missing or unreadable (see below)\n");
    fputs(v.note_unused, stdout);
    for (size_t i = 0; i < v.np; i++) printf("PROBLEM: %s\n", v.pv[i].msg);
    if (v.np) printf("k3 verify: %zu problem(s) found: this checkpoint would be refused or give wrong results\n", v.np);
    else printf("k3 verify: OK: every header, index entry, dtype/shape, scale byte and float value checked%s\n",
                o->expect_path ? ", every digest matches" : "");
    status = v.np ? EXIT_PROBLEMS_ : EXIT_OK_;
    if (o->json_path && write_json(&v, o->json_path, schema_checked, secs, n_tensors)) {
        fprintf(stderr, "k3: cannot write %s\n", o->json_path);
        status = EXIT_RUNTIME_;
    }
out:
    for (int k = 0; k < n_ex; k++) free(ex[k].name);
    free(ex);
    for (int i = 0; i < v.n_shards; i++) {
        vshard *s = &v.sh[i];
        if (s->fd >= 0) close(s->fd);
        safetensors_free(&s->f);
        free(s->ts);
        free(s->name);
        free(s->path);
        free(s->expect);
    }
    free(v.sh);
    free(v.refs);
    for (size_t i = 0; i < v.np; i++) { free(v.pv[i].msg); free(v.pv[i].tensor); }
    free(v.pv);
    for (int b = 0; v.bufs && b < v.n_bufs; b++) free(v.bufs[b].data);
    free(v.bufs);
    free(v.dir);
    return status;
}
