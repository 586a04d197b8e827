/* expertd_main.c - bin/k3-expertd, one expert server (started by bin/k3, not by users).
 *
 *   k3-expertd --control-fd N --ring-fd M
 *
 * 1. receives the msgpack hello on the control socket (model dir, ownership,
 *    cache budget, threads, NUMA node, ring geometry), prefers its node's memory
 *    (its cpus were set by the coordinator before exec),
 *    opens only the shards that hold its experts, validates them, maps the ring
 *    and answers ready (or a refusal that says why);
 * 2. serves requests from the ring until told to shut down or its parent dies:
 *    validate the header, compute every (token, expert) pair from its own cache,
 *    write the outputs and a checksum to the response slot, publish.
 * It holds no sequence state: killing it loses nothing but cache contents.
 * Fault injection, in the TEST build only (bin/k3-expertd-faults, compiled with
 * -DK3_FAULT_INJECTION; the release bin/k3-expertd contains none of it, checked by
 * tests/t_40_workers.sh with strings; tests pick the build with K3_EXPERTD=bin/k3-expertd-faults):
 * K3_FAULT="kind:after[:worker[:lives]]" with kind in
 * crash|exit|hang|garbage|badsum|pause|scribble|semjunk|stop makes worker `worker`
 * (default 0) misbehave when serving request number `after`, in its first `lives`
 * lives (default 1): scribble writes garbage over the whole control page (magic,
 * geometry, semaphore words) and then answers normally; semjunk sets the response
 * semaphore to 2^32-1 without answering; stop raises SIGSTOP (a test inspects the
 * processes, then sends SIGCONT or SIGKILL). Kinds noready (killed before it reports
 * ready) and hangready (never reports ready) act at start-up (`after` ignored). */
#define _GNU_SOURCE
#include "common/config.h"
#include "common/layer_schema.h"
#include "common/ring.h"
#include "common/wire.h"
#include "workers/expert_cache.h"
#include <errno.h>
#include <numa.h>
#include <omp.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifdef K3_FAULT_INJECTION
typedef struct {
    char kind[16];
    unsigned long after;
    int worker, lives;
} fault_plan;

static void parse_fault(fault_plan *f) {
    memset(f, 0, sizeof *f);
    const char *s = getenv("K3_FAULT");
    f->lives = 1;
    if (!s || sscanf(s, "%15[a-z]:%lu:%d:%d", f->kind, &f->after, &f->worker, &f->lives) < 2) f->kind[0] = 0;
}
/* 1 when this request is the one the plan names and its kind is k */
#define FAULT_PLANNED(fp, sv, served) ((fp)->kind[0] && (served) == (fp)->after && (fp)->worker == (sv)->hello.worker && (sv)->hello.life < (fp)->lives)
#define FAULT_IS(k) (fault && !strcmp(fp->kind, k))
#else
typedef struct { int none; } fault_plan; /* release build: no fault injection at all */
static void parse_fault(fault_plan *f) { f->none = 1; }
#define FAULT_PLANNED(fp, sv, served) ((void)(fp), (void)(served), 0)
#define FAULT_IS(k) 0
#endif

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

typedef struct {
    wire_hello hello;
    k3_config cfg;
    checkpoint ck;
    expert_store store;
    expert_cache *cache;
    const kernels *k;
    ring rg;
    expert_batch_ws ws; /* the batch's buffers, kept between requests (the plan counts them per worker) */
} server;

static int owns(int layer, int expert, void *ctx) {
    const wire_hello *h = ctx;
    return expert_owner_in(layer, expert, h->group, h->n_groups, h->n_workers) == h->worker;
}

/* Keeps only tensor names of experts this worker owns. */
static int keep_tensor(const char *name, void *ctx) {
    int layer, expert;
    return ls_expert_name_parse(name, &layer, &expert) && owns(layer, expert, ctx);
}

