/* expert_cache.c - expert cache (LRU / LFU / predicted-hit eviction) with an O_DIRECT reader (see expert_cache.h).
 * The policies are modelled exactly by scripts/sim_expert_cache.py (same tie rules, same arithmetic). */
#define _GNU_SOURCE
#include "workers/expert_cache.h"
#include "common/layer_schema.h"
#include "common/direct_read.h"
#include "common/mono_clock.h"
#include "common/weight_mem.h"
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <numa.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define IO_ALIGN DIRECT_ALIGN

enum { SLOT_EMPTY, SLOT_READING, SLOT_READY };

/* lfu: all counts are halved every LFU_AGE x n_slots uses */
#define LFU_AGE 16
/* phit: rate average weight, age buckets, rate buckets, statistics halved after this many opportunities */
#define PHIT_ALPHA 0.05
#define PHIT_AGES 12
#define PHIT_RATES 15
#define PHIT_DECAY 4194304.0
#define PHIT_CELLS (PHIT_AGES * PHIT_RATES)
static const double phit_edges[PHIT_RATES - 1] = {0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15,
                                                   0.2,  0.3,  0.4,   0.5,  0.6,   0.7, 0.85};

/* What the policies remember of one (layer, expert), resident or not. */
typedef struct {
    uint64_t stamp;  /* clock of the last use */
    uint64_t cycle;  /* forward pass of the last use */
    double rate;     /* phit: uses per pass (exponential average), as of the last use */
    uint32_t count;  /* lfu: uses, halved by aging */
    uint16_t used;   /* 0: never used */
    uint16_t rclass; /* phit: rate class of `rate` */
} key_state;

typedef struct {
    int state, pins, layer, expert;
    int checked;          /* its scales were checked (once per read: the bytes do not change after) */
    int lanes;            /* its codes were repacked into the lane layout (the matrices c->lanes names) */
    int async;            /* READING through the pool: rd is in flight */
    int hint;             /* read for a hint, not used since */
    int evict_first;      /* a hint its layer's request did not ask for: the first to go */
    dr_read *rd;          /* its pool read: c->rds[slot], apart so that a scan of the slots stays dense */
    int32_t ix_prev, ix_next; /* phit's victim index: the slot's neighbours in its layer's list, -1 none */
    int32_t h_prev, h_next;   /* the list of hinted slots (hint set): neighbours, -1 none */
    int16_t ix_cell;      /* phit's victim index: its cell (age bucket x PHIT_RATES + rate class), -1 not indexed */
    int32_t hp_pos;       /* lru/lfu's victim heap: its position, -1 not in it */
    uint64_t last_use;
    uint8_t *buf;
    const uint8_t *data;  /* start of the expert's bytes inside buf */
} cache_slot;

/* a slot taken for an expert the synchronous prefetch reads, and where it is read from */
typedef struct { cache_slot *slot; const expert_loc *loc; } miss;

struct expert_cache {
    const expert_store *st;
    checkpoint *ck;
    size_t n_slots;
    uint64_t slot_bytes;
    cache_slot *slots;
    dr_read *rds;         /* [n_slots] */
    int *direct_fd;       /* per shard: O_DIRECT fd, -1 not opened, -2 refused */
    int node, direct_ok, warned;
    uint64_t clock;
    expert_cache_stats stats;
    uint8_t *arena;
    size_t arena_bytes;
    /* lookups without a scan (a resident K3 server holds tens of thousands of slots) */
    uint32_t *slot_of;    /* [n_layers * n_experts]: 1 + the index of the slot last given that key, 0 none;
                           * a hint, checked against the slot (at most one non-EMPTY slot holds a key) */
    size_t n_empty;       /* EMPTY slots */
    size_t empty_lo;      /* no slot below this index is EMPTY */
    size_t hints_out;     /* slots with the hint flag set: the list from hint_head */
    size_t evict_firsts;  /* of them, with evict_first set */
    int32_t hint_head;    /* first hinted slot, -1 none */
    /* policy state */
    cache_policy policy;
    int n_layers, n_experts;
    size_t n_owned;       /* the experts of the store (a slot each: a resident run) */
    key_state *keys;      /* [n_layers * n_experts] */
    uint8_t *in_request;  /* [n_experts] scratch */
    miss *pf_miss;        /* [n_slots] scratch of the synchronous prefetch: a request's misses */
    cache_slot **pf_hit;  /* [n_slots] and its hits (at most n_slots - 1 of either) */
    uint64_t cycle;       /* forward passes seen: a request whose layer is not above the last one starts a pass */
    int cur_layer;
    uint64_t lfu_since;
    double phit_use[PHIT_AGES][PHIT_RATES], phit_opp[PHIT_AGES][PHIT_RATES], phit_nopp;
    /* phit's victim index (kept whatever the policy): every READY, unpinned, unhinted slot (the
     * policy's middle class, the only one when no hint is out) by cell = (age bucket, rate class)
     * and layer, so that a victim is found from the 180 cells' estimates and the layers in
     * come-round order instead of a scan of every slot */
    uint64_t *ix_bits;    /* [PHIT_CELLS][n_layers][ix_words]: bit e = expert e's slot is in the cell */
    uint32_t *ix_count;   /* [PHIT_CELLS][n_layers] */
    size_t ix_cell_n[PHIT_AGES * PHIT_RATES];
    int32_t *ix_head;     /* [n_layers]: first indexed slot of the layer, -1 none */
    size_t ix_words;
    /* lru/lfu's victim heap (kept only while one of them is the policy; rebuilt when it is set and
     * after lfu's aging): the same slots as phit's index, a binary min-heap by evict_key_of */
    int32_t *hp;          /* [n_slots]: slot indices */
    size_t hp_n;
    int verify;           /* expert_cache_set_verify: every indexed choice checked against a scan */
    uint64_t verify_checks, verify_failures;
    /* several reads in flight (expert_cache_set_readers) */
    dr_pool *pool;
    int32_t *req;         /* [n_experts]: the current request's experts in acquire order */
    size_t req_n, req_next; /* req[req_next..] not started yet */
    size_t req_acq;         /* req[..req_acq) acquired (expert_batch_run acquires in the list's order) */
    int req_layer;
    int lanes[3];         /* expert_cache_set_lanes: w1, w2, w3 repacked into the lane layout (resident runs) */
};

/* lru/lfu's victim heap (below) */
static void hp_sync(expert_cache *c, cache_slot *s);
static void hp_remove(expert_cache *c, cache_slot *s);
static void hp_rebuild(expert_cache *c);

uint64_t expert_cache_slot_bytes(const expert_store *st) {
    return ls_buffer_bytes(st->expert_bytes); /* the size the memory plan gives a slot */
}

