/* experts_mpi.c - expert ranks over Open MPI (see experts_mpi.h). */
#define _GNU_SOURCE
#include "coordinator/experts_mpi.h"
#include "common/mono_clock.h"
#include "coordinator/workers_pool.h"
#include "common/file_read.h"
#include "common/topology.h"
#include "common/hash64.h"
#include "common/layer_schema.h"
#include "common/wire.h"
#include "workers/expert_batch.h"
#include "workers/expert_cache.h"
#include <fcntl.h>
#include <sched.h>
#include <mpi.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

enum { TAG_HELLO = 1, TAG_VERDICT, TAG_REQ, TAG_RESP, TAG_ERR, TAG_STOP, TAG_BEAT };
#define REQ_MAGIC 0x4b33524bu /* "K3RK" */
#define HOST_MAX 64
#define SHARD_NAME_MAX 200

typedef struct {
    uint32_t magic;
    int32_t layer;
    uint32_t ntok, npairs;
} req_head;

typedef struct {
    char name[SHARD_NAME_MAX];
    uint64_t size, header_hash;
} shard_id;

typedef struct {
    char host[HOST_MAX];
    uint64_t config_hash, index_hash;
    int32_t servers;        /* local servers behind the rank */
    uint32_t n_shards;
    shard_id shard[]; /* n_shards */
} hello_msg;

/* Polling with sleeps (experts_mpi.h "Waiting"): 5 us, doubling to 200 us while idle. */
typedef struct {
    long ns;
    int spin;
} idle_wait;

static void idle_init(idle_wait *w) {
    const char *e = getenv("K3_MPI_POLL");
    w->spin = e && !strcmp(e, "spin");
    w->ns = 5000;
}
static void idle_reset(idle_wait *w) { w->ns = 5000; }
static void idle_sleep(idle_wait *w) {
    if (w->spin) return;
    struct timespec ts = {0, w->ns};
    nanosleep(&ts, NULL);
    if (w->ns < 200000) w->ns = w->ns * 2 > 200000 ? 200000 : w->ns * 2;
}

static uint64_t file_hash(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t len = 0;
    k3_error e = {0};
    char *b = file_read_all(path, (size_t)1 << 28, &len, &e);
    if (!b) return 0;
    uint64_t h = hash64(b, len, 0);
    free(b);
    return h;
}

/* size and hash of the 8-byte length + JSON header of one shard file */
static int shard_identity(const char *path, uint64_t *size, uint64_t *hh) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    uint64_t n = 0;
    off_t end = lseek(fd, 0, SEEK_END);
    int rc = -1;
    if (end >= 8 && pread(fd, &n, 8, 0) == 8 && n <= (uint64_t)end - 8 && n < ((uint64_t)1 << 30)) {
        char *b = malloc(n + 8);
        if (b && pread(fd, b, n + 8, 0) == (ssize_t)(n + 8)) {
            *size = (uint64_t)end;
            *hh = hash64(b, n + 8, 0);
            rc = 0;
        }
        free(b);
    }
    close(fd);
    return rc;
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static hello_msg *make_hello(const checkpoint *ck, const char *dir, size_t *bytes) {
    size_t n = (size_t)ck->n_shards;
    hello_msg *h = calloc(1, sizeof *h + n * sizeof(shard_id));
    if (!h) return NULL;
    gethostname(h->host, HOST_MAX - 1);
    h->config_hash = file_hash(dir, "config.json");
    h->index_hash = ck->has_index ? file_hash(dir, "model.safetensors.index.json") : 0;
    h->n_shards = (uint32_t)n;
    for (size_t i = 0; i < n; i++) {
        snprintf(h->shard[i].name, SHARD_NAME_MAX, "%s", base_name(ck->shards[i].file.path));
        if (shard_identity(ck->shards[i].file.path, &h->shard[i].size, &h->shard[i].header_hash)) h->shard[i].size = UINT64_MAX;
    }
    *bytes = sizeof *h + n * sizeof(shard_id);
    return h;
}

