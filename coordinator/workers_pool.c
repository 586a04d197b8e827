/* workers_pool.c - expert servers as processes: spawn, dispatch, detect, restart (see workers_pool.h). */
#define _GNU_SOURCE
#include "coordinator/workers_pool.h"
#include "common/mono_clock.h"
#include "common/proc_stats.h"
#include "common/ring.h"
#include "common/wire.h"
#include "workers/expert_cache.h"
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RING_SLOTS 2
#define MAX_POOL_WORKERS 256

/* The one piece of process-global state: worker pids for the SIGINT/SIGTERM
 * handler, which must kill them before the coordinator dies. */
static volatile pid_t g_worker_pids[MAX_POOL_WORKERS];

static void on_fatal_signal(int sig) {
    for (int i = 0; i < MAX_POOL_WORKERS; i++)
        if (g_worker_pids[i] > 0) kill(g_worker_pids[i], SIGKILL);
    signal(sig, SIG_DFL);
    raise(sig);
}

typedef struct {
    int idx, node, threads, life, restarts, cache_slots, direct_io;
    cpu_set_t *cpus;          /* its placement's cpus (NULL: not bound), set in the child before exec */
    pid_t pid;
    int ctl_fd;
    ring rg;
    uint64_t seq;             /* last request sequence published */
    worker_stats acc;         /* totals of previous lives */
    uint64_t requests;
    double wait_s;
    /* the request in flight */
    size_t ntok, npairs;
    int32_t *ptok, *pexp, *tok_map;
    size_t *pair_index;
    float *z;
    uint64_t req_id;
    int32_t *hint;            /* [wire_hint_max]: the prediction's experts this worker owns */
    uint32_t nhint;
} worker;

typedef struct {
    const k3_config *cfg;
    char model_dir[4096];
    pool_options o;
    char path[4096];
    int n;
    worker *w;
    size_t L, max_pairs;
    uint64_t hdr_cap, req_cap, resp_cap, next_id;
    int hint_layer;           /* a prediction handed to pool_hint, sent with the next request (-1: none) */
    int32_t *hint;            /* [wire_hint_max] */
    uint32_t nhint;
} pool;

int workers_pool_default_path(char *buf, size_t len) {
    const char *env = getenv("K3_EXPERTD");
    if (env && *env) { snprintf(buf, len, "%s", env); return 0; }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return -1;
    exe[n] = 0;
    snprintf(buf, len, "%s/k3-expertd", dirname(exe));
    return 0;
}

static void reap(worker *w) {
    if (w->pid > 0) {
        kill(w->pid, SIGKILL);
        waitpid(w->pid, NULL, 0);
        g_worker_pids[w->idx] = 0;
        w->pid = 0;
    }
    if (w->ctl_fd >= 0) { close(w->ctl_fd); w->ctl_fd = -1; }
}

/* Adds the dying life's counters to the totals. */
static void bank_stats(worker *w) {
    ring_ctl *c = w->rg.ctl;
    w->acc.hits += atomic_load(&c->stat_hits);
    w->acc.misses += atomic_load(&c->stat_misses);
    w->acc.bytes_read += atomic_load(&c->stat_bytes_read);
    w->acc.hint_reads += atomic_load(&c->stat_hint_reads);
    w->acc.hint_hits += atomic_load(&c->stat_hint_hits);
    w->acc.hint_wasted += atomic_load(&c->stat_hint_wasted);
    w->acc.compute_s += (double)atomic_load(&c->stat_compute_ns) * 1e-9;
}

enum { SPAWN_OK = 0, SPAWN_REFUSED = -1, SPAWN_FAILED = -2 };

/* Starts w and waits (at most --worker-timeout-ms) for its ready message.
 * SPAWN_REFUSED: the server answered that it cannot serve (a deterministic
 * refusal: no restart helps); SPAWN_FAILED: it died, hung or answered garbage
 * before it was ready (restarted while restarts remain). */