static int setup(server *sv, int ring_fd, wire_ready *ready, k3_error *err) {
    wire_hello *h = &sv->hello;
    if (h->node >= 0) { /* the coordinator set our cpus (its placement) before exec; memory: our node */
        if (numa_available() < 0) return k3_fail(err, "NUMA node %d requested but libnuma reports no NUMA support", h->node);
        if (h->node > numa_max_node()) return k3_fail(err, "NUMA node %d does not exist here", h->node);
        numa_set_preferred(h->node);
    }
    omp_set_num_threads(h->threads);
    simd_level lvl;
    if (simd_level_parse(h->simd, &lvl) || !(sv->k = kernels_get(lvl))) return k3_fail(err, "SIMD level '%s' unavailable", h->simd);
    if (config_load(h->model_dir, &sv->cfg, err)) return -1;
    if (checkpoint_open_filtered(h->model_dir, keep_tensor, h, &sv->ck, err)) return -1;
    if (expert_store_open(&sv->store, &sv->ck, &sv->cfg, owns, h, err)) return -1;
    if (ring_attach(&sv->rg, ring_fd, h->hdr_cap, h->req_cap, h->resp_cap, h->n_slots, err)) return -1;
    uint64_t L = (uint64_t)sv->cfg.routed_expert_hidden_size;
    if (h->req_cap < (uint64_t)h->max_tokens * L * 4 || h->resp_cap < (uint64_t)h->max_pairs * L * 4)
        return k3_fail(err, "ring payload capacity too small for %u tokens / %u pairs", h->max_tokens, h->max_pairs);
    cache_policy pol;
    if (cache_policy_parse(h->policy, &pol)) return k3_fail(err, "unknown expert-cache policy '%s'", h->policy);
    if (!(sv->cache = expert_cache_create(&sv->store, &sv->ck, h->cache_bytes, h->node, err))) return -1;
    expert_cache_set_policy(sv->cache, pol);
    expert_cache_set_lanes(sv->cache, sv->k);
    if (expert_cache_set_readers(sv->cache, h->read_threads, err)) return -1;
    int n = 0;
    for (int l = 0; l < sv->cfg.num_hidden_layers; l++)
        for (int e = 0; e < sv->cfg.num_experts; e++) n += expert_store_loc(&sv->store, l, e) != NULL;
    ready->experts = n;
    ready->cache_slots = (int)expert_cache_slots(sv->cache);
    ready->node = h->node;
    ready->direct_io = expert_cache_direct_io(sv->cache);
    return 0;
}

/* The cache's expert_source, plus a heartbeat per expert so a long request
 * (many misses) is not mistaken for a hung worker. */
typedef struct {
    expert_source inner;
    ring_ctl *ctl;
} beating_source;

static int beat_acquire(void *ctx, int layer, int expert, expert_weights *w, k3_error *err) {
    beating_source *b = ctx;
    atomic_fetch_add(&b->ctl->heartbeat, 1);
    return b->inner.acquire(b->inner.ctx, layer, expert, w, err);
}
static void beat_release(void *ctx, int layer, int expert) {
    beating_source *b = ctx;
    b->inner.release(b->inner.ctx, layer, expert);
}
static int beat_prefetch(void *ctx, int layer, const int32_t *experts, size_t n, k3_error *err) {
    beating_source *b = ctx;
    atomic_fetch_add(&b->ctl->heartbeat, 1);
    return b->inner.prefetch(b->inner.ctx, layer, experts, n, err);
}

/* The cache's counters onto the ring's stats page (the coordinator's --json / metrics). */
static void publish_cache_stats(ring_ctl *ctl, const expert_cache *cache) {
    expert_cache_stats cs = expert_cache_get_stats(cache);
    atomic_store(&ctl->stat_hits, cs.hits);
    atomic_store(&ctl->stat_misses, cs.misses);
    atomic_store(&ctl->stat_bytes_read, cs.bytes_read);
    atomic_store(&ctl->stat_hint_reads, cs.hint_reads);
    atomic_store(&ctl->stat_hint_hits, cs.hint_hits);
    atomic_store(&ctl->stat_hint_wasted, cs.hint_wasted);
}