expert_cache *expert_cache_create(const expert_store *st, checkpoint *ck, uint64_t budget, int node, k3_error *err) {
    uint64_t sb = expert_cache_slot_bytes(st);
    if (budget < sb) {
        k3_fail(err, "expert cache budget %llu bytes is below one expert slot (%llu bytes)", (unsigned long long)budget,
                (unsigned long long)sb);
        return NULL;
    }
    expert_cache *c = calloc(1, sizeof *c);
    if (!c) { k3_fail(err, "out of memory"); return NULL; }
    c->st = st;
    c->ck = ck;
    c->slot_bytes = sb;
    c->n_slots = (size_t)(budget / sb);
    c->node = node;
    c->direct_ok = 1;
    c->policy = CACHE_POLICY_DEFAULT;
    c->n_layers = st->n_layers;
    c->n_experts = st->n_experts;
    c->cur_layer = -1;
    for (int l = 0; l < st->n_layers; l++)
        for (int e = 0; e < st->n_experts; e++) c->n_owned += expert_store_loc(st, l, e) != NULL;
    c->slots = calloc(c->n_slots, sizeof *c->slots);
    c->rds = calloc(c->n_slots ? c->n_slots : 1, sizeof *c->rds);
    c->direct_fd = malloc((size_t)ck->n_shards * sizeof *c->direct_fd);
    c->keys = calloc((size_t)st->n_layers * (size_t)st->n_experts + 1, sizeof *c->keys);
    c->in_request = calloc((size_t)st->n_experts + 1, 1);
    c->slot_of = calloc((size_t)st->n_layers * (size_t)st->n_experts + 1, sizeof *c->slot_of);
    c->ix_words = ((size_t)st->n_experts + 63) / 64;
    c->ix_bits = calloc((size_t)PHIT_CELLS * (size_t)st->n_layers * c->ix_words + 1, sizeof *c->ix_bits);
    c->ix_count = calloc((size_t)PHIT_CELLS * (size_t)st->n_layers + 1, sizeof *c->ix_count);
    c->ix_head = malloc(((size_t)st->n_layers + 1) * sizeof *c->ix_head);
    c->hp = malloc((c->n_slots + 1) * sizeof *c->hp);
    c->pf_miss = malloc((c->n_slots + 1) * sizeof *c->pf_miss);
    c->pf_hit = malloc((c->n_slots + 1) * sizeof *c->pf_hit);
    c->n_empty = c->n_slots;
    c->arena_bytes = c->n_slots * sb;
    if (node >= 0 && numa_available() >= 0) c->arena = numa_alloc_onnode(c->arena_bytes, node);
    else c->arena = weight_mem_alloc(c->arena_bytes); /* 2 MiB aligned, huge pages */
    if (!c->slots || !c->rds || !c->direct_fd || !c->arena || !c->keys || !c->in_request || !c->slot_of || !c->ix_bits ||
        !c->ix_count || !c->ix_head || !c->hp || !c->pf_miss || !c->pf_hit || c->n_slots >= INT32_MAX) {
        k3_fail(err, "cannot allocate an expert cache of %zu slots (%llu bytes)", c->n_slots, (unsigned long long)c->arena_bytes);
        expert_cache_free(c);
        return NULL;
    }
    for (int s = 0; s < ck->n_shards; s++) c->direct_fd[s] = -1;
    for (size_t i = 0; i < c->n_slots; i++) {
        c->slots[i].buf = c->arena + i * sb;
        c->slots[i].rd = &c->rds[i];
        c->slots[i].ix_cell = -1;
        c->slots[i].hp_pos = -1;
        c->slots[i].ix_prev = c->slots[i].ix_next = -1;
        c->slots[i].h_prev = c->slots[i].h_next = -1;
    }
    c->hint_head = -1;
    for (int l = 0; l < st->n_layers; l++) c->ix_head[l] = -1;
    return c;
}

void expert_cache_free(expert_cache *c) {
    if (!c) return;
    dr_pool_free(c->pool); /* waits for the reads in flight into the arena */
    free(c->req);
    if (c->direct_fd)
        for (int s = 0; s < c->ck->n_shards; s++)
            if (c->direct_fd[s] >= 0) close(c->direct_fd[s]);
    if (c->arena) {
        if (c->node >= 0 && numa_available() >= 0) numa_free(c->arena, c->arena_bytes);
        else weight_mem_free(c->arena);
    }
    free(c->slots);
    free(c->rds);
    free(c->direct_fd);
    free(c->keys);
    free(c->in_request);
    free(c->slot_of);
    free(c->ix_bits);
    free(c->ix_count);
    free(c->ix_head);
    free(c->hp);
    free(c->pf_miss);
    free(c->pf_hit);
    free(c);
}

size_t expert_cache_slots(const expert_cache *c) { return c->n_slots; }
int expert_cache_direct_io(const expert_cache *c) { return c->direct_ok; }
expert_cache_stats expert_cache_get_stats(const expert_cache *c) { return c->stats; }

static int direct_fd_for(expert_cache *c, int shard) {
    if (c->direct_fd[shard] == -1) {
        int fd = direct_open(c->ck->shards[shard].file.path);
        c->direct_fd[shard] = fd >= 0 ? fd : -2;
    }
    return c->direct_fd[shard];
}

/* Reads one expert into slot s. Thread-safe w.r.t. other slots (no shared writes except the
 * one-time opening of descriptors: O_DIRECT ones before the parallel section, buffered ones
 * under a critical section). */
static int read_expert(expert_cache *c, cache_slot *s, const expert_loc *loc, int use_direct, k3_error *err) {
    if (loc->contiguous) { /* one run: O_DIRECT window (common/direct_read), buffered when refused */
        int shard = loc->t[0]->shard, dfd = use_direct ? c->direct_fd[shard] : -1, refused = 0, rc = -1;
        const char *path = c->ck->shards[shard].file.path;
        const uint8_t *d;
        if (dfd >= 0) rc = direct_read(path, dfd, -1, loc->run_begin, loc->run_end - loc->run_begin, s->buf, &d, &refused, NULL, err);
        if (dfd < 0 || refused) {
            int bfd;
#pragma omp critical(k3_cache_shard_open) /* checkpoint_shard_fd opens shards lazily: one at a time */
            bfd = checkpoint_shard_fd(c->ck, shard, err);
            if (bfd < 0) return -1;
            rc = direct_read(path, -1, bfd, loc->run_begin, loc->run_end - loc->run_begin, s->buf, &d, NULL, NULL, err);
        }
        if (rc) return -1;
        s->data = d;
        return 0;
    }
    /* not contiguous: tensor by tensor, packed back to back in the slot (buffered) */
    uint64_t off = 0;
    for (int p = 0; p < EXPERT_NT; p++) {
        const st_tensor *t = loc->t[p]->t;
        int fd;
#pragma omp critical(k3_cache_shard_open)
        fd = checkpoint_shard_fd(c->ck, loc->t[p]->shard, err);
        if (fd < 0) return -1;
        char what[300];
        snprintf(what, sizeof what, "tensor '%s'", loc->t[p]->name);
        const uint8_t *d;
        if (direct_read(c->ck->shards[loc->t[p]->shard].file.path, -1, fd, t->begin, t->end - t->begin, s->buf + off, &d,
                        NULL, what, err))
            return -1;
        off += t->end - t->begin;
    }
    s->data = s->buf;
    return 0;
}

