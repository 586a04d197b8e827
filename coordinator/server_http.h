/* server_http.h - `bin/k3 MODEL --serve`: the OpenAI-compatible HTTP server (docs in README "Serve").
 *
 * Contract
 * - HTTP by libmicrohttpd (thread per connection, internal listener), JSON by jansson. Binds
 *   cfg->host (default 127.0.0.1) : cfg->port (0 = any free port); prints
 *   "k3: serving on http://HOST:PORT" on stderr when it accepts connections.
 * - Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
 *   GET /metrics (Prometheus text), POST /tokenize, POST /detokenize, GET / (the chat page).
 *   Anything else: 404 (unknown path) or 405 (known path, wrong method). Errors are OpenAI-shaped
 *   {"error": {"message", "type", "param", "code"}}.
 * - With cfg->api_key every route but GET / and GET /health needs "Authorization: Bearer KEY",
 *   compared in time independent of where the keys differ (401 otherwise).
 * - Limits: body > cfg->body_limit -> 413; request headers beyond the connection memory limit are
 *   refused by the library; an idle or slow client is dropped after cfg->timeout_s; a full queue
 *   -> 429 with Retry-After; while shutting down -> 503 with Retry-After. A client that goes away
 *   (socket closed) cancels its sequence; the slot is free at the next step.
 * - Streams: server-sent events "data: {chunk}\n\n", the last "data: [DONE]\n\n"; reasoning and
 *   content as deltas, each tool call as one delta when complete, usage in a last chunk when
 *   stream_options.include_usage.
 * - Prefix snapshots (snapshots.h): in memory (cfg->snapshot_bytes) and, with cfg->state_dir, as
 *   files there, so a restarted server restores a stored prefix from disk (/metrics
 *   k3_snapshot_disk_hits_total).
 * - SIGTERM / SIGINT: new requests get 503, in-flight ones are cancelled (streams end with an error
 *   event and [DONE]), the daemon stops, and server_run returns 0; the caller then stops the expert
 *   servers. */
#ifndef K3_SERVER_HTTP_H
#define K3_SERVER_HTTP_H

#include "coordinator/chat.h"
#include "coordinator/forward.h"
#include "coordinator/state_file.h"
#include <stdint.h>

typedef struct {
    uint64_t expert_hits, expert_misses, expert_bytes_read, trunk_bytes_streamed;
    int expert_restarts, n_workers;
} server_engine_stats;

typedef struct {
    const char *host;
    int port;
    const char *api_key;           /* NULL: no auth */
    size_t parallel, max_queue, chunk, max_context, default_max_tokens;
    int thinking;                  /* default for chat requests (K3) */
    chat_template tmpl;            /* AUTO: detect */
    const char *model_name;
    size_t body_limit;             /* bytes */
    uint64_t snapshot_bytes;       /* prefix snapshots kept in memory (0 = none) */
    const char *state_dir;         /* prefix snapshots also on disk here (NULL = none): reused across restarts */
    uint64_t state_dir_bytes;      /* cap of the files in state_dir */
    const state_fingerprint *fp;   /* the model's (keys the disk snapshots); needed with state_dir */
    unsigned timeout_s;            /* idle connection timeout */
    size_t draft_max;              /* --draft ngram: proposals per decoding slot and step (0 = off; sched_config) */
    int draft_per_position;        /* the plan's rollback */
    void (*engine_stats)(void *ctx, server_engine_stats *st);
    void *engine_stats_ctx;
} server_config;

void server_config_default(server_config *c);
/* Runs until SIGTERM/SIGINT. 0 on a clean stop, 2 for refused settings (bad host, port taken,
 * no chat template), 1 for run-time failures; message in err. */
int server_run(engine *en, const tokenizer *tok, const server_config *cfg, k3_error *err);

/* The static chat page (webpage.c). */
extern const char k3_webpage_html[];

#endif