/* Serves one request already waiting in slot `seq`. Returns 1 to stop, 0 to go on. */
static int serve(server *sv, uint64_t seq, int32_t *ptok, int32_t *pexp, int32_t *phint, const fault_plan *fp,
                 unsigned long served) {
    ring *rg = &sv->rg;
    ring_ctl *ctl = rg->ctl;
    ring_slot_head *rs = ring_req_slot(rg, seq), *out = ring_resp_slot(rg, seq);
    wire_request q = {.pair_token = ptok, .pair_expert = pexp, .hint = phint};
    wire_response resp = {0};
    k3_error err = {0};
    uint64_t hl, pl;
    size_t L = sv->store.L;
    float *y = (float *)ring_slot_payload(rg, out);
    int fault = FAULT_PLANNED(fp, sv, served);
    (void)fault;
    if (FAULT_IS("crash")) raise(SIGKILL);
    if (FAULT_IS("exit")) _exit(3);
    if (FAULT_IS("hang")) for (;;) pause();
    if (FAULT_IS("stop")) raise(SIGSTOP);
    if (FAULT_IS("pause"))
        for (int i = 0; i < 30; i++) { usleep(100000); atomic_fetch_add(&ctl->heartbeat, 1); }
    if (ring_slot_lengths(rg, rs, seq, rg->req_cap, &hl, &pl, &err) ||
        wire_decode_request(ring_slot_hdr(rs), hl, sv->hello.max_pairs, &q, &err)) {
        fprintf(stderr, "k3-expertd %d: bad request: %s\n", sv->hello.worker, err.msg);
        return 1; /* the coordinator will see no answer and restart us */
    }
    if (q.kind == WIRE_REQ_SHUTDOWN) return 1;
    resp.id = q.id;
    resp.layer = q.layer;
    resp.npairs = q.npairs;
    uint64_t t0 = now_ns();
    if (q.layer >= sv->cfg.num_hidden_layers || !sv->cfg.layer_is_moe[q.layer]) k3_fail(&err, "layer %d is not a MoE layer", q.layer);
    else if (q.ntok > sv->hello.max_tokens) k3_fail(&err, "request carries %u tokens (max %u)", q.ntok, sv->hello.max_tokens);
    else if (pl != (uint64_t)q.ntok * L * sizeof(float)) k3_fail(&err, "payload is %llu bytes, expected %u x %zu floats", (unsigned long long)pl, q.ntok, L);
    else {
        for (uint32_t i = 0; i < q.npairs && !err.set; i++)
            if (!expert_store_loc(&sv->store, q.layer, q.pair_expert[i]))
                k3_fail(&err, "expert %d of layer %d is not owned by worker %d", q.pair_expert[i], q.layer, sv->hello.worker);
        if (!err.set) {
            beating_source bs = {expert_cache_source(sv->cache), ctl};
            expert_source src = {beat_acquire, beat_release, beat_prefetch, &bs, 0, NULL};
            expert_batch_run_ws(sv->k, &src, L, sv->store.I, sv->cfg.situ_beta, sv->cfg.situ_linear_beta, q.layer,
                                (const float *)ring_slot_payload(rg, rs), q.ntok, q.pair_token, q.pair_expert, q.npairs, y,
                                &sv->ws, &err);
        }
    }
    uint64_t payload = err.set ? 0 : (uint64_t)q.npairs * L * sizeof(float);
    resp.ok = !err.set;
    if (err.set) snprintf(resp.error, sizeof resp.error, "worker %d: %.980s", sv->hello.worker, err.msg);
    resp.checksum = payload_checksum(y, payload);
    publish_cache_stats(ctl, sv->cache);
    atomic_fetch_add(&ctl->stat_compute_ns, now_ns() - t0);
    atomic_fetch_add(&ctl->stat_requests, 1);
    long hlen = wire_encode_response(&resp, ring_slot_hdr(out), rg->hdr_cap);
    if (hlen < 0) return 1;
    if (FAULT_IS("garbage"))
        for (long i = 0; i < hlen; i++) ring_slot_hdr(out)[i] ^= (unsigned char)(0x5a + i);
    if (FAULT_IS("badsum") && payload) ((unsigned char *)y)[payload / 2] ^= 1;
    if (FAULT_IS("scribble")) { /* every control field, from the magic to the semaphores */
        unsigned char *c = (unsigned char *)ctl;
        for (size_t i = 0; i < offsetof(ring_ctl, heartbeat); i++) c[i] = (unsigned char)(0xa5 ^ (i * 37));
    }
    if (FAULT_IS("semjunk")) { atomic_store(&ctl->resp_items, 0xffffffffu); return 0; }
    ring_publish(out, seq, (uint64_t)hlen, payload, &ctl->resp_items);
    /* the prediction of the next MoE layer (validated ids; experts not owned, a layer that is not
     * MoE or out of range are skipped by the cache): reads start while the coordinator goes on */
    if (resp.ok && q.nhint && q.hint_layer < sv->cfg.num_hidden_layers && sv->cfg.layer_is_moe[q.hint_layer])
        expert_cache_hint(sv->cache, q.hint_layer, q.hint, q.nhint);
    return 0;
}

