/* experts_mpi.h - expert servers as Open MPI ranks on other hosts (`mpirun ... bin/k3 ... --mpi`).
 *
 * Layout: rank 0 is the coordinator (tokenizer, sampling, every sequence state, the trunk);
 * ranks 1..N-1 are expert ranks. Rank r owns the experts with
 * expert_owner(layer, expert, N-1) == r-1 (common/wire.h: the same map as local servers),
 * opens only the shards that hold them (the checkpoint at the same path on every host),
 * keeps its own cache and O_DIRECT reader (workers/expert_cache), and answers each MoE
 * layer's request with the outputs of its (token, expert) pairs. An expert's output bits do
 * not depend on who computes it and rank 0 combines in top-k order itself, so every layout
 * gives the ids and logits of an in-process run.
 *
 * Start-up: every rank parses the same command line. Each expert rank sends rank 0 its host
 * name and a digest of config.json, the index and every shard's size and header; rank 0
 * refuses (exit 2) naming the host whose checkpoint differs from its own.
 *
 * Messages (MPI_COMM_WORLD, bytes): request {u32 magic, i32 layer, u32 ntok, u32 npairs}
 * + ntok latent rows [ntok][L] f32 + npairs (token, expert) i32 pairs; answer: npairs rows
 * [npairs][L] f32, or an error text (tag ERR). Every received message is checked against
 * sizes computed from the config (lengths, layer, token and expert ranges, ownership).
 *
 * Faults: Open MPI 4.1 cannot survive a lost rank (ULFM is 5.x). Errors are returned
 * (MPI_ERRORS_RETURN); a rank that does not answer within the timeout is reported with its
 * rank and host, the run fails (exit 1, no token printed after the last complete one) and
 * experts_mpi_abort ends every rank (MPI_Abort), so no rank is orphaned; `--checkpoint`
 * keeps the state to `--resume` from. */
#ifndef K3_EXPERTS_MPI_H
#define K3_EXPERTS_MPI_H

#include "coordinator/expert_backend.h"
#include "coordinator/model.h"

typedef struct {
    const char *model_dir;
    int timeout_ms;          /* an expert rank silent this long has failed */
    uint64_t cache_bytes;    /* per rank (0: all of its experts) */
    const char *policy;      /* cache policy name, NULL: default */
    const char *simd;        /* kernel level name */
    int threads;             /* OpenMP threads per rank (0: all cores of its host) */
    size_t max_tokens;       /* most latent rows in one request (the engine's max_rows) */
} mpi_options;

/* MPI_Init (once) and this process's rank and the world size. */
int experts_mpi_init(int *argc, char ***argv, int *rank, int *size, k3_error *err);
/* Rank >= 1: serve until rank 0 says stop; returns the exit status. */
int experts_mpi_serve(const mpi_options *o);
/* Rank 0: the backend (checks every rank's checkpoint first). */
int experts_mpi_create(expert_backend *b, k3_model *m, const mpi_options *o, k3_error *err);
/* Rank 0: per-rank stats for --json. */
typedef struct {
    uint64_t requests, bytes_sent, bytes_received;
    double wait_s;
    char host[64];
} mpi_rank_stats;
int experts_mpi_stats(const expert_backend *b, int rank, mpi_rank_stats *s);
/* Rank 0: tells every expert rank to stop and finalizes when ok; after a failure ends every
 * rank with MPI_Abort(status) (no orphans). Expert ranks: finalize (ok) or abort. */
void experts_mpi_finish(int rank, int size, int ok, int status);

#endif