/* Weights of a READY slot. */
static void slot_weights(const expert_cache *c, const cache_slot *s, const expert_loc *loc, expert_weights *w) {
    if (loc->contiguous) { expert_weights_from_run(c->st, loc, s->data, w); return; }
    const uint8_t *part[EXPERT_NT];
    uint64_t off = 0;
    for (int p = 0; p < EXPERT_NT; p++) {
        part[p] = s->data + off;
        off += loc->t[p]->t->end - loc->t[p]->t->begin;
    }
    w->w1 = (mxfp4_weight){c->st->I, c->st->L, part[EXPERT_W1_P], part[EXPERT_W1_S], 0};
    w->w2 = (mxfp4_weight){c->st->L, c->st->I, part[EXPERT_W2_P], part[EXPERT_W2_S], 0};
    w->w3 = (mxfp4_weight){c->st->I, c->st->L, part[EXPERT_W3_P], part[EXPERT_W3_S], 0};
}

/* The weights of a READY slot as the kernels take them: slot_weights, with the layout flag of
 * each matrix the slot's repack rewrote. */
static void slot_operands(const expert_cache *c, const cache_slot *s, const expert_loc *loc, expert_weights *w) {
    slot_weights(c, s, loc, w);
    if (!s->lanes) return;
    w->w1.lanes = c->lanes[0];
    w->w2.lanes = c->lanes[1];
    w->w3.lanes = c->lanes[2];
}

/* Rewrites a checked slot's codes into the lane layout for the matrices c->lanes names, in place
 * (the bytes are the slot's own buffer: data points into buf). Only in a resident run: there an
 * expert is read once and used for every token, while a streamed slot is used about once per
 * read and the repack (~0.1 ms per MB on one core) would cost more than it buys. */
static void slot_repack(expert_cache *c, cache_slot *s, const expert_loc *loc) {
    if (s->lanes || !(c->lanes[0] || c->lanes[1] || c->lanes[2]) || c->n_slots < c->n_owned) return;
    expert_weights w;
    slot_weights(c, s, loc, &w);
    const mxfp4_weight *m[3] = {&w.w1, &w.w2, &w.w3};
    const double t0 = k3_now_s();
    for (int i = 0; i < 3; i++)
        if (c->lanes[i]) mxfp4_repack_lanes(s->buf + (m[i]->packed - s->buf), m[i]->rows, m[i]->cols);
    s->lanes = 1;
    c->stats.repacked++;
    c->stats.repack_s += k3_now_s() - t0;
}

void expert_cache_set_lanes(expert_cache *c, const kernels *k) {
    c->lanes[0] = c->lanes[2] = matmul_mxfp4_lanes_wanted(k, c->st->L);
    c->lanes[1] = matmul_mxfp4_lanes_wanted(k, c->st->I);
}

/* ---- policies ---- */

static const char *const policy_names[CACHE_POLICY_COUNT] = {"lru", "lfu", "phit"};

int cache_policy_parse(const char *name, cache_policy *out) {
    for (int p = 0; name && p < CACHE_POLICY_COUNT; p++)
        if (!strcmp(name, policy_names[p])) { *out = (cache_policy)p; return 0; }
    return -1;
}

const char *cache_policy_name(cache_policy p) { return (unsigned)p < CACHE_POLICY_COUNT ? policy_names[p] : "?"; }

void expert_cache_set_policy(expert_cache *c, cache_policy p) {
    if ((unsigned)p >= CACHE_POLICY_COUNT) return;
    c->policy = p;
    hp_rebuild(c);
}

void expert_cache_set_verify(expert_cache *c, int on) { c->verify = on != 0; }
uint64_t expert_cache_verify_failures(const expert_cache *c, uint64_t *checks) {
    if (checks) *checks = c->verify_checks;
    return c->verify_failures;
}

cache_policy expert_cache_get_policy(const expert_cache *c) { return c->policy; }

static key_state *key_of(expert_cache *c, int layer, int expert) {
    return &c->keys[(size_t)layer * (size_t)c->n_experts + (size_t)expert];
}

/* passes since the last use -> 0..11: 1,2,3,4, 5-6,7-8, 9-12,13-16, 17-32,33-64,65-128, 129+ */
static int phit_age_bucket(uint64_t a) {
    if (a <= 4) return a ? (int)a - 1 : 0;
    if (a <= 8) return 4 + (int)(a - 5) / 2;
    if (a <= 16) return 6 + (int)(a - 9) / 4;
    int b = 8;
    for (uint64_t lim = 32; a > lim && b < PHIT_AGES - 1; lim *= 2) b++;
    return b;
}

static int phit_rate_class(double r) {
    int k = 0;
    for (int i = 0; i < PHIT_RATES - 1; i++) k += r >= phit_edges[i];
    return k;
}

/* phit's cell of slot s: its age bucket (passes since its last use, one more once its layer
 * has come round in this pass) and its rate class. The one definition evict_key_of and the
 * victim index use. */
static int phit_cell_of(expert_cache *c, const cache_slot *s) {
    const key_state *k = key_of(c, s->layer, s->expert);
    uint64_t a = c->cycle - k->cycle + (s->layer > c->cur_layer ? 0 : 1);
    return phit_age_bucket(a) * PHIT_RATES + k->rclass;
}

/* ---- phit's victim index ---- */

static size_t ix_at(const expert_cache *c, int cell, int layer) { return (size_t)cell * (size_t)c->n_layers + (size_t)layer; }

/* Moves indexed slot s from its cell to `cell` (same layer list). */
static void ix_move(expert_cache *c, cache_slot *s, int cell) {
    uint64_t bit = 1ull << (s->expert % 64);
    size_t w = (size_t)s->expert / 64, from = ix_at(c, s->ix_cell, s->layer), to = ix_at(c, cell, s->layer);
    c->ix_bits[from * c->ix_words + w] &= ~bit;
    c->ix_count[from]--;
    c->ix_cell_n[s->ix_cell]--;
    c->ix_bits[to * c->ix_words + w] |= bit;
    c->ix_count[to]++;
    c->ix_cell_n[cell]++;
    s->ix_cell = (int16_t)cell;
}

static void ix_remove(expert_cache *c, cache_slot *s) {
    if (s->ix_cell < 0) return;
    size_t at = ix_at(c, s->ix_cell, s->layer);
    c->ix_bits[at * c->ix_words + (size_t)s->expert / 64] &= ~(1ull << (s->expert % 64));
    c->ix_count[at]--;
    c->ix_cell_n[s->ix_cell]--;
    if (s->ix_prev >= 0) c->slots[s->ix_prev].ix_next = s->ix_next;
    else c->ix_head[s->layer] = s->ix_next;
    if (s->ix_next >= 0) c->slots[s->ix_next].ix_prev = s->ix_prev;
    s->ix_prev = s->ix_next = -1;
    s->ix_cell = -1;
}