/* expert_cache_preload's progress: a heartbeat and the count, per expert read */
static void preload_beat(void *ctx, size_t done, size_t total) {
    ring_ctl *ctl = ctx;
    (void)total;
    atomic_store(&ctl->preloaded, done);
    atomic_fetch_add(&ctl->heartbeat, 1);
}

int main(int argc, char **argv) {
    int control_fd = -1, ring_fd = -1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--control-fd")) control_fd = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--ring-fd")) ring_fd = atoi(argv[i + 1]);
    }
    if (control_fd < 0 || ring_fd < 0) {
        fprintf(stderr, "k3-expertd is started by bin/k3 (--workers N); it is not run by hand\n");
        return 2;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a dead coordinator takes its workers with it */
    pid_t parent = getppid();
    if (parent == 1) return 1;
    static server sv;
    fault_plan fp;
    parse_fault(&fp);
    unsigned char msg[8192];
    struct pollfd pfd = {control_fd, POLLIN, 0};
    if (poll(&pfd, 1, 30000) <= 0) { fprintf(stderr, "k3-expertd: no hello within 30 s\n"); return 1; }
    ssize_t n = recv(control_fd, msg, sizeof msg, 0);
    k3_error err = {0};
    wire_ready ready = {0};
    if (n <= 0 || wire_decode_hello(msg, (size_t)n, &sv.hello, &err) || setup(&sv, ring_fd, &ready, &err)) {
        ready.ok = 0;
        snprintf(ready.error, sizeof ready.error, "%.1000s", err.set ? err.msg : "no hello");
    } else ready.ok = 1;
#ifdef K3_FAULT_INJECTION
    int start_fault = fp.kind[0] && fp.worker == sv.hello.worker && sv.hello.life < fp.lives;
    if (start_fault && !strcmp(fp.kind, "noready")) raise(SIGKILL);
    if (start_fault && !strcmp(fp.kind, "hangready")) for (;;) pause();
#endif
    long len = wire_encode_ready(&ready, msg, sizeof msg);
    if (len < 0 || send(control_fd, msg, (size_t)len, 0) != len || !ready.ok) return 1;
    if (sv.hello.preload) { /* the coordinator waits on preload_state (requests queue in the ring meanwhile) */
        size_t loaded = 0;
        k3_error pe = {0};
        int prc = expert_cache_preload(sv.cache, &loaded, preload_beat, sv.rg.ctl, &pe);
        if (prc) fprintf(stderr, "k3-expertd: worker %d: preloading experts: %s\n", sv.hello.worker, pe.msg);
        publish_cache_stats(sv.rg.ctl, sv.cache);
        atomic_store(&sv.rg.ctl->preload_state, prc ? 2 : 1);
    }

    int32_t *ptok = malloc(sv.hello.max_pairs * sizeof *ptok), *pexp = malloc(sv.hello.max_pairs * sizeof *pexp);
    int32_t *phint = malloc(wire_hint_max(sv.hello.max_pairs) * sizeof *phint);
    if (!ptok || !pexp || !phint) return 1;
    uint64_t seq = 0;
    unsigned long served = 0;
    for (;;) {
        uint64_t w0 = now_ns();
        int got = ring_wait(&sv.rg.ctl->req_items, 1000);
        if (got < 0) break;
        if (got == 0) {
            if (getppid() != parent) break;
            continue;
        }
        atomic_fetch_add(&sv.rg.ctl->stat_wait_ns, now_ns() - w0);
        atomic_fetch_add(&sv.rg.ctl->heartbeat, 1);
        if (serve(&sv, ++seq, ptok, pexp, phint, &fp, ++served)) break;
        atomic_fetch_add(&sv.rg.ctl->heartbeat, 1);
    }
    free(ptok);
    free(pexp);
    free(phint);
    expert_cache_free(sv.cache);
    expert_batch_ws_free(&sv.ws);
    expert_store_free(&sv.store);
    checkpoint_close(&sv.ck);
    config_free(&sv.cfg);
    ring_close(&sv.rg);
    return 0;
}