int experts_mpi_init(int *argc, char ***argv, int *rank, int *size, k3_error *err) {
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        return k3_fail(err, "MPI_Init_thread failed (is this run under mpirun?)");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    prctl(PR_SET_TIMERSLACK, 10000UL, 0, 0, 0); /* the poll sleeps are short: do not stretch them by 50 us */
    /* Open MPI binds every rank to one core when -np <= 2: the trunk or the experts would then
     * run on one core of a bigger host (measured on rw6: 1.6x slower per token). Say so. */
    cpu_set_t cs;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (sched_getaffinity(0, sizeof cs, &cs) == 0 && CPU_COUNT(&cs) == 1 && online > 1) {
        char host[HOST_MAX] = {0};
        gethostname(host, HOST_MAX - 1);
        fprintf(stderr, "k3: rank %d on %s may use 1 of its %ld cpus (mpirun's binding); give mpirun --bind-to none "
                "(one rank per host) or --bind-to numa (one per node)\n", *rank, host, online);
    }
    if (provided < MPI_THREAD_SERIALIZED) return k3_fail(err, "this MPI gives no MPI_THREAD_SERIALIZED support");
    if (*size < 2) return k3_fail(err, "--mpi needs at least 2 ranks (rank 0 coordinates, the others serve experts)");
    return 0;
}

void experts_mpi_finish(int rank, int size, int ok, int status) {
    if (!ok) {
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, status ? status : 1); /* every rank ends: no orphans */
        return;
    }
    if (rank == 0)
        for (int r = 1; r < size; r++) MPI_Send(NULL, 0, MPI_BYTE, r, TAG_STOP, MPI_COMM_WORLD);
    MPI_Finalize();
}

/* ---- expert ranks ---- */

typedef struct {
    int me, n;  /* this rank's index among the expert ranks, and their number */
} owner_ctx;

static int rank_owns(int layer, int expert, void *ctx) {
    const owner_ctx *o = ctx;
    return expert_owner(layer, expert, o->n) == o->me;
}

static int rank_keep(const char *name, void *ctx) {
    int layer, expert;
    return ls_expert_name_parse(name, &layer, &expert) && rank_owns(layer, expert, ctx);
}

/* the cache of one in-rank server: every expert it owns (the default, as for local servers) */
static uint64_t owned_bytes(const expert_store *st, const k3_config *cfg) {
    uint64_t n = 0;
    for (int l = 0; l < cfg->num_hidden_layers; l++)
        for (int e = 0; e < cfg->num_experts; e++) n += expert_store_loc(st, l, e) != NULL;
    return (n ? n : 1) * expert_cache_slot_bytes(st);
}

/* the same for the largest of the rank's local servers */
static uint64_t owned_bytes_per_server(const expert_store *st, const k3_config *cfg, const owner_ctx *own, int nw) {
    uint64_t most = 1;
    for (int w = 0; w < nw; w++) {
        uint64_t n = 0;
        for (int l = 0; l < cfg->num_hidden_layers; l++)
            for (int e = 0; e < cfg->num_experts; e++)
                n += expert_store_loc(st, l, e) && expert_owner_in(l, e, own->me, own->n, nw) == w;
        if (n > most) most = n;
    }
    return most * expert_cache_slot_bytes(st);
}

/* Heartbeats: while a request is being computed (cache misses read, experts computed, local
 * servers making progress) the rank tells rank 0 it is alive, at most every `every` s, so a
 * long request is not mistaken for a lost rank. */
typedef struct {
    expert_source inner;
    double last, every;
    int active;              /* a request is being computed (never before the hello) */
} beater;

static void beat(void *ctx) {
    beater *b = ctx;
    double t = k3_now_s();
    if (!b->active || t - b->last < b->every) return;
    b->last = t;
    MPI_Send(NULL, 0, MPI_BYTE, 0, TAG_BEAT, MPI_COMM_WORLD);
}
static int beat_acquire(void *ctx, int layer, int expert, expert_weights *w, k3_error *err) {
    beater *b = ctx;
    beat(b);
    return b->inner.acquire(b->inner.ctx, layer, expert, w, err);
}
static void beat_release(void *ctx, int layer, int expert) {
    beater *b = ctx;
    b->inner.release(b->inner.ctx, layer, expert);
}
static int beat_prefetch(void *ctx, int layer, const int32_t *experts, size_t n, k3_error *err) {
    beater *b = ctx;
    beat(b);
    int rc = b->inner.prefetch ? b->inner.prefetch(b->inner.ctx, layer, experts, n, err) : 0;
    beat(b);
    return rc;
}

