/* state_file.h - a conversation on disk: the sequence state, its token history, the sampler and
 * the settings needed to continue, bound to one model (docs/FORMATS.md "State files").
 *
 * Contract
 * - Format version STATE_FILE_VERSION, little-endian: a 24-byte header (magic "K3STATE\0",
 *   version, section count, XXH64 of the first 16 bytes), then sections in a fixed order:
 *   FPRT (model fingerprint), RUN (settings, sampler and generator state), TOKS (history and
 *   how much of it is fed), one KDA section per KDA layer (S then conv history) and one MLA
 *   section per MLA layer (the cache rows of the fed positions), ascending layer order. Every
 *   section is [tag 4][index u32][length u64][XXH64 of tag|index|length|payload][payload].
 * - state_file_save writes PATH atomically: PATH.k3tmp in the same directory (0600), fsync,
 *   rename over PATH, fsync of the directory. A failure or crash at any point leaves the
 *   previous PATH untouched (a stale PATH.k3tmp may remain after a crash; the next save
 *   overwrites it). Test hook: K3_STATE_FAULT="fail:N" makes the write fail after N bytes,
 *   "crash:N" _exits(3) the process there (a kill mid-save).
 * - state_file_load reads a file and checks EVERYTHING before it is used: magic, header
 *   checksum, version (a newer one is refused by name), section tags/order/count, every
 *   section's length against the size computed from the CONFIG (never from the file), every
 *   section's checksum (the message names the section), the fingerprint part by part (config,
 *   tokenizer model, tokenizer config, checkpoint index/headers + weight sample, numerics),
 *   ids inside the vocabulary, settings inside the sampler's ranges, history <= max_positions
 *   (checked before allocating), no trailing bytes. A refusal returns -1 with the reason in
 *   err; `st` is then undefined (load into a fresh state and swap on success).
 * - The state is loaded into `st` (seq_state_init'ed for cfg): st->pos = the fed count, the
 *   MLA caches reserved for at least that many positions.
 * - Sizes: state_file_bytes gives the exact file size for a history (for the plan and docs). */
#ifndef K3_STATE_FILE_H
#define K3_STATE_FILE_H

#include "common/checkpoint.h"
#include "common/config.h"
#include "common/error.h"
#include "coordinator/sampler.h"
#include "coordinator/state.h"
#include <stddef.h>
#include <stdint.h>

#define STATE_FILE_VERSION 1
#define STATE_MAX_STOP_IDS 1024

/* One hash per part, compared part by part (the refusal names the part that differs). */
typedef struct {
    uint64_t config;      /* config.json bytes */
    uint64_t tok_model;   /* tiktoken.model bytes (0-length file if absent) */
    uint64_t tok_config;  /* tokenizer_config.json bytes */
    uint64_t weights;     /* the index file, or every shard's header when there is none; plus the
                             first 4 KiB of every shard's tensor data */
    uint64_t numerics;    /* the engine's numerics contract (STATE_NUMERICS_ID) */
} state_fingerprint;

/* model_dir: config.json and the checkpoint; tok_dir: tokenizer files (NULL = model_dir);
 * ck: the opened checkpoint (shards, has_index). */
int state_fingerprint_compute(state_fingerprint *fp, const char *model_dir, const char *tok_dir,
                              const checkpoint *ck, k3_error *err);

enum { STATE_KIND_RUN = 0, STATE_KIND_CHAT = 1, STATE_KIND_SNAPSHOT = 2 };

typedef struct {
    uint32_t kind;           /* STATE_KIND_* */
    int text;                /* run: the prompt was text (stdout is text) */
    int thinking;            /* chat: K3 thinking section */
    int tmpl;                /* chat: chat_template value */
    uint64_t gen_target;     /* run: --gen of the run; chat: --max-tokens */
    uint64_t n_prompt;       /* run: ids before the first generated id */
    uint64_t ckpt_every;     /* run: --checkpoint-every (0 = none) */
    sampler_config sampling;
    k3_rng rng;              /* the generator state to continue from */
    int32_t *stop_ids;       /* save: borrowed; load: malloc'd (state_loaded_free) */
    size_t n_stop_ids;
} state_run;

typedef struct {
    int32_t *ids;            /* history: [0, st->pos) fed, the rest pending */
    size_t n_ids;
    state_run run;
} state_loaded;

/* ids[0..n_ids): the history, of which st->pos are fed (st->pos <= n_ids). */
int state_file_save(const char *path, const state_fingerprint *fp, const k3_config *cfg, const int32_t *ids,
                    size_t n_ids, const seq_state *st, const state_run *run, k3_error *err);
int state_file_load(const char *path, const state_fingerprint *fp, const k3_config *cfg, size_t max_positions,
                    seq_state *st, state_loaded *out, k3_error *err);
/* The same from bytes in memory (fuzzing, tests); name is used in messages. */
int state_file_load_mem(const void *buf, size_t len, const char *name, const state_fingerprint *fp,
                        const k3_config *cfg, size_t max_positions, seq_state *st, state_loaded *out, k3_error *err);
void state_loaded_free(state_loaded *l);

/* Exact file size for a history of n_ids ids of which pos are fed, with n_stop stop ids. */
uint64_t state_file_bytes(const k3_config *cfg, size_t n_ids, size_t pos, size_t n_stop);
/* Bytes of sequence state (KDA + MLA rows) for pos fed positions. */
uint64_t state_bytes_at(const k3_config *cfg, size_t pos);

#endif