static int spawn(pool *p, worker *w, k3_error *err) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return k3_fail(err, "socketpair: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) { close(sv[0]); close(sv[1]); k3_fail(err, "fork: %s", strerror(errno)); return SPAWN_FAILED; }
    if (pid == 0) {
        /* move both fds above 4 before placing them at 3 and 4 (whatever they are now);
         * the minimum is 5, not a high number, so a low `ulimit -n` still works */
        int c = fcntl(sv[1], F_DUPFD_CLOEXEC, 5), r = fcntl(w->rg.fd, F_DUPFD_CLOEXEC, 5);
        if (c < 0 || r < 0 || dup2(c, 3) != 3 || dup2(r, 4) != 4) _exit(127);
        /* its node's cpus, the same in every life; k3-expertd keeps them (and prefers its node's memory) */
        if (w->cpus && sched_setaffinity(0, CPU_ALLOC_SIZE(TOPO_MAX_CPUS), w->cpus) != 0) _exit(126);
        /* The coordinator waits while a worker computes and the other way round:
         * idle OpenMP threads must sleep, not spin, or they steal the cores. */
        if (!getenv("OMP_WAIT_POLICY")) setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
        execl(p->path, "k3-expertd", "--control-fd", "3", "--ring-fd", "4", (char *)NULL);
        fprintf(stderr, "k3: cannot start %s: %s\n", p->path, strerror(errno));
        _exit(127);
    }
    close(sv[1]);
    w->pid = pid;
    w->ctl_fd = sv[0];
    g_worker_pids[w->idx] = pid;
    wire_hello h = {0};
    snprintf(h.model_dir, sizeof h.model_dir, "%s", p->model_dir);
    h.worker = w->idx;
    h.n_workers = p->n;
    h.group = p->o.group;
    h.n_groups = p->o.n_groups;
    h.cache_bytes = p->o.cache_bytes;
    h.threads = w->threads;
    h.node = w->node;
    h.n_slots = RING_SLOTS;
    h.hdr_cap = p->hdr_cap;
    h.req_cap = p->req_cap;
    h.resp_cap = p->resp_cap;
    h.max_tokens = (uint32_t)p->o.max_tokens;
    h.max_pairs = (uint32_t)p->max_pairs;
    h.read_threads = p->o.read_threads;
    h.preload = p->o.preload;
    h.life = w->life;
    snprintf(h.simd, sizeof h.simd, "%s", p->o.simd);
    snprintf(h.policy, sizeof h.policy, "%s", p->o.policy);
    unsigned char msg[8192];
    long len = wire_encode_hello(&h, msg, sizeof msg);
    if (len < 0 || send(w->ctl_fd, msg, (size_t)len, MSG_NOSIGNAL) != len) {
        reap(w);
        k3_fail(err, "worker %d: cannot send hello", w->idx);
        return SPAWN_FAILED;
    }
    struct pollfd pfd = {w->ctl_fd, POLLIN, 0};
    int pr;
    int ready_ms = p->o.ready_timeout_ms > 0 ? p->o.ready_timeout_ms : p->o.timeout_ms;
    double ready_by = k3_now_s() + ready_ms / 1000.0;
    for (;;) { /* in slices, so that whoever waits on this pool hears it is alive (on_progress) */
        double left = ready_by - k3_now_s();
        int slice = left <= 0 ? 0 : left * 1000 < 50 ? (int)(left * 1000) + 1 : 50;
        pr = poll(&pfd, 1, slice);
        if (pr < 0 && errno == EINTR) continue;
        if (pr != 0 || left <= 0) break;
        if (p->o.on_progress) p->o.on_progress(p->o.progress_ctx);
    }
    ssize_t n = pr > 0 ? recv(w->ctl_fd, msg, sizeof msg, 0) : -1;
    wire_ready rd;
    k3_error e2 = {0};
    if (n <= 0 || wire_decode_ready(msg, (size_t)n, &rd, &e2)) {
        reap(w);
        k3_fail(err, "worker %d (%s) did not report ready%s%s%s", w->idx, p->path,
                pr == 0 ? " within --worker-timeout-ms " : "", e2.set ? ": " : "", e2.msg);
        if (pr == 0) snprintf(err->msg + strlen(err->msg), sizeof err->msg - strlen(err->msg), "%d", ready_ms);
        return SPAWN_FAILED;
    }
    if (!rd.ok) {
        reap(w);
        k3_fail(err, "worker %d refused to start: %s", w->idx, rd.error);
        return SPAWN_REFUSED;
    }
    w->cache_slots = rd.cache_slots;
    w->direct_io = rd.direct_io;
    return 0;
}

