/* experts_mpi.h - expert servers as Open MPI ranks on other hosts (`mpirun ... bin/k3 ... --mpi`).
 *
 * Layout: rank 0 is the coordinator (tokenizer, sampling, every sequence state, the trunk);
 * ranks 1..N-1 are expert ranks. Rank r owns the experts with
 * expert_owner(layer, expert, N-1) == r-1 (common/wire.h: the same map as local servers),
 * opens only the shards that hold them (the checkpoint at the same path on every host),
 * keeps its own cache and O_DIRECT reader (workers/expert_cache), and answers each MoE
 * layer's request with the outputs of its (token, expert) pairs. With `--workers N` (N > 0)
 * an expert rank instead serves its experts through N local k3-expertd servers over
 * shared-memory rings (workers_pool, placed on its host's NUMA nodes like a one-host run;
 * ownership expert_owner_in: the rank's experts spread over its servers, which restart
 * locally after a fault). Rank 0 owns no experts and starts no local servers: to use its
 * host's memory for experts, put an expert rank on that host too. An expert's output bits
 * do not depend on who computes it and rank 0 combines in top-k order itself, so every
 * layout gives the ids and logits of an in-process run.
 *
 * Start-up: every rank parses the same command line. Each expert rank sends rank 0 its host
 * name and a digest of config.json, the index and every shard's size and header; rank 0
 * refuses (exit 2) naming the host whose checkpoint differs from its own.
 *
 * Messages (MPI_COMM_WORLD, bytes): request {u32 magic, i32 layer, u32 ntok, u32 npairs}
 * + ntok latent rows [ntok][L] f32 + npairs (token, expert) i32 pairs; answer: npairs rows
 * [npairs][L] f32 + one f64 (seconds the rank computed), or an error text (tag ERR). Every
 * received message is checked against sizes computed from the config (lengths, layer, token
 * and expert ranges, ownership).
 *
 * Waiting: Open MPI 4.1's blocking calls spin (100 % of a core per waiting rank), which on a
 * host whose cores also run the trunk or the experts costs more than it saves. Both sides
 * therefore poll (MPI_Test / MPI_Iprobe) and sleep between polls, from 5 us growing to
 * 200 us while nothing arrives (K3_MPI_POLL=spin restores spinning, for measurements).
 *
 * Faults: Open MPI 4.1 cannot survive a lost rank (ULFM is 5.x). Errors are returned
 * (MPI_ERRORS_RETURN). While it computes a request, a rank sends rank 0 an empty heartbeat
 * (tag BEAT) at most every min(100 ms, timeout / 4): on every expert it acquires, around the
 * cache's parallel miss reads, and whenever one of its local servers shows progress; so a
 * long request (cold cache, big prefill chunk) is not a lost rank. A rank silent for the
 * timeout (no answer, no heartbeat) is reported with its rank and host, the run fails
 * (exit 1, no token printed after the last complete one) and experts_mpi_finish ends every
 * rank (MPI_Abort), so no rank is orphaned; `--checkpoint` keeps the state to `--resume`
 * from. */
#ifndef K3_EXPERTS_MPI_H
#define K3_EXPERTS_MPI_H

#include "coordinator/expert_backend.h"
#include "coordinator/model.h"

typedef struct {
    const char *model_dir;
    int timeout_ms;          /* an expert rank silent this long has failed */
    uint64_t cache_bytes;    /* per rank, or per local server (0: all of its experts) */
    const char *policy;      /* cache policy name, NULL: default */
    const char *simd;        /* kernel level name */
    int threads;             /* OpenMP threads per rank, or per local server (0: its cpus) */
    size_t max_tokens;       /* most latent rows in one request (the engine's max_rows) */
    /* expert ranks: local servers (workers > 0) placed as in a one-host run */
    int workers, workers_per_node, numa, max_restarts;
} mpi_options;

/* MPI_Init (once) and this process's rank and the world size. */
int experts_mpi_init(int *argc, char ***argv, int *rank, int *size, k3_error *err);
/* Rank >= 1: serve until rank 0 says stop; returns the exit status. */
int experts_mpi_serve(const mpi_options *o);
/* Rank 0: the backend (checks every rank's checkpoint first). */
int experts_mpi_create(expert_backend *b, k3_model *m, const mpi_options *o, k3_error *err);
/* Rank 0: per-rank stats for --json. A message is a request or its answer. */
typedef struct {
    uint64_t requests, bytes_sent, bytes_received;
    uint64_t beats;          /* heartbeats received (not counted as messages above) */
    double wait_s;           /* from sending its request to having its answer */
    double compute_s;        /* what the rank reported computing */
    int servers;             /* its local servers (0: it computes in-process) */
    char host[64];
} mpi_rank_stats;
typedef struct {
    uint64_t exchanges;      /* MoE layer calls that sent at least one request */
    double exchange_s;       /* wall time in those calls (splitting, waiting, placing) */
    double overhead_s;       /* exchange_s minus, per call, the slowest rank's compute time */
} mpi_exchange_stats;
/* since_mark: only what happened after experts_mpi_mark (the decode); -1 if not MPI / bad rank */
int experts_mpi_stats(const expert_backend *b, int rank, int since_mark, mpi_rank_stats *s);
int experts_mpi_exchange(const expert_backend *b, int since_mark, mpi_exchange_stats *x);
int experts_mpi_ranks(const expert_backend *b);
void experts_mpi_mark(expert_backend *b);
/* Rank 0: tells every expert rank to stop and finalizes when ok; after a failure ends every
 * rank with MPI_Abort(status) (no orphans). Expert ranks: finalize (ok) or abort. */
void experts_mpi_finish(int rank, int size, int ok, int status);

#endif