/* The cell slot s belongs in: its phit cell when READY, unpinned and unhinted, else -1 (not indexed). */
static int ix_cell_wanted(expert_cache *c, const cache_slot *s) {
    return s->state == SLOT_READY && s->pins == 0 && !s->hint && !s->evict_first ? phit_cell_of(c, s) : -1;
}

/* Slot s changed (state, pins, hint, key): in the index iff ix_cell_wanted says so, in that
 * cell (and in lru/lfu's heap likewise). Cheap when nothing changed; called after every such change. */
static void ix_sync(expert_cache *c, cache_slot *s) {
    hp_sync(c, s);
    int cell = ix_cell_wanted(c, s);
    if (cell == s->ix_cell) return;
    if (cell < 0) { ix_remove(c, s); return; }
    if (s->ix_cell >= 0) { ix_move(c, s, cell); return; }
    int32_t i = (int32_t)(s - c->slots);
    s->ix_prev = -1;
    s->ix_next = c->ix_head[s->layer];
    if (s->ix_next >= 0) c->slots[s->ix_next].ix_prev = i;
    c->ix_head[s->layer] = i;
    size_t at = ix_at(c, cell, s->layer);
    c->ix_bits[at * c->ix_words + (size_t)s->expert / 64] |= 1ull << (s->expert % 64);
    c->ix_count[at]++;
    c->ix_cell_n[cell]++;
    s->ix_cell = (int16_t)cell;
}

/* The pass count or the current layer moved from (cycle0, cur0): an age changes only for the
 * layers whose "has come round in this pass" flag or pass changed, so only their slots move
 * (each slot about once per pass). */
static void ix_age(expert_cache *c, uint64_t cycle0, int cur0) {
    for (int l = 0; l < c->n_layers; l++) {
        if (cycle0 + (l > cur0 ? 0 : 1) == c->cycle + (l > c->cur_layer ? 0 : 1)) continue;
        for (int32_t i = c->ix_head[l]; i >= 0; i = c->slots[i].ix_next) {
            cache_slot *s = &c->slots[i];
            int cell = phit_cell_of(c, s);
            if (cell != s->ix_cell) ix_move(c, s, cell);
        }
    }
}

/* phit's choice among the indexed slots (the middle class), as the scan would make it: the
 * lowest estimate over the non-empty cells; among the cells that tie on it, the layer that comes
 * round last, then the lowest expert. NULL when nothing is indexed. */
static cache_slot *ix_victim(expert_cache *c) {
    double v[PHIT_CELLS], bv = 0.0;
    int tied[PHIT_CELLS], nt = 0, any = 0;
    for (int x = 0; x < PHIT_CELLS; x++) {
        if (!c->ix_cell_n[x]) continue;
        int b = x / PHIT_RATES, r = x % PHIT_RATES;
        v[x] = (c->phit_use[b][r] + 1.0) / (c->phit_opp[b][r] + 2.0);
        if (!any || v[x] < bv) bv = v[x];
        any = 1;
    }
    if (!any) return NULL;
    for (int x = 0; x < PHIT_CELLS; x++)
        if (c->ix_cell_n[x] && v[x] == bv) tied[nt++] = x;
    int n = c->n_layers;
    for (int d = n; d >= 1; d--) { /* d as evict_key_of counts it: n for the current layer */
        int l = (int)((((long)c->cur_layer + d) % n + n) % n);
        int hit = 0;
        for (int t = 0; t < nt && !hit; t++) hit = c->ix_count[ix_at(c, tied[t], l)] != 0;
        if (!hit) continue;
        for (size_t w = 0; w < c->ix_words; w++) {
            uint64_t m = 0;
            for (int t = 0; t < nt; t++) m |= c->ix_bits[ix_at(c, tied[t], l) * c->ix_words + w];
            if (!m) continue;
            int e = (int)(w * 64 + (size_t)__builtin_ctzll(m));
            uint32_t i = c->slot_of[(size_t)l * (size_t)c->n_experts + (size_t)e];
            return i ? &c->slots[i - 1] : NULL;
        }
    }
    return NULL;
}

/* A request of `layer` starts (experts: all its distinct experts, or NULL when
 * only the pass count is to be kept). Counts phit's opportunities: every expert
 * of this layer used before either is used now or is not. Kept for every policy,
 * so switching policies finds the statistics ready. */
static void policy_begin(expert_cache *c, int layer, const int32_t *experts, size_t n) {
    uint64_t cycle0 = c->cycle;
    int cur0 = c->cur_layer;
    if (layer <= c->cur_layer) c->cycle++;
    c->cur_layer = layer;
    ix_age(c, cycle0, cur0);
    if (!experts || layer < 0 || layer >= c->n_layers) return;
    for (size_t i = 0; i < n; i++)
        if (experts[i] >= 0 && experts[i] < c->n_experts) c->in_request[experts[i]] = 1;
    for (int e = 0; e < c->n_experts; e++) {
        const key_state *k = key_of(c, layer, e);
        if (!k->used || c->cycle <= k->cycle) continue;
        int b = phit_age_bucket(c->cycle - k->cycle), r = k->rclass;
        c->phit_opp[b][r] += 1;
        if (c->in_request[e]) c->phit_use[b][r] += 1;
        c->phit_nopp += 1;
    }
    for (size_t i = 0; i < n; i++)
        if (experts[i] >= 0 && experts[i] < c->n_experts) c->in_request[experts[i]] = 0;
    if (c->phit_nopp >= PHIT_DECAY) {
        c->phit_nopp = 0;
        for (int b = 0; b < PHIT_AGES; b++)
            for (int r = 0; r < PHIT_RATES; r++) { c->phit_use[b][r] *= 0.5; c->phit_opp[b][r] *= 0.5; }
    }
}

/* An expert is used (acquired) now. */
static void policy_use(expert_cache *c, cache_slot *s) {
    key_state *k = key_of(c, s->layer, s->expert);
    s->last_use = ++c->clock;
    k->stamp = c->clock;
    k->rate = k->used ? k->rate * pow(1.0 - PHIT_ALPHA, (double)(c->cycle - k->cycle)) : 0.0;
    k->rate += PHIT_ALPHA;
    k->rclass = (uint16_t)phit_rate_class(k->rate);
    k->cycle = c->cycle;
    k->used = 1;
    k->count++;
    if (++c->lfu_since >= (uint64_t)LFU_AGE * c->n_slots) {
        c->lfu_since = 0;
        size_t nk = (size_t)c->n_layers * (size_t)c->n_experts;
        for (size_t i = 0; i < nk; i++) c->keys[i].count >>= 1;
        if (c->policy == CACHE_POLICY_LFU) hp_rebuild(c); /* halving makes ties: the order can change */
    }
}

/* Eviction order of a READY unpinned slot: the slot with the smallest key goes first. */
typedef struct { double v; int64_t a, b; } evict_key;

static int evict_before(evict_key x, evict_key y) {
    if (x.v != y.v) return x.v < y.v;
    if (x.a != y.a) return x.a < y.a;
    return x.b < y.b;
}

