/* workers_pool.h - the expert backend that runs experts in k3-expertd processes.
 *
 * Starts n_workers servers (fork/exec of bin/k3-expertd), each with its own ring
 * (ring.h) and a disjoint expert set (expert_owner in wire.h; behind an MPI expert rank,
 * expert_owner_in: the rank's experts spread over its servers). run() splits the
 * (token, expert) pairs by owner, sends one request per worker per layer
 * carrying only the latent rows that worker needs, and waits for every answer.
 * A worker that exits, is killed, stops making progress for timeout_ms, or
 * answers with a malformed header or a payload whose checksum does not match is
 * killed, restarted with the same expert set (backoff, at most max_restarts per
 * worker) and sent its request again; results are placed by pair index, so the
 * coordinator's top-k-order combine sees the same bits whatever happened. A
 * worker that reports an error (an unreadable shard) ends the run with its
 * message. SIGINT/SIGTERM kill every worker before the coordinator dies. */
#ifndef K3_WORKERS_POOL_H
#define K3_WORKERS_POOL_H

#include "coordinator/expert_backend.h"
#include "coordinator/model.h"
#include "common/topology.h"
#include <stdint.h>

typedef struct {
    int n_workers;
    const placement *place;    /* server i runs on place->server[i] (node, cpus, threads) when
                                * place->bound, also after a restart; NULL or unbound: no binding */
    uint64_t cache_bytes;      /* per worker */
    int threads;               /* per worker when place is NULL */
    int timeout_ms;            /* no-progress timeout */
    int ready_timeout_ms;      /* start-up timeout (0: timeout_ms) */
    int max_restarts;          /* per worker */
    size_t max_tokens;         /* largest chunk the coordinator will send */
    const char *expertd_path;
    const char *simd;          /* kernel level name, passed to workers */
    const char *policy;        /* expert-cache policy name, passed to workers */
    int read_threads;          /* each server cache's reads in flight (--read-threads; 0: none) */
    int preload;               /* --preload-experts: each server reads its cached experts after ready */
    int group, n_groups;       /* serve only expert rank `group`'s experts (of n_groups; 0 = 1 group) */
    void (*on_progress)(void *ctx); /* optional: called while waiting whenever a server shows progress */
    void *progress_ctx;
} pool_options;

typedef struct {
    int pid, node, restarts, cache_slots, direct_io;
    uint64_t requests, hits, misses, bytes_read;
    uint64_t hint_reads, hint_hits, hint_wasted; /* the server cache's hint counters (untrusted: shared memory) */
    uint64_t peak_rss_bytes;   /* VmHWM of the current life (0 once it has exited) */
    double wait_s, compute_s;  /* coordinator waiting on this worker; worker computing */
} worker_stats;

/* model_dir: where the servers open the checkpoint; cfg: its config. */
int workers_pool_create(expert_backend *b, const k3_config *cfg, const char *model_dir, const pool_options *o,
                        k3_error *err);
/* Usage checks made before anything starts: with n_workers > 0 every server must
 * own at least one expert of some MoE layer (expert_owner), and an expert cache
 * asked for (cache_bytes > 0, --expert-cache-mb) must hold at least one expert slot. */
int workers_pool_check(const k3_model *m, int n_workers, uint64_t cache_bytes, k3_error *err);
/* The same ownership check for the servers behind expert rank `group` of n_groups. */
int workers_pool_check_group(const k3_config *c, int group, int n_groups, int n_workers, k3_error *err);
int workers_pool_count(const expert_backend *b);
void workers_pool_stats(const expert_backend *b, int i, worker_stats *out);
/* With o->preload: waits until every server has read its experts (progress on stderr), a
 * server's heartbeat proving progress (--worker-timeout-ms without any fails, as does a server
 * that dies or reports a failed read: its own message is on stderr). *loaded: the experts the
 * servers say they read (their shared memory: a count, never trusted further). 0 or -1. */
int workers_pool_wait_preload(expert_backend *b, size_t *loaded, k3_error *err);
/* Where bin/k3-expertd is: $K3_EXPERTD, else next to the running bin/k3. */
int workers_pool_default_path(char *buf, size_t len);

#endif
