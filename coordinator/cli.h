/* cli.h - bin/k3's command line: the options and their parsing.
 *
 * One table in cli.c (FLAGS: name, argument, field, range or setter, default, help) drives
 * everything: cli_parse (getopt_long built from it), cli_defaults, cli_usage (`--help`) and
 * cli_markdown (`--help-markdown`, the README's options table; tests/t_06_cli.sh checks the
 * README against it). How to add a flag: the comment above FLAGS in cli.c.
 *
 * cli_parse fills an options struct from argv, range-checks every number, refuses
 * contradictory combinations, and prints what is wrong on stderr (returning -1: the caller
 * exits 2). It allocates only o->stop_ids (free() it). `--help` / `--help-markdown` print
 * and exit 0. */
#ifndef K3_CLI_H
#define K3_CLI_H

#include "common/error.h"
#include "common/kernels.h"
#include "coordinator/chat.h"
#include "coordinator/sampler.h"
#include <stdint.h>
#include <stdio.h>

enum { EXIT_OK = 0, EXIT_RUNTIME = 1, EXIT_USAGE = 2 };

typedef struct {
    const char *model_dir, *ids_arg, *prompt, *prompt_file, *json_path, *logits_path;
    const char *tok_dir, *encode_file, *decode_file, *trace_path;
    long gen, threads, chunk;
    int teacher_force, full_recompute, no_special;
    simd_level simd;
    /* expert servers */
    long workers, workers_per_node, worker_threads, timeout_ms, max_restarts;
    double cache_mb;
    const char *cache_policy;   /* NULL: the cache's default */
    long read_threads;          /* reads in flight per reader (trunk streamer, in-process expert cache) */
    int expert_prefetch;        /* ep_mode: 0 off, 1 predict (recall only), 2 on (hints start reads) */
    int preload_experts;        /* read every expert the caches hold at load (else on first use) */
    int numa;
    /* memory */
    double mem_gb;              /* 0: not given */
    int map_trunk;              /* --mmap: the pinned trunk is the checkpoint's mapped pages (trunk_config.map_pinned) */
    const char *preset;
    int list_presets, plan_only;
    long max_context;
    /* sampling and chat */
    sampler_config sampling;
    int chat, thinking;
    const char *system;
    chat_template tmpl;
    long max_tokens;
    /* speculation (draft.h) */
    const char *draft, *draft_ids, *draft_rollback, *draft_model;
    int mpi;                  /* --mpi: expert ranks over Open MPI (experts_mpi.h) */
    long draft_max;
    int32_t *stop_ids;
    size_t n_stop_ids;
    /* state files and snapshots (state_file.h, snapshots.h) */
    const char *save_state, *load_state, *checkpoint, *resume, *state_dir;
    long checkpoint_every;
    double state_dir_mb;
    /* operator tools: --doctor [MODEL_DIR], --verify MODEL_DIR */
    int doctor, verify, sha256;
    const char *expect_path;
    /* --serve (server_http.h) */
    int serve;
    const char *host, *api_key;
    long port, parallel, max_queue, snapshot_mb, http_timeout;
} options;

int cli_parse(int argc, char **argv, options *o);
/* Every field at its default (the table's defaults through the same setters). 0 or -1. */
int cli_defaults(options *o, k3_error *err);
void cli_usage(FILE *f);
void cli_markdown(FILE *f);
/* "1,2,3" -> ids (malloc'd); strict: digits and single commas only. 0 or -1. */
int parse_ids(const char *s, int32_t **ids, size_t *n);

#endif