static evict_key evict_key_of(expert_cache *c, const cache_slot *s) {
    const key_state *k = key_of(c, s->layer, s->expert);
    int64_t id = (int64_t)s->layer * c->n_experts + s->expert;
    switch (c->policy) {
    case CACHE_POLICY_LFU: /* fewest uses; ties: most recently used */
        return (evict_key){(double)k->count, -(int64_t)k->stamp, id};
    case CACHE_POLICY_PHIT: {
        /* probability of a use when its layer comes round next; ties: the layer that comes round last */
        int cell = phit_cell_of(c, s), b = cell / PHIT_RATES, r = cell % PHIT_RATES;
        int d = ((s->layer - c->cur_layer) % c->n_layers + c->n_layers) % c->n_layers;
        if (d == 0) d = c->n_layers;
        return (evict_key){(c->phit_use[b][r] + 1.0) / (c->phit_opp[b][r] + 2.0), -(int64_t)d, id};
    }
    default: /* least recently used */
        return (evict_key){0.0, (int64_t)s->last_use, id};
    }
}

/* ---- lru/lfu's victim heap ---- */

/* the heap holds slot s: lru or lfu is the policy and s is of the middle class (phit's index's rule) */
static int hp_wanted(const expert_cache *c, const cache_slot *s) {
    return c->policy != CACHE_POLICY_PHIT && s->state == SLOT_READY && s->pins == 0 && !s->hint && !s->evict_first;
}

static int hp_before(expert_cache *c, int32_t a, int32_t b) {
    return evict_before(evict_key_of(c, &c->slots[a]), evict_key_of(c, &c->slots[b]));
}

static void hp_put(expert_cache *c, size_t at, int32_t i) {
    c->hp[at] = i;
    c->slots[i].hp_pos = (int32_t)at;
}

static void hp_up(expert_cache *c, size_t at) {
    int32_t i = c->hp[at];
    while (at > 0 && hp_before(c, i, c->hp[(at - 1) / 2])) {
        hp_put(c, at, c->hp[(at - 1) / 2]);
        at = (at - 1) / 2;
    }
    hp_put(c, at, i);
}

static void hp_down(expert_cache *c, size_t at) {
    int32_t i = c->hp[at];
    for (;;) {
        size_t k = 2 * at + 1;
        if (k >= c->hp_n) break;
        if (k + 1 < c->hp_n && hp_before(c, c->hp[k + 1], c->hp[k])) k++;
        if (!hp_before(c, c->hp[k], i)) break;
        hp_put(c, at, c->hp[k]);
        at = k;
    }
    hp_put(c, at, i);
}

static void hp_remove(expert_cache *c, cache_slot *s) {
    if (s->hp_pos < 0) return;
    size_t at = (size_t)s->hp_pos;
    s->hp_pos = -1;
    int32_t last = c->hp[--c->hp_n];
    if (at == c->hp_n) return;
    hp_put(c, at, last);
    hp_up(c, at);
    hp_down(c, (size_t)c->slots[last].hp_pos);
}

/* Slot s changed: in the heap iff hp_wanted (its key changes only while it is pinned, i.e. out
 * of the heap, or by lfu's aging, which rebuilds the heap) */
static void hp_sync(expert_cache *c, cache_slot *s) {
    int want = hp_wanted(c, s);
    if (want == (s->hp_pos >= 0)) return;
    if (!want) { hp_remove(c, s); return; }
    hp_put(c, c->hp_n++, (int32_t)(s - c->slots));
    hp_up(c, c->hp_n - 1);
}

/* The heap anew from the slots (the policy was set, or lfu's counts were halved): O(slots) */
static void hp_rebuild(expert_cache *c) {
    c->hp_n = 0;
    for (size_t i = 0; i < c->n_slots; i++) {
        c->slots[i].hp_pos = -1;
        if (hp_wanted(c, &c->slots[i])) hp_put(c, c->hp_n++, (int32_t)i);
    }
    for (size_t at = c->hp_n / 2; at-- > 0;) hp_down(c, at);
}

/* verify mode: the heap holds exactly the slots it should, each where its position says, in heap order */
static int hp_consistent(expert_cache *c) {
    size_t n_in = 0;
    for (size_t i = 0; i < c->n_slots; i++) {
        const cache_slot *s = &c->slots[i];
        if (hp_wanted(c, s) != (s->hp_pos >= 0)) return 0;
        if (s->hp_pos >= 0 && ((size_t)s->hp_pos >= c->hp_n || c->hp[s->hp_pos] != (int32_t)i)) return 0;
        n_in += s->hp_pos >= 0;
    }
    for (size_t at = 1; at < c->hp_n; at++)
        if (hp_before(c, c->hp[at], c->hp[(at - 1) / 2])) return 0;
    return n_in == c->hp_n;
}

/* The slot holding (layer, expert) in any state but EMPTY, or NULL: slot_of's entry, checked
 * (a slot given another key or emptied since no longer matches). */
static cache_slot *find_any(expert_cache *c, int layer, int expert) {
    if (layer < 0 || layer >= c->n_layers || expert < 0 || expert >= c->n_experts) return NULL;
    uint32_t i = c->slot_of[(size_t)layer * (size_t)c->n_experts + (size_t)expert];
    if (!i) return NULL;
    cache_slot *s = &c->slots[i - 1];
    return s->state != SLOT_EMPTY && s->layer == layer && s->expert == expert ? s : NULL;
}

/* READY only. */
static cache_slot *find(expert_cache *c, int layer, int expert) {
    cache_slot *s = find_any(c, layer, expert);
    return s && s->state == SLOT_READY ? s : NULL;
}

/* Slot s is read for a hint: it joins the hinted slots' list. */
static void hint_on(expert_cache *c, cache_slot *s) {
    if (s->hint) return;
    int32_t i = (int32_t)(s - c->slots);
    s->hint = 1;
    s->h_prev = -1;
    s->h_next = c->hint_head;
    if (s->h_next >= 0) c->slots[s->h_next].h_prev = i;
    c->hint_head = i;
    c->hints_out++;
}

/* Slot s's hint ends (used, emptied or taken): it leaves the list, and its evict_first with it. */
static void hint_off(expert_cache *c, cache_slot *s) {
    if (s->evict_first) c->evict_firsts--;
    s->evict_first = 0;
    if (!s->hint) return;
    if (s->h_prev >= 0) c->slots[s->h_prev].h_next = s->h_next;
    else c->hint_head = s->h_next;
    if (s->h_next >= 0) c->slots[s->h_next].h_prev = s->h_prev;
    s->h_prev = s->h_next = -1;
    s->hint = 0;
    c->hints_out--;
}

/* Slot s becomes EMPTY (a failed read). */
static void set_empty(expert_cache *c, cache_slot *s) {
    if (s->state != SLOT_EMPTY) {
        size_t i = (size_t)(s - c->slots);
        c->n_empty++;
        if (i < c->empty_lo) c->empty_lo = i;
    }
    hint_off(c, s);
    s->state = SLOT_EMPTY;
    s->pins = 0;
    ix_sync(c, s);
}