/* Writes the current request of w into its ring and publishes it. */
static int send_request(pool *p, worker *w, int layer, k3_error *err) {
    ring_ctl *c = w->rg.ctl;
    uint64_t seq = ++w->seq;
    ring_slot_head *s = ring_req_slot(&w->rg, seq);
    wire_request q = {WIRE_REQ_EXPERTS, w->req_id, layer, (uint32_t)w->ntok, (uint32_t)w->npairs, w->ptok, w->pexp,
                      p->hint_layer, w->nhint, w->hint};
    long hl = wire_encode_request(&q, ring_slot_hdr(s), w->rg.hdr_cap);
    if (hl < 0) return k3_fail(err, "request header for worker %d does not fit the ring slot", w->idx);
    size_t pl = w->ntok * p->L * sizeof(float);
    memcpy(ring_slot_payload(&w->rg, s), w->z, pl);
    ring_publish(s, seq, (uint64_t)hl, pl, &c->req_items);
    w->requests++;
    return 0;
}

enum { WAIT_OK = 0, WAIT_RETRY = 1, WAIT_FATAL = -1 };

/* Waits for w's answer; copies it into out. WAIT_RETRY: the worker failed
 * (dead, stalled, malformed answer) and why is in *why. */
static int wait_response(pool *p, worker *w, float *out, char *why, size_t whylen, k3_error *err) {
    ring_ctl *c = w->rg.ctl;
    uint64_t hb = atomic_load(&c->heartbeat);
    double t0 = k3_now_s(), last_progress = t0;
    for (;;) {
        int r = ring_wait(&c->resp_items, 50);
        if (r < 0) { snprintf(why, whylen, "semaphore wait failed: %s", strerror(errno)); return WAIT_RETRY; }
        if (r == 1) break;
        int status;
        if (waitpid(w->pid, &status, WNOHANG) == w->pid) {
            w->pid = 0;
            g_worker_pids[w->idx] = 0;
            if (WIFSIGNALED(status)) snprintf(why, whylen, "killed by signal %d", WTERMSIG(status));
            else snprintf(why, whylen, "exited with status %d", WEXITSTATUS(status));
            return WAIT_RETRY;
        }
        uint64_t h = atomic_load(&c->heartbeat);
        double now = k3_now_s();
        if (h != hb) {
            hb = h;
            last_progress = now;
            if (p->o.on_progress) p->o.on_progress(p->o.progress_ctx);
        }
        else if ((now - last_progress) * 1000 > p->o.timeout_ms) {
            snprintf(why, whylen, "no progress for %d ms", p->o.timeout_ms);
            return WAIT_RETRY;
        }
    }
    w->wait_s += k3_now_s() - t0;
    ring_slot_head *s = ring_resp_slot(&w->rg, w->seq);
    uint64_t hl, pl;
    wire_response resp;
    k3_error e = {0};
    if (!ring_ctl_intact(&w->rg)) { /* a server that scribbles its control page is restarted */
        snprintf(why, whylen, "corrupted its ring control page");
        return WAIT_RETRY;
    }
    if (ring_slot_lengths(&w->rg, s, w->seq, w->rg.resp_cap, &hl, &pl, &e) ||
        wire_decode_response(ring_slot_hdr(s), hl, &resp, &e)) {
        snprintf(why, whylen, "malformed answer: %.900s", e.msg);
        return WAIT_RETRY;
    }
    if (resp.id != w->req_id || resp.npairs != w->npairs) {
        snprintf(why, whylen, "answer to request %llu (%u pairs), expected %llu (%zu pairs)", (unsigned long long)resp.id,
                 resp.npairs, (unsigned long long)w->req_id, w->npairs);
        return WAIT_RETRY;
    }
    if (!resp.ok) { k3_fail(err, "%s", resp.error); return WAIT_FATAL; }
    const float *y = (const float *)ring_slot_payload(&w->rg, s);
    if (pl != w->npairs * p->L * sizeof(float) || payload_checksum(y, pl) != resp.checksum) {
        snprintf(why, whylen, "answer payload failed its length or checksum check");
        return WAIT_RETRY;
    }
    for (size_t i = 0; i < w->npairs; i++) memcpy(out + w->pair_index[i] * p->L, y + i * p->L, p->L * sizeof(float));
    return WAIT_OK;
}