/* Expert rank with --workers N: N k3-expertd servers behind it, placed on this host's nodes. */
static int start_local_servers(const mpi_options *o, const k3_config *cfg, const expert_store *st, const owner_ctx *own,
                               beater *bt, expert_backend *pool, k3_error *err) {
    if (workers_pool_check_group(cfg, own->me, own->n, o->workers, err)) return -1;
    k3_topology topo = {0};
    placement pl = {0};
    placement_request rq = {o->workers, o->workers_per_node > 0 ? o->workers_per_node : 1, 1, o->threads, o->numa};
    if (topology_read(NULL, &topo, err) || placement_make(&topo, &rq, &pl, err)) { topology_free(&topo); return -1; }
    char path[4096];
    int rc = -1;
    if (workers_pool_default_path(path, sizeof path)) k3_fail(err, "cannot locate k3-expertd");
    else {
        pool_options po = {0};
        po.n_workers = o->workers;
        po.place = &pl;
        po.threads = o->threads > 0 ? o->threads : 1;
        po.cache_bytes = o->cache_bytes ? o->cache_bytes : owned_bytes_per_server(st, cfg, own, o->workers);
        po.timeout_ms = o->timeout_ms > 0 ? o->timeout_ms / 4 : 7500; /* a hung server is restarted before rank 0 gives up */
        po.ready_timeout_ms = o->timeout_ms > 10000 ? o->timeout_ms : 10000; /* start-up: the rank sends heartbeats */
        po.max_restarts = o->max_restarts;
        po.max_tokens = o->max_tokens ? o->max_tokens : 1;
        po.expertd_path = path;
        po.simd = o->simd ? o->simd : "auto";
        po.policy = o->policy ? o->policy : cache_policy_name(CACHE_POLICY_DEFAULT);
        po.group = own->me;
        po.n_groups = own->n;
        po.on_progress = beat;
        po.progress_ctx = bt;
        rc = workers_pool_create(pool, cfg, o->model_dir, &po, err);
    }
    placement_free(&pl);
    topology_free(&topo);
    return rc;
}