/* A hinted slot is used: it is an ordinary slot from now on. */
static void hint_used(expert_cache *c, cache_slot *s) {
    if (!s->hint) return;
    hint_off(c, s);
    c->stats.hint_hits++;
    ix_sync(c, s);
}

static void pin(expert_cache *c, cache_slot *s) {
    s->pins++;
    ix_sync(c, s);
}

static void unpin(expert_cache *c, cache_slot *s) {
    if (s->pins > 0) s->pins--;
    ix_sync(c, s);
}

/* A slot's read ended well. */
static void set_ready(expert_cache *c, cache_slot *s) {
    s->state = SLOT_READY;
    ix_sync(c, s);
}

/* An EMPTY slot, else among READY unpinned slots: a hint its request did not ask for, then the
 * policy's choice among the rest, then (not for_hint) a pending hint of another layer; NULL if none.
 * Without hints every slot is of the middle class: the policy alone decides, as before. */
static cache_slot *victim_scan(expert_cache *c, int for_hint) {
    cache_slot *best = NULL;
    evict_key bk = {0};
    int bc = 0;
    for (size_t i = 0; i < c->n_slots; i++) {
        cache_slot *s = &c->slots[i];
        if (s->state != SLOT_READY || s->pins != 0) continue;
        int cls = s->evict_first ? 0 : s->hint ? 2 : 1;
        if (for_hint && cls == 2) continue;
        evict_key k = evict_key_of(c, s);
        if (!best || cls < bc || (cls == bc && evict_before(k, bk))) { best = s; bk = k; bc = cls; }
    }
    return best;
}

/* verify mode: every slot is in the index iff it should be, in its current cell */
static int ix_consistent(expert_cache *c) {
    size_t n_in = 0;
    for (size_t i = 0; i < c->n_slots; i++) {
        const cache_slot *s = &c->slots[i];
        int cell = ix_cell_wanted(c, s);
        if (cell != s->ix_cell) return 0;
        n_in += cell >= 0;
    }
    size_t n_cells = 0, n_hints = 0, n_first = 0, n_hint_flags = 0;
    for (int x = 0; x < PHIT_CELLS; x++) n_cells += c->ix_cell_n[x];
    for (int32_t i = c->hint_head; i >= 0 && n_hints <= c->n_slots; i = c->slots[i].h_next) {
        n_hints++;
        n_first += c->slots[i].evict_first != 0;
        if (!c->slots[i].hint) return 0;
    }
    for (size_t i = 0; i < c->n_slots; i++) n_hint_flags += c->slots[i].hint != 0;
    return n_cells == n_in && n_hints == c->hints_out && n_hint_flags == n_hints && n_first == c->evict_firsts;
}

/* Among READY unpinned hinted slots with evict_first == first: the policy's choice (the scan's
 * order within a class). O(hints out). */
static cache_slot *hint_victim(expert_cache *c, int first) {
    if (first ? !c->evict_firsts : c->hints_out == c->evict_firsts) return NULL;
    cache_slot *best = NULL;
    evict_key bk = {0};
    for (int32_t i = c->hint_head; i >= 0; i = c->slots[i].h_next) {
        cache_slot *s = &c->slots[i];
        if (s->state != SLOT_READY || s->pins != 0 || s->evict_first != first) continue;
        evict_key k = evict_key_of(c, s);
        if (!best || evict_before(k, bk)) { best = s; bk = k; }
    }
    return best;
}

static cache_slot *victim_for(expert_cache *c, int for_hint) {
    if (c->n_empty) /* the first EMPTY slot in index order, found from the cursor */
        for (size_t i = c->empty_lo; i < c->n_slots; i++)
            if (c->slots[i].state == SLOT_EMPTY) { c->empty_lo = i; return &c->slots[i]; }
    /* the middle class is in phit's index or lru/lfu's heap; the hint classes (first: hints their
     * request did not ask for; last, not for a hint: pending hints of other layers) are in the hint list */
    cache_slot *s = hint_victim(c, 1);
    if (!s) s = c->policy == CACHE_POLICY_PHIT ? ix_victim(c) : c->hp_n ? &c->slots[c->hp[0]] : NULL;
    if (!s && !for_hint) s = hint_victim(c, 0);
    if (c->verify) {
        c->verify_checks++;
        if (s != victim_scan(c, for_hint) || !ix_consistent(c) || !hp_consistent(c)) c->verify_failures++;
    }
    return s;
}

static cache_slot *victim(expert_cache *c) { return victim_for(c, 0); }

/* The slot s is taken for (layer, expert): a hint never used counts as wasted. */
static void take(expert_cache *c, cache_slot *s, int layer, int expert, int pins) {
    if (s->state == SLOT_READY && s->hint) c->stats.hint_wasted++;
    hint_off(c, s);
    if (s->state == SLOT_EMPTY) c->n_empty--;
    ix_remove(c, s);
    hp_remove(c, s);
    *s = (cache_slot){.state = SLOT_READING, .pins = pins, .layer = layer, .expert = expert, .buf = s->buf, .rd = s->rd,
                      .ix_prev = -1, .ix_next = -1, .h_prev = -1, .h_next = -1, .ix_cell = -1, .hp_pos = -1};
    c->slot_of[(size_t)layer * (size_t)c->n_experts + (size_t)expert] = (uint32_t)(s - c->slots) + 1;
}

static void open_direct_fds(expert_cache *c, const expert_loc *loc) {
    if (c->direct_ok && loc->contiguous && direct_fd_for(c, loc->t[0]->shard) == -2) {
        c->direct_ok = 0;
        if (!c->warned) {
            fprintf(stderr, "k3-expertd: O_DIRECT refused for %s; using buffered reads\n", c->ck->shards[loc->t[0]->shard].file.path);
            c->warned = 1;
        }
    }
}

/* ---- several reads in flight ---- */

int expert_cache_set_readers(expert_cache *c, int n, k3_error *err) {
    if (n <= 0 || c->pool) return 0;
    if (!(c->req = malloc(((size_t)c->n_experts + 1) * sizeof *c->req))) return k3_fail(err, "out of memory");
    if (!(c->pool = dr_pool_create(n, DR_PIECE_DEFAULT, err))) return -1;
    return 0;
}

int expert_cache_readers(const expert_cache *c) { return dr_pool_threads(c->pool); }

/* Starts reading the expert of slot s (READING, layer/expert set): through the pool when the
 * run is one O_DIRECT range, else here and now. 0, or -1 with err (slot EMPTY). */