/* Starts w; a start that fails before ready (died, hung, garbage) uses the
 * remaining restarts, a refusal ends the run at once. */
static int start(pool *p, worker *w, k3_error *err) {
    for (;;) {
        k3_error e = {0};
        int rc = spawn(p, w, &e);
        if (rc == SPAWN_OK) return 0;
        if (rc == SPAWN_REFUSED) return k3_fail(err, "%s", e.msg);
        if (w->restarts >= p->o.max_restarts)
            return k3_fail(err, "%s; already restarted %d times: giving up", e.msg, w->restarts);
        w->restarts++;
        w->life++;
        fprintf(stderr, "k3: %s; restarting (%d/%d)\n", e.msg, w->restarts, p->o.max_restarts);
        usleep((50u << (w->restarts < 6 ? w->restarts : 6)) * 1000);
        w->seq = 0;
        if (ring_reset(&w->rg, err)) return -1;
    }
}

static int restart(pool *p, worker *w, const char *why, k3_error *err) {
    reap(w);
    bank_stats(w);
    if (w->restarts >= p->o.max_restarts)
        return k3_fail(err, "worker %d failed (%s) and has already been restarted %d times: giving up", w->idx, why, w->restarts);
    w->restarts++;
    w->life++;
    fprintf(stderr, "k3: worker %d failed (%s); restarting (%d/%d)\n", w->idx, why, w->restarts, p->o.max_restarts);
    unsigned backoff_ms = 50u << (w->restarts < 6 ? w->restarts : 6);
    usleep(backoff_ms * 1000);
    w->seq = 0;
    if (ring_reset(&w->rg, err)) return -1;
    return start(p, w, err);
}

static int pool_run(expert_backend *b, int layer, const float *zlat, size_t ntok, const int32_t *pair_token,
                    const int32_t *pair_expert, size_t npairs, float *out, k3_error *err) {
    pool *p = b->impl;
    if (ntok > p->o.max_tokens || npairs > p->max_pairs)
        return k3_fail(err, "expert request of %zu tokens / %zu pairs exceeds the ring capacity", ntok, npairs);
    for (int i = 0; i < p->n; i++) {
        worker *w = &p->w[i];
        w->ntok = w->npairs = 0;
        for (size_t t = 0; t < ntok; t++) w->tok_map[t] = -1;
    }
    for (size_t i = 0; i < npairs; i++) {
        int owner = expert_owner_in(layer, pair_expert[i], p->o.group, p->o.n_groups, p->n);
        if (owner < 0) return k3_fail(err, "expert %d of layer %d is not served here", pair_expert[i], layer);
        worker *w = &p->w[owner];
        int32_t t = pair_token[i];
        if (w->tok_map[t] < 0) {
            w->tok_map[t] = (int32_t)w->ntok;
            memcpy(w->z + w->ntok * p->L, zlat + (size_t)t * p->L, p->L * sizeof(float));
            w->ntok++;
        }
        w->ptok[w->npairs] = w->tok_map[t];
        w->pexp[w->npairs] = pair_expert[i];
        w->pair_index[w->npairs] = i;
        w->npairs++;
    }
    for (int i = 0; i < p->n; i++) p->w[i].nhint = 0;
    for (uint32_t i = 0; p->hint_layer >= 0 && i < p->nhint; i++) { /* each server gets the predicted experts it owns */
        int owner = expert_owner_in(p->hint_layer, p->hint[i], p->o.group, p->o.n_groups, p->n);
        if (owner >= 0) p->w[owner].hint[p->w[owner].nhint++] = p->hint[i];
    }
    for (int i = 0; i < p->n; i++) {
        worker *w = &p->w[i];
        if (!w->npairs) continue;
        w->req_id = ++p->next_id;
        if (send_request(p, w, layer, err)) return -1;
    }
    p->hint_layer = -1;
    p->nhint = 0;
    for (int i = 0; i < p->n; i++) {
        worker *w = &p->w[i];
        if (!w->npairs) continue;
        for (;;) {
            char why[1024];
            int r = wait_response(p, w, out, why, sizeof why, err);
            if (r == WAIT_OK) break;
            if (r == WAIT_FATAL) return -1;
            if (restart(p, w, why, err) || send_request(p, w, layer, err)) return -1;
        }
    }
    return 0;
}