int experts_mpi_serve(const mpi_options *o) {
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    owner_ctx own = {rank - 1, size - 1};
    k3_config cfg;
    checkpoint ck;
    expert_store store;
    expert_cache *cache = NULL;
    expert_backend pool = {0};
    k3_error err = {0};
    int opened = 0, stored = 0;
    beater bt = {.every = o->timeout_ms > 0 ? (o->timeout_ms / 4 < 100 ? o->timeout_ms / 4 : 100) / 1000.0 : 0.1};
    char host[HOST_MAX] = {0};
    gethostname(host, HOST_MAX - 1);
    if (o->threads > 0) omp_set_num_threads(o->threads);
    simd_level lvl = SIMD_AUTO;
    const kernels *k = NULL;
    if (simd_level_parse(o->simd ? o->simd : "auto", &lvl) || !(k = kernels_get(lvl))) k3_fail(&err, "SIMD level unavailable");
    else if (config_load(o->model_dir, &cfg, &err)) {
    } else if (checkpoint_open_filtered(o->model_dir, rank_keep, &own, &ck, &err)) {
        config_free(&cfg);
    } else if (expert_store_open(&store, &ck, &cfg, rank_owns, &own, &err)) {
        checkpoint_close(&ck);
        config_free(&cfg);
    } else {
        stored = 1;
        if (o->workers > 0 ? start_local_servers(o, &cfg, &store, &own, &bt, &pool, &err) == 0
                           : (cache = expert_cache_create(&store, &ck, o->cache_bytes ? o->cache_bytes : owned_bytes(&store, &cfg),
                                                          -1, &err)) != NULL)
            opened = 1;
        cache_policy pol;
        if (cache && o->policy && cache_policy_parse(o->policy, &pol) == 0) expert_cache_set_policy(cache, pol);
        if (cache) expert_cache_set_lanes(cache, k);
    }
    /* hello: identity of what this host opened, or the reason it could not */
    size_t hb = 0;
    hello_msg *h = opened ? make_hello(&ck, o->model_dir, &hb) : NULL;
    if (!h) {
        char msg[1200];
        snprintf(msg, sizeof msg, "host %s: %s", host, err.set ? err.msg : "out of memory");
        MPI_Send(msg, (int)strlen(msg) + 1, MPI_BYTE, 0, TAG_ERR, MPI_COMM_WORLD);
    } else {
        h->servers = o->workers > 0 ? o->workers : 0;
        MPI_Send(h, (int)hb, MPI_BYTE, 0, TAG_HELLO, MPI_COMM_WORLD);
    }
    free(h);
    int verdict = 0;
    MPI_Recv(&verdict, 1, MPI_INT, 0, TAG_VERDICT, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    int status = 0;
    size_t L = opened ? (size_t)cfg.routed_expert_hidden_size : 0, K = opened ? (size_t)cfg.num_experts_per_token : 0;
    size_t max_tok = o->max_tokens ? o->max_tokens : 1, max_pairs = max_tok * (K ? K : 1);
    size_t req_cap = sizeof(req_head) + max_tok * L * 4 + max_pairs * 8, resp_cap = max_pairs * L * 4 + sizeof(double);
    uint8_t *req = verdict == 1 && opened ? malloc(req_cap) : NULL;
    uint8_t *resp = req ? malloc(resp_cap) : NULL;
    int32_t *pt = req ? malloc(max_pairs * sizeof *pt) : NULL, *pe = req ? malloc(max_pairs * sizeof *pe) : NULL;
    if (verdict == 1 && opened && (!req || !resp || !pt || !pe)) { fprintf(stderr, "k3 rank %d: out of memory\n", rank); status = 1; }
    idle_wait iw;
    idle_init(&iw);
    while (verdict == 1 && status == 0) {
        MPI_Status st;
        if (iw.spin) {
            if (MPI_Probe(0, MPI_ANY_TAG, MPI_COMM_WORLD, &st) != MPI_SUCCESS) { status = 1; break; }
        } else {
            int flag = 0;
            if (MPI_Iprobe(0, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st) != MPI_SUCCESS) { status = 1; break; }
            if (!flag) { idle_sleep(&iw); continue; }
            idle_reset(&iw);
        }
        int count = 0;
        MPI_Get_count(&st, MPI_BYTE, &count);
        if (st.MPI_TAG == TAG_STOP) {
            MPI_Recv(NULL, 0, MPI_BYTE, 0, TAG_STOP, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            break;
        }
        const char *bad = NULL;
        if (st.MPI_TAG != TAG_REQ || count < (int)sizeof(req_head) || (size_t)count > req_cap) {
            bad = "a message of unexpected kind or size";
            MPI_Recv(NULL, 0, MPI_BYTE, 0, st.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE); /* truncation error, ignored */
        } else {
            MPI_Recv(req, count, MPI_BYTE, 0, TAG_REQ, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        }
        req_head hd;
        if (!bad) memcpy(&hd, req, sizeof hd);
        if (!bad && (hd.magic != REQ_MAGIC || hd.layer < 0 || hd.layer >= cfg.num_hidden_layers || !cfg.layer_is_moe[hd.layer] ||
                     hd.ntok > max_tok || hd.npairs > max_pairs ||
                     (size_t)count != sizeof hd + (size_t)hd.ntok * L * 4 + (size_t)hd.npairs * 8))
            bad = "a malformed request header";
        const float *z = (const float *)(req + sizeof hd);
        if (!bad) {
            const int32_t *pairs = (const int32_t *)(req + sizeof hd + (size_t)hd.ntok * L * 4);
            for (uint32_t i = 0; i < hd.npairs && !bad; i++) {
                memcpy(&pt[i], &pairs[2 * i], 4);
                memcpy(&pe[i], &pairs[2 * i + 1], 4);
                if (pt[i] < 0 || (uint32_t)pt[i] >= hd.ntok || pe[i] < 0 || pe[i] >= cfg.num_experts ||
                    !rank_owns(hd.layer, pe[i], &own))
                    bad = "a pair outside the request or not owned by this rank";
            }
        }
        k3_error e = {0};
        if (!bad) {
            double t0 = k3_now_s();
            int rc;
            bt.last = t0;
            bt.active = 1;
            if (pool.run) rc = pool.run(&pool, hd.layer, z, hd.ntok, pt, pe, hd.npairs, (float *)resp, &e);
            else {
                bt.inner = expert_cache_source(cache);
                expert_source src = {beat_acquire, beat_release, beat_prefetch, &bt, 0, NULL};
                rc = expert_batch_run(k, &src, store.L, store.I, cfg.situ_beta, cfg.situ_linear_beta, hd.layer, z, hd.ntok, pt,
                                      pe, hd.npairs, (float *)resp, &e);
            }
            bt.active = 0;
            if (rc == 0) {
                size_t nb = (size_t)hd.npairs * L * 4;
                double dt = k3_now_s() - t0;
                memcpy(resp + nb, &dt, sizeof dt);
                MPI_Send(resp, (int)(nb + sizeof dt), MPI_BYTE, 0, TAG_RESP, MPI_COMM_WORLD);
                continue;
            }
        }
        char msg[1200];
        snprintf(msg, sizeof msg, "expert rank %d on host %s: %s", rank, host, bad ? bad : e.msg);
        MPI_Send(msg, (int)strlen(msg) + 1, MPI_BYTE, 0, TAG_ERR, MPI_COMM_WORLD);
        if (bad) { status = 1; break; }
    }
    free(req);
    free(resp);
    free(pt);
    free(pe);
    if (pool.destroy) pool.destroy(&pool);
    if (stored) {
        expert_cache_free(cache);
        expert_store_free(&store);
        checkpoint_close(&ck);
        config_free(&cfg);
    }
    return verdict == 1 ? status : 2;
}

/* ---- rank 0: the backend ---- */

typedef struct {
    int n;                      /* expert ranks */
    size_t L, K, max_tok;
    int timeout_ms;
    const k3_model *m;
    uint8_t **req;              /* [n] request buffers */
    float **resp;               /* [n] answers */
    int32_t **idx;              /* [n] pair index in the caller's order */
    int32_t *tokmap;            /* [max_tok] */
    MPI_Request *sreq, *rreq;
    mpi_rank_stats *stats, *mark;  /* [n]: totals, and the totals at experts_mpi_mark */
    double *deadline;           /* [n]: when a silent rank has failed */
    mpi_exchange_stats x, xmark;
} mpi_impl;

static void mpi_destroy(expert_backend *b) {
    mpi_impl *mi = b->impl;
    if (!mi) return;
    for (int r = 0; r < mi->n; r++) {
        if (mi->req) free(mi->req[r]);
        if (mi->resp) free(mi->resp[r]);
        if (mi->idx) free(mi->idx[r]);
    }
    free(mi->req); free(mi->resp); free(mi->idx); free(mi->tokmap); free(mi->sreq); free(mi->rreq); free(mi->stats); free(mi->mark); free(mi->deadline);
    free(mi);
    b->impl = NULL;
}

static int mpi_run(expert_backend *b, int layer, const float *zlat, size_t ntok, const int32_t *pair_token,
                   const int32_t *pair_expert, size_t npairs, float *out, k3_error *err) {
    mpi_impl *mi = b->impl;
    size_t L = mi->L;
    if (ntok > mi->max_tok || npairs > mi->max_tok * mi->K)
        return k3_fail(err, "an expert request of %zu tokens / %zu pairs is larger than planned", ntok, npairs);
    double t0 = k3_now_s();
    size_t np[256] = {0};
    int active = 0;
    for (int r = 0; r < mi->n; r++) {
        size_t nt = 0, cnt = 0;
        for (size_t t = 0; t < ntok; t++) mi->tokmap[t] = -1;
        uint8_t *q = mi->req[r];
        float *rows = (float *)(q + sizeof(req_head));
        for (size_t i = 0; i < npairs; i++) {
            if (expert_owner(layer, pair_expert[i], mi->n) != r) continue;
            int32_t t = pair_token[i];
            if (mi->tokmap[t] < 0) {
                mi->tokmap[t] = (int32_t)nt;
                memcpy(rows + nt * L, zlat + (size_t)t * L, L * 4);
                nt++;
            }
            mi->idx[r][cnt++] = (int32_t)i;
        }
        np[r] = cnt;
        if (!cnt) { mi->sreq[r] = mi->rreq[r] = MPI_REQUEST_NULL; continue; }
        int32_t *pairs = (int32_t *)(q + sizeof(req_head) + nt * L * 4);
        for (size_t j = 0; j < cnt; j++) {
            size_t i = (size_t)mi->idx[r][j];
            int32_t a = mi->tokmap[pair_token[i]], e = pair_expert[i];
            memcpy(&pairs[2 * j], &a, 4);
            memcpy(&pairs[2 * j + 1], &e, 4);
        }
        req_head hd = {REQ_MAGIC, layer, (uint32_t)nt, (uint32_t)cnt};
        memcpy(q, &hd, sizeof hd);
        size_t bytes = sizeof hd + nt * L * 4 + cnt * 8;
        if (MPI_Isend(q, (int)bytes, MPI_BYTE, r + 1, TAG_REQ, MPI_COMM_WORLD, &mi->sreq[r]) != MPI_SUCCESS ||
            MPI_Irecv(mi->resp[r], (int)(mi->max_tok * mi->K * L * 4 + 1200), MPI_BYTE, r + 1, MPI_ANY_TAG, MPI_COMM_WORLD,
                      &mi->rreq[r]) != MPI_SUCCESS)
            return k3_fail(err, "MPI could not send to expert rank %d (%s)", r + 1, mi->stats[r].host);
        mi->stats[r].requests++;
        mi->stats[r].bytes_sent += bytes;
        active++;
    }
    double slowest = 0, start = k3_now_s();
    for (int r = 0; r < mi->n; r++) mi->deadline[r] = start + mi->timeout_ms / 1000.0;
    int done_all = 0;
    idle_wait iw;
    idle_init(&iw);
    while (!done_all) {
        done_all = 1;
        int got = 0;
        for (int r = 0; r < mi->n; r++) {
            if (mi->rreq[r] == MPI_REQUEST_NULL && mi->sreq[r] == MPI_REQUEST_NULL) continue;
            int flag = 0;
            MPI_Status st;
            if (mi->sreq[r] != MPI_REQUEST_NULL && MPI_Test(&mi->sreq[r], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
                return k3_fail(err, "MPI send to expert rank %d (%s) failed", r + 1, mi->stats[r].host);
            if (mi->rreq[r] == MPI_REQUEST_NULL) continue;
            if (MPI_Test(&mi->rreq[r], &flag, &st) != MPI_SUCCESS)
                return k3_fail(err, "MPI receive from expert rank %d (%s) failed", r + 1, mi->stats[r].host);
            if (!flag) { done_all = 0; continue; }
            got = 1;
            int count = 0;
            MPI_Get_count(&st, MPI_BYTE, &count);
            if (st.MPI_TAG == TAG_BEAT) { /* alive and computing: a new deadline, listen again */
                mi->stats[r].beats++;
                mi->deadline[r] = k3_now_s() + mi->timeout_ms / 1000.0;
                if (MPI_Irecv(mi->resp[r], (int)(mi->max_tok * mi->K * L * 4 + 1200), MPI_BYTE, r + 1, MPI_ANY_TAG, MPI_COMM_WORLD,
                              &mi->rreq[r]) != MPI_SUCCESS)
                    return k3_fail(err, "MPI could not receive from expert rank %d (%s)", r + 1, mi->stats[r].host);
                done_all = 0;
                continue;
            }
            if (st.MPI_TAG == TAG_ERR) {
                ((char *)mi->resp[r])[count > 0 ? count - 1 : 0] = 0;
                return k3_fail(err, "%s", (char *)mi->resp[r]);
            }
            size_t want = np[r] * L * 4;
            if (st.MPI_TAG != TAG_RESP || (size_t)count != want + sizeof(double))
                return k3_fail(err, "expert rank %d (%s) answered %d bytes, expected %zu", r + 1, mi->stats[r].host, count,
                               want + sizeof(double));
            double dt;
            memcpy(&dt, (const uint8_t *)mi->resp[r] + want, sizeof dt);
            if (!(dt >= 0 && dt < 1e6)) dt = 0; /* a statistic only: never trusted beyond that */
            if (dt > slowest) slowest = dt;
            mi->stats[r].compute_s += dt;
            mi->stats[r].wait_s += k3_now_s() - t0;
            mi->stats[r].bytes_received += (uint64_t)count;
            for (size_t j = 0; j < np[r]; j++) memcpy(out + (size_t)mi->idx[r][j] * L, mi->resp[r] + j * L, L * 4);
        }
        if (!done_all) {
            double now = k3_now_s();
            for (int r = 0; r < mi->n; r++)
                if (mi->rreq[r] != MPI_REQUEST_NULL && now > mi->deadline[r])
                    return k3_fail(err, "expert rank %d on host %s did not answer within %d ms (lost host or rank?)", r + 1,
                                   mi->stats[r].host, mi->timeout_ms);
        }
        if (!done_all) {
            if (got) idle_reset(&iw);
            idle_sleep(&iw);
        }
    }
    if (active) {
        double w = k3_now_s() - t0;
        mi->x.exchanges++;
        mi->x.exchange_s += w;
        mi->x.overhead_s += w > slowest ? w - slowest : 0;
    }
    return 0;
}

int experts_mpi_create(expert_backend *b, k3_model *m, const mpi_options *o, k3_error *err) {
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    mpi_impl *mi = calloc(1, sizeof *mi);
    if (!mi) return k3_fail(err, "out of memory");
    *b = (expert_backend){mpi_run, mpi_destroy, mi, NULL, NULL};
    mi->n = size - 1;
    mi->L = (size_t)m->cfg.routed_expert_hidden_size;
    mi->K = (size_t)m->cfg.num_experts_per_token;
    mi->max_tok = o->max_tokens ? o->max_tokens : 1;
    mi->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 30000;
    mi->m = m;
    if (mi->n > 255) return k3_fail(err, "at most 255 expert ranks");
    size_t n = (size_t)mi->n, maxp = mi->max_tok * mi->K;
    mi->req = calloc(n, sizeof *mi->req);
    mi->resp = calloc(n, sizeof *mi->resp);
    mi->idx = calloc(n, sizeof *mi->idx);
    mi->tokmap = malloc(mi->max_tok * sizeof *mi->tokmap);
    mi->sreq = calloc(n, sizeof *mi->sreq);
    mi->rreq = calloc(n, sizeof *mi->rreq);
    mi->stats = calloc(n, sizeof *mi->stats);
    mi->mark = calloc(n, sizeof *mi->mark);
    mi->deadline = calloc(n, sizeof *mi->deadline);
    if (!mi->req || !mi->resp || !mi->idx || !mi->tokmap || !mi->sreq || !mi->rreq || !mi->stats || !mi->mark || !mi->deadline)
        return k3_fail(err, "out of memory");
    for (size_t r = 0; r < n; r++) {
        mi->req[r] = malloc(sizeof(req_head) + mi->max_tok * mi->L * 4 + maxp * 8);
        mi->resp[r] = malloc(maxp * mi->L * 4 + 1200);
        mi->idx[r] = malloc(maxp * sizeof(int32_t));
        if (!mi->req[r] || !mi->resp[r] || !mi->idx[r]) return k3_fail(err, "out of memory for MPI buffers");
    }
    /* every rank's hello: its host and what it opened, checked against this host's checkpoint */
    size_t mine_b = 0;
    hello_msg *mine = make_hello(&m->ck, o->model_dir, &mine_b);
    if (!mine) return k3_fail(err, "out of memory");
    int bad = 0;
    for (int r = 1; r < size; r++) {
        MPI_Status st;
        MPI_Probe(r, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
        int count = 0;
        MPI_Get_count(&st, MPI_BYTE, &count);
        char *buf = malloc((size_t)count + 1);
        if (!buf) { bad = 1; break; }
        MPI_Recv(buf, count, MPI_BYTE, r, st.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        buf[count] = 0;
        hello_msg *h = (hello_msg *)buf;
        if (st.MPI_TAG == TAG_ERR) {
            if (!bad) k3_fail(err, "expert rank %d could not open the model: %s", r, buf);
            bad = 1;
        } else if (st.MPI_TAG != TAG_HELLO || (size_t)count < sizeof *h ||
                   (size_t)count != sizeof *h + (size_t)h->n_shards * sizeof(shard_id)) {
            if (!bad) k3_fail(err, "expert rank %d sent a malformed hello", r);
            bad = 1;
        } else {
            h->host[HOST_MAX - 1] = 0;
            snprintf(mi->stats[r - 1].host, sizeof mi->stats[r - 1].host, "%s", h->host);
            mi->stats[r - 1].servers = h->servers;
            const char *why = NULL;
            char whybuf[300];
            if (h->config_hash != mine->config_hash) why = "config.json differs";
            else if (h->index_hash != mine->index_hash) why = "model.safetensors.index.json differs";
            for (uint32_t i = 0; !why && i < h->n_shards; i++) {
                h->shard[i].name[SHARD_NAME_MAX - 1] = 0;
                const shard_id *mm = NULL;
                for (uint32_t j = 0; j < mine->n_shards; j++)
                    if (!strcmp(mine->shard[j].name, h->shard[i].name)) mm = &mine->shard[j];
                if (!mm) why = "it has a shard this host does not";
                else if (mm->size != h->shard[i].size) why = "a shard's size differs";
                else if (mm->header_hash != h->shard[i].header_hash) why = "a shard's header differs";
                if (why && mm) {
                    snprintf(whybuf, sizeof whybuf, "%s (%s)", why, h->shard[i].name);
                    why = whybuf;
                }
            }
            if (why) {
                if (!bad) k3_fail(err, "the checkpoint on host %s (expert rank %d) is not this host's: %s", h->host, r, why);
                bad = 1;
            }
        }
        free(buf);
    }
    free(mine);
    for (int r = 1; r < size; r++) {
        int verdict = bad ? 0 : 1;
        MPI_Send(&verdict, 1, MPI_INT, r, TAG_VERDICT, MPI_COMM_WORLD);
    }
    if (bad) return -1;
    fprintf(stderr, "k3: %d expert ranks over MPI:", mi->n);
    for (int r = 0; r < mi->n; r++) {
        fprintf(stderr, " %d@%s", r + 1, mi->stats[r].host);
        if (mi->stats[r].servers) fprintf(stderr, "(%d local servers)", mi->stats[r].servers);
    }
    fprintf(stderr, "\n");
    for (int r = 0; r < mi->n; r++) {
        snprintf(mi->mark[r].host, sizeof mi->mark[r].host, "%s", mi->stats[r].host);
        mi->mark[r].servers = mi->stats[r].servers;
    }
    return 0;
}

static int is_mpi(const expert_backend *b) { return b && b->run == mpi_run && b->impl; }

int experts_mpi_ranks(const expert_backend *b) { return is_mpi(b) ? ((const mpi_impl *)b->impl)->n : 0; }

void experts_mpi_mark(expert_backend *b) {
    if (!is_mpi(b)) return;
    mpi_impl *mi = b->impl;
    memcpy(mi->mark, mi->stats, (size_t)mi->n * sizeof *mi->mark);
    mi->xmark = mi->x;
}

int experts_mpi_stats(const expert_backend *b, int rank, int since_mark, mpi_rank_stats *s) {
    if (!is_mpi(b)) return -1;
    const mpi_impl *mi = b->impl;
    if (rank < 1 || rank > mi->n) return -1;
    *s = mi->stats[rank - 1];
    if (since_mark) {
        const mpi_rank_stats *m = &mi->mark[rank - 1];
        s->requests -= m->requests;
        s->bytes_sent -= m->bytes_sent;
        s->bytes_received -= m->bytes_received;
        s->wait_s -= m->wait_s;
        s->compute_s -= m->compute_s;
        s->beats -= m->beats;
    }
    return 0;
}

int experts_mpi_exchange(const expert_backend *b, int since_mark, mpi_exchange_stats *x) {
    if (!is_mpi(b)) return -1;
    const mpi_impl *mi = b->impl;
    *x = mi->x;
    if (since_mark) {
        x->exchanges -= mi->xmark.exchanges;
        x->exchange_s -= mi->xmark.exchange_s;
        x->overhead_s -= mi->xmark.overhead_s;
    }
    return 0;
}