static int start_read(expert_cache *c, cache_slot *s, const expert_loc *loc, int urgent, k3_error *err) {
    open_direct_fds(c, loc);
    if (c->pool && c->direct_ok && loc->contiguous) {
        int shard = loc->t[0]->shard;
        *s->rd = (dr_read){.path = c->ck->shards[shard].file.path, .dfd = c->direct_fd[shard], .bfd = -1,
                          .off = loc->run_begin, .len = loc->run_end - loc->run_begin, .buf = s->buf};
        dr_submit(c->pool, s->rd, urgent);
        s->async = 1;
        return 0;
    }
    double t0 = k3_now_s();
    int rc = read_expert(c, s, loc, c->direct_ok, err);
    c->stats.read_wait_s += k3_now_s() - t0;
    if (rc) { set_empty(c, s); return -1; }
    set_ready(c, s);
    return 0;
}

/* Waits for slot s's read (if any) to end. 0: READY; -1 with err: the slot is EMPTY. */
static int finish_read(expert_cache *c, cache_slot *s, k3_error *err) {
    if (s->state != SLOT_READING || !s->async) return 0;
    double t0 = k3_now_s();
    int rc = dr_wait(c->pool, s->rd);
    c->stats.read_wait_s += k3_now_s() - t0;
    s->async = 0;
    if (rc == 0) { s->data = s->rd->data; set_ready(c, s); return 0; }
    if (s->rd->direct_refused) { /* the kernel refused the alignment: buffered from now on */
        const expert_loc *loc = expert_store_loc(c->st, s->layer, s->expert);
        c->direct_ok = 0;
        t0 = k3_now_s();
        rc = loc ? read_expert(c, s, loc, 0, err) : k3_fail(err, "internal: slot of an unknown expert");
        c->stats.read_wait_s += k3_now_s() - t0;
        if (rc == 0) { set_ready(c, s); return 0; }
    } else k3_fail(err, "%s", s->rd->err.msg);
    set_empty(c, s);
    return -1;
}

/* Demand victim with readers: as victim(), else waits for a hint in flight and takes its slot. */
static cache_slot *victim_wait(expert_cache *c) {
    cache_slot *s = victim(c);
    if (!s) { /* a hint in flight (the lowest slot, as a scan finds it) */
        cache_slot *t = NULL;
        for (int32_t i = c->hint_head; i >= 0; i = c->slots[i].h_next)
            if (c->slots[i].state == SLOT_READING && c->slots[i].pins == 0 && (!t || &c->slots[i] < t)) t = &c->slots[i];
        if (t) {
            k3_error ignored = {0};
            finish_read(c, t, &ignored); /* a failed hint: the slot is EMPTY, which is fine here */
            s = t;
        }
    }
    for (size_t i = 0; !s && i < c->n_slots; i++) { /* none: any read in flight that nothing pins */
        cache_slot *t = &c->slots[i];
        if (t->state == SLOT_READING && t->pins == 0) {
            k3_error ignored = {0};
            finish_read(c, t, &ignored); /* a failed hint: the slot is EMPTY, which is fine here */
            s = t;
        }
    }
    return s;
}

/* Starts the request's next experts while slots allow (each pinned for its acquire). */
static void pump(expert_cache *c) {
    while (c->req_next < c->req_n) {
        int e = c->req[c->req_next];
        cache_slot *s = find_any(c, c->req_layer, e);
        if (s) {
            if (s->pins == 0) { pin(c, s); c->stats.hits++; hint_used(c, s); }
            c->req_next++;
            continue;
        }
        const expert_loc *loc = expert_store_loc(c->st, c->req_layer, e);
        if (!loc || !(s = victim(c))) return;
        take(c, s, c->req_layer, e, 1);
        k3_error ignored = {0};
        if (start_read(c, s, loc, 1, &ignored)) return; /* its acquire reads it again and reports */
        c->stats.misses++;
        c->stats.bytes_read += c->st->expert_bytes;
        c->req_next++;
    }
}

/* The request's start with readers: pins what is resident or being read, submits the misses
 * (as many as slots allow, the rest as slots are released), returns without waiting. */
static int prefetch_async(expert_cache *c, int layer, const int32_t *experts, size_t n, k3_error *err) {
    for (size_t i = 0; i < n; i++)
        if (!expert_store_loc(c->st, layer, experts[i]))
            return k3_fail(err, "expert %d of layer %d is not owned by this worker", experts[i], layer);
    /* hints of this layer that the request does not ask for go first */
    if (c->hints_out) {
        for (size_t i = 0; i < n; i++) c->in_request[experts[i]] = 1;
        for (int32_t i = c->hint_head; i >= 0; i = c->slots[i].h_next) {
            cache_slot *s = &c->slots[i];
            if (s->state == SLOT_EMPTY || s->evict_first || s->layer != layer || c->in_request[s->expert]) continue;
            s->evict_first = 1;
            c->evict_firsts++;
        }
        for (size_t i = 0; i < n; i++) c->in_request[experts[i]] = 0;
    }
    c->req_layer = layer;
    c->req_n = n;
    c->req_next = c->req_acq = 0;
    memcpy(c->req, experts, n * sizeof *experts);
    /* pass 1: pin the resident (or arriving) experts of the first n_slots - 1 */
    size_t w = n < c->n_slots - 1 ? n : c->n_slots - 1;
    for (size_t i = 0; i < w; i++) {
        cache_slot *s = find_any(c, layer, experts[i]);
        if (!s) continue;
        pin(c, s);
        c->stats.hits++;
        hint_used(c, s);
    }
    /* pass 2: the misses among them, in file-offset order is the pool's business: in acquire order */
    size_t i = 0;
    for (; i < w; i++) {
        if (find_any(c, layer, experts[i])) continue;
        cache_slot *s = victim(c);
        if (!s) break;
        take(c, s, layer, experts[i], 1);
        if (start_read(c, s, expert_store_loc(c->st, layer, experts[i]), 1, err)) return -1;
        c->stats.misses++;
        c->stats.bytes_read += c->st->expert_bytes;
    }
    c->req_next = i; /* the rest start as slots are released (pump) */
    return 0;
}

size_t expert_cache_hint(expert_cache *c, int layer, const int32_t *experts, size_t n) {
    if (!c->pool || c->n_slots < 2) return 0;
    size_t pending = c->hints_out - c->evict_firsts, started = 0;
    for (size_t i = 0; i < n && pending < c->n_slots - 1; i++) {
        const expert_loc *loc = expert_store_loc(c->st, layer, experts[i]);
        if (!loc || !loc->contiguous || !c->direct_ok || find_any(c, layer, experts[i])) continue;
        cache_slot *s = victim_for(c, 1);
        if (!s) break;
        take(c, s, layer, experts[i], 0);
        hint_on(c, s);
        k3_error ignored = {0};
        if (start_read(c, s, loc, 0, &ignored)) continue;
        c->stats.hint_reads++;
        c->stats.bytes_read += c->st->expert_bytes;
        pending++;
        started++;
    }
    return started;
}

static int cmp_miss(const void *a, const void *b) {
    const miss *x = a, *y = b;
    if (x->loc->t[0]->shard != y->loc->t[0]->shard) return x->loc->t[0]->shard < y->loc->t[0]->shard ? -1 : 1;
    return x->loc->run_begin < y->loc->run_begin ? -1 : x->loc->run_begin > y->loc->run_begin;
}