static void free_worker(worker *w) {
    if (w->cpus) CPU_FREE(w->cpus);
    free(w->ptok); free(w->pexp); free(w->tok_map); free(w->pair_index); free(w->z); free(w->hint);
}

/* A prediction of `layer`'s experts: sent with the next request (the one of the layer before
 * it) to the servers that own them, which start reading after they answer. */
static size_t pool_hint(expert_backend *b, int layer, const int32_t *experts, size_t n) {
    pool *p = b->impl;
    uint32_t max = wire_hint_max((uint32_t)p->max_pairs);
    p->nhint = 0;
    p->hint_layer = layer;
    for (size_t i = 0; i < n && p->nhint < max; i++) p->hint[p->nhint++] = experts[i];
    return p->nhint;
}

static void pool_destroy(expert_backend *b) {
    pool *p = b->impl;
    if (!p) return;
    for (int i = 0; i < p->n; i++) { /* ask politely, then insist */
        worker *w = &p->w[i];
        if (w->pid <= 0 || !w->rg.ctl) continue;
        uint64_t seq = ++w->seq;
        ring_slot_head *s = ring_req_slot(&w->rg, seq);
        wire_request q = {.kind = WIRE_REQ_SHUTDOWN, .id = ++p->next_id};
        long hl = wire_encode_request(&q, ring_slot_hdr(s), w->rg.hdr_cap);
        if (hl > 0) ring_publish(s, seq, (uint64_t)hl, 0, &w->rg.ctl->req_items);
    }
    for (int i = 0; i < p->n; i++) {
        worker *w = &p->w[i];
        for (int t = 0; t < 100 && w->pid > 0; t++) {
            if (waitpid(w->pid, NULL, WNOHANG) == w->pid) { g_worker_pids[w->idx] = 0; w->pid = 0; break; }
            usleep(20000);
        }
        reap(w);
        ring_close(&w->rg);
        free_worker(w);
    }
    free(p->w);
    free(p->hint);
    free(p);
    b->impl = NULL;
}