static int cache_prefetch(void *ctx, int layer, const int32_t *experts, size_t n, k3_error *err) {
    expert_cache *c = ctx;
    policy_begin(c, layer, experts, n);
    if (c->n_slots < 2) return 0; /* one slot: everything is read on demand */
    if (c->pool) return prefetch_async(c, layer, experts, n, err);
    size_t w = n < c->n_slots - 1 ? n : c->n_slots - 1, nm = 0, nh = 0;
    miss *ms = c->pf_miss;      /* w entries at most each: sized n_slots at creation */
    cache_slot **hit = c->pf_hit;
    for (size_t i = 0; i < w; i++)
        if (!expert_store_loc(c->st, layer, experts[i]))
            return k3_fail(err, "expert %d of layer %d is not owned by this worker", experts[i], layer);
    /* pass 1: pin the resident experts, so that no miss of this request evicts them */
    for (size_t i = 0; i < w; i++) {
        cache_slot *s = find(c, layer, experts[i]);
        if (!s) continue;
        pin(c, s);
        c->stats.hits++;
        hit[nh++] = s;
    }
    /* pass 2: a slot for each miss */
    for (size_t i = 0; i < w; i++) {
        if (find_any(c, layer, experts[i])) continue; /* resident (pinned in pass 1) or already being read */
        const expert_loc *loc = expert_store_loc(c->st, layer, experts[i]);
        cache_slot *s = victim(c);
        if (!s) break;
        take(c, s, layer, experts[i], 1);
        open_direct_fds(c, loc);
        ms[nm++] = (miss){s, loc};
    }
    qsort(ms, nm, sizeof *ms, cmp_miss); /* issue reads in file-offset order */
    int failed = 0;
    k3_error first = {0};
    double t0 = k3_now_s();
#pragma omp parallel for schedule(static, 1)
    for (size_t i = 0; i < nm; i++) {
        k3_error e = {0};
        if (read_expert(c, ms[i].slot, ms[i].loc, c->direct_ok, &e)) {
#pragma omp critical
            {
                if (!failed) first = e;
                failed = 1;
            }
        }
    }
    c->stats.read_wait_s += k3_now_s() - t0;
    for (size_t i = 0; i < nm; i++) {
        cache_slot *s = ms[i].slot;
        if (failed) { set_empty(c, s); continue; }
        set_ready(c, s);
        c->stats.misses++;
        c->stats.bytes_read += c->st->expert_bytes;
    }
    if (failed)
        for (size_t i = 0; i < nh; i++) unpin(c, hit[i]); /* the batch stops: nothing will be acquired */
    if (failed) return k3_fail(err, "%s", first.msg);
    return 0;
}

static int cache_acquire(void *ctx, int layer, int expert, expert_weights *w, k3_error *err) {
    expert_cache *c = ctx;
    const expert_loc *loc = expert_store_loc(c->st, layer, expert);
    if (!loc) return k3_fail(err, "expert %d of layer %d is not owned by this worker", expert, layer);
    if (layer != c->cur_layer) policy_begin(c, layer, NULL, 0); /* used without prefetch */
    cache_slot *s = c->pool ? find_any(c, layer, expert) : find(c, layer, expert);
    if (s && s->state == SLOT_READING && finish_read(c, s, err)) return -1;
    if (s && s->pins > 0) {
        /* prefetched: its pin passes to this use (counted by the prefetch) */
    } else if (s) {
        hint_used(c, s);
        pin(c, s);
        c->stats.hits++;
    } else if (c->pool) {
        s = victim_wait(c);
        if (!s) return k3_fail(err, "expert cache: every slot is in use");
        take(c, s, layer, expert, 1);
        if (start_read(c, s, loc, 1, err) || finish_read(c, s, err)) return -1;
        c->stats.misses++;
        c->stats.bytes_read += c->st->expert_bytes;
    } else {
        s = victim(c);
        if (!s) return k3_fail(err, "expert cache: every slot is in use");
        take(c, s, layer, expert, 1);
        open_direct_fds(c, loc);
        double t0 = k3_now_s();
        int rc = read_expert(c, s, loc, c->direct_ok, err);
        c->stats.read_wait_s += k3_now_s() - t0;
        if (rc) { set_empty(c, s); return -1; }
        set_ready(c, s);
        c->stats.misses++;
        c->stats.bytes_read += c->st->expert_bytes;
    }
    if (c->pool && layer == c->req_layer && c->req_acq < c->req_n && c->req[c->req_acq] == expert) {
        c->req_acq++; /* acquired in the list's order: pump never looks back at it */
        if (c->req_next < c->req_acq) c->req_next = c->req_acq;
    }
    policy_use(c, s);
    if (!s->checked) {
        slot_weights(c, s, loc, w);
        if (expert_weights_check(w, loc, err)) return -1;
        s->checked = 1;
        slot_repack(c, s, loc);
    }
    slot_operands(c, s, loc, w);
    return 0;
}

static void cache_release(void *ctx, int layer, int expert) {
    expert_cache *c = ctx;
    cache_slot *s = find(c, layer, expert);
    if (s) unpin(c, s);
    if (c->pool && layer == c->req_layer) pump(c); /* the slot may take the request's next miss */
}

int expert_cache_preload(expert_cache *c, size_t *loaded, void (*progress)(void *ctx, size_t done, size_t total),
                         void *progress_ctx, k3_error *err) {
    *loaded = 0;
    int32_t *list = malloc(((size_t)c->n_experts + 1) * sizeof *list);
    if (!list) return k3_fail(err, "out of memory");
    size_t owned = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int e = 0; e < c->n_experts; e++) owned += expert_store_loc(c->st, l, e) != NULL;
    size_t total = owned < c->n_slots ? owned : c->n_slots, done = 0;
    expert_source src = expert_cache_source(c);
    int rc = 0;
    for (int l = 0; l < c->n_layers && done < total && !rc; l++) {
        size_t n = 0;
        for (int e = 0; e < c->n_experts && done + n < total; e++)
            if (expert_store_loc(c->st, l, e)) list[n++] = e;
        if (!n) continue;
        if (src.prefetch(src.ctx, l, list, n, err)) { rc = -1; break; }
        for (size_t i = 0; i < n; i++) {
            expert_weights w;
            if (src.acquire(src.ctx, l, list[i], &w, err)) { rc = -1; break; }
            src.release(src.ctx, l, list[i]);
            done++;
            if (progress) progress(progress_ctx, done, total);
        }
    }
    free(list);
    *loaded = done;
    return rc;
}

static int cache_ready(void *ctx, int layer, int expert) { return find(ctx, layer, expert) != NULL; }

expert_source expert_cache_source(expert_cache *c) {
    /* every expert has a slot of its own (a resident run): nothing is ever evicted, so a
     * batch may hold all its experts at once */
    return (expert_source){.acquire = cache_acquire, .release = cache_release, .prefetch = cache_prefetch, .ctx = c,
                           .max_held = c->n_slots >= c->n_owned ? c->n_owned : 1, .ready = cache_ready};
}