int workers_pool_wait_preload(expert_backend *b, size_t *loaded, k3_error *err) {
    pool *p = b->impl;
    *loaded = 0;
    if (!p->o.preload) return 0;
    uint64_t hb[MAX_POOL_WORKERS];
    double last[MAX_POOL_WORKERS], t0 = k3_now_s(), said = t0;
    for (int i = 0; i < p->n; i++) { hb[i] = atomic_load(&p->w[i].rg.ctl->heartbeat); last[i] = t0; }
    for (;;) {
        int all = 1;
        uint64_t sum = 0;
        double now = k3_now_s();
        for (int i = 0; i < p->n; i++) {
            worker *w = &p->w[i];
            ring_ctl *c = w->rg.ctl;
            uint64_t st = atomic_load(&c->preload_state), h = atomic_load(&c->heartbeat), n = atomic_load(&c->preloaded);
            sum += n < (uint64_t)INT32_MAX ? n : (uint64_t)INT32_MAX; /* a count from shared memory, capped */
            if (st == 2) return k3_fail(err, "worker %d could not preload its experts (its message is above)", i);
            if (st == 1) continue;
            all = 0;
            int status;
            if (w->pid > 0 && waitpid(w->pid, &status, WNOHANG) == w->pid) {
                w->pid = 0;
                g_worker_pids[w->idx] = 0;
                return k3_fail(err, "worker %d died while preloading its experts (%s %d)", i,
                               WIFSIGNALED(status) ? "signal" : "exit status", WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
            }
            if (h != hb[i]) { hb[i] = h; last[i] = now; }
            else if ((now - last[i]) * 1000 > p->o.timeout_ms)
                return k3_fail(err, "worker %d made no progress preloading its experts for %d ms", i, p->o.timeout_ms);
        }
        if (all || now - said >= 1.0) {
            fprintf(stderr, "k3: preloading experts: %llu read by %d server(s) (%.1f s)%s\n", (unsigned long long)sum, p->n,
                    now - t0, all ? ", done" : "");
            said = now;
        }
        if (all) { *loaded = (size_t)sum; return 0; }
        if (p->o.on_progress) p->o.on_progress(p->o.progress_ctx);
        usleep(20000);
    }
}

int workers_pool_count(const expert_backend *b) { return ((const pool *)b->impl)->n; }

void workers_pool_stats(const expert_backend *b, int i, worker_stats *out) {
    const pool *p = b->impl;
    const worker *w = &p->w[i];
    *out = w->acc;
    out->pid = w->pid;
    out->node = w->node;
    out->restarts = w->restarts;
    out->cache_slots = w->cache_slots;
    out->direct_io = w->direct_io;
    out->requests = w->requests;
    out->wait_s = w->wait_s;
    out->peak_rss_bytes = w->pid > 0 ? proc_peak_rss_bytes((int)w->pid) : 0;
    if (w->rg.ctl) {
        out->hits += atomic_load(&w->rg.ctl->stat_hits);
        out->misses += atomic_load(&w->rg.ctl->stat_misses);
        out->bytes_read += atomic_load(&w->rg.ctl->stat_bytes_read);
        out->hint_reads += atomic_load(&w->rg.ctl->stat_hint_reads);
        out->hint_hits += atomic_load(&w->rg.ctl->stat_hint_hits);
        out->hint_wasted += atomic_load(&w->rg.ctl->stat_hint_wasted);
        out->compute_s += (double)atomic_load(&w->rg.ctl->stat_compute_ns) * 1e-9;
    }
}

int workers_pool_create(expert_backend *b, const k3_config *cfg, const char *model_dir, const pool_options *o,
                        k3_error *err) {
    if (o->n_workers < 1 || o->n_workers > MAX_POOL_WORKERS)
        return k3_fail(err, "--workers must be between 0 and %d", MAX_POOL_WORKERS);
    if (o->n_groups > 0 && (o->group < 0 || o->group >= o->n_groups)) return k3_fail(err, "pool group %d of %d", o->group, o->n_groups);
    ring_cleanup_stale();
    pool *p = calloc(1, sizeof *p);
    if (!p) return k3_fail(err, "out of memory");
    p->cfg = cfg;
    snprintf(p->model_dir, sizeof p->model_dir, "%s", model_dir);
    p->o = *o;
    if (p->o.n_groups < 1) { p->o.n_groups = 1; p->o.group = 0; }
    p->n = o->n_workers;
    snprintf(p->path, sizeof p->path, "%s", o->expertd_path);
    p->L = (size_t)cfg->routed_expert_hidden_size;
    p->max_pairs = o->max_tokens * (size_t)cfg->num_experts_per_token;
    p->hdr_cap = 256 + 12 * (uint64_t)p->max_pairs;
    p->req_cap = (uint64_t)o->max_tokens * p->L * sizeof(float);
    p->resp_cap = (uint64_t)p->max_pairs * p->L * sizeof(float);
    p->w = calloc((size_t)p->n, sizeof *p->w);
    p->hint = malloc(wire_hint_max((uint32_t)p->max_pairs) * sizeof *p->hint);
    p->hint_layer = -1;
    *b = (expert_backend){pool_run, pool_destroy, p, pool_hint, NULL};
    if (!p->w || !p->hint) { pool_destroy(b); return k3_fail(err, "out of memory"); }
    struct sigaction sa = {0};
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    const placement *pl = o->place;
    if (pl && pl->n_servers != p->n) { pool_destroy(b); return k3_fail(err, "placement has %d servers, pool %d", pl->n_servers, p->n); }
    for (int i = 0; i < p->n; i++) {
        worker *w = &p->w[i];
        w->idx = i;
        w->ctl_fd = -1;
        w->node = pl && pl->bound ? pl->server[i].node : -1;
        w->threads = pl ? pl->server[i].threads : o->threads;
        if (pl && pl->bound) {
            size_t sz = CPU_ALLOC_SIZE(TOPO_MAX_CPUS);
            if (!(w->cpus = CPU_ALLOC(TOPO_MAX_CPUS))) { pool_destroy(b); return k3_fail(err, "out of memory"); }
            CPU_ZERO_S(sz, w->cpus);
            for (int c = 0; c < TOPO_MAX_CPUS; c++)
                if (topo_cpuset_has(&pl->server[i].cpus, c)) CPU_SET_S(c, sz, w->cpus);
        }
        w->ptok = malloc(p->max_pairs * sizeof *w->ptok);
        w->pexp = malloc(p->max_pairs * sizeof *w->pexp);
        w->pair_index = malloc(p->max_pairs * sizeof *w->pair_index);
        w->tok_map = malloc(o->max_tokens * sizeof *w->tok_map);
        w->z = malloc(o->max_tokens * p->L * sizeof *w->z);
        w->hint = malloc(wire_hint_max((uint32_t)p->max_pairs) * sizeof *w->hint);
        if (!w->ptok || !w->pexp || !w->pair_index || !w->tok_map || !w->z || !w->hint) { pool_destroy(b); return k3_fail(err, "out of memory"); }
        if (ring_create(&w->rg, RING_SLOTS, p->hdr_cap, p->req_cap, p->resp_cap, err) || start(p, w, err)) {
            pool_destroy(b);
            return -1;
        }
        char place[200], list[96];
        if (w->node >= 0)
            snprintf(place, sizeof place, "node %d cpus %s, %d threads, %d cache slots (budget %.1f MiB) on node %d", w->node,
                     topo_cpuset_format(&pl->server[i].cpus, list, sizeof list), w->threads, w->cache_slots,
                     o->cache_bytes / 1048576.0, w->node);
        else
            snprintf(place, sizeof place, "not bound, %d threads, %d cache slots (budget %.1f MiB)", w->threads, w->cache_slots,
                     o->cache_bytes / 1048576.0);
        fprintf(stderr, "k3: worker %d pid %d, %s, %s reads\n", i, (int)w->pid, place, w->direct_io ? "O_DIRECT" : "buffered");
    }
    return 0;
}

int workers_pool_check(const k3_model *m, int n_workers, uint64_t cache_bytes, k3_error *err) {
    const k3_config *c = &m->cfg;
    uint64_t sb = expert_cache_slot_bytes(&m->experts);
    if (cache_bytes > 0 && cache_bytes < sb)
        return k3_fail(err, "--expert-cache-mb %.4f is below one expert (%llu bytes = %.4f MB): at least one expert must fit",
                       (double)cache_bytes / 1048576.0, (unsigned long long)sb, (double)sb / 1048576.0);
    if (n_workers <= c->num_experts) return 0; /* layer 0's experts alone reach every server */
    return workers_pool_check_group(c, 0, 1, n_workers, err);
}

int workers_pool_check_group(const k3_config *c, int group, int n_groups, int n_workers, k3_error *err) {
    for (int w = 0; w < n_workers; w++) {
        int owns = 0;
        for (int l = 0; l < c->num_hidden_layers && !owns; l++)
            if (c->layer_is_moe[l])
                for (int e = 0; e < c->num_experts && !owns; e++) owns = expert_owner_in(l, e, group, n_groups, n_workers) == w;
        if (!owns && n_groups > 1)
            return k3_fail(err, "--workers %d: server %d behind expert rank %d would own no expert (%d experts per layer "
                           "spread over %d ranks x %d servers); use fewer", n_workers, w, group + 1, c->num_experts,
                           n_groups, n_workers);
        if (!owns)
            return k3_fail(err, "--workers %d: expert server %d would own no expert (%d experts per layer spread over %d "
                           "servers); use fewer servers", n_workers, w, c->num_experts, n_workers);
    }
    return 0;
}
