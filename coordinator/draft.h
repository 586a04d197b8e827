/* draft.h - where speculative proposals come from (generate.h gen_step_spec checks them).
 *
 * A proposal never changes an id: it only decides how many ids one verification pass may
 * confirm. Sources:
 *   ngram  the longest suffix of the history (at most DRAFT_NGRAM_MAX ids) that occurred
 *          earlier; proposes the ids that followed its most recent earlier occurrence
 *          (prompt lookup: free, helps on code, quoting and tool calls)
 *   ids    a fixed list (--draft-ids FILE: whitespace-separated ids), proposed in order as
 *          the continuation: after i generated ids, list[i..] (measures the mechanism at
 *          100 % and 0 % acceptance)
 *   model  a smaller checkpoint with the same tokenizer (--draft-model DIR, draft_model.h):
 *          its greedy continuation; opened by draft_attach once the target is loaded
 * draft_propose writes at most kmax ids to out and sets *n_out; -1 (err) only when a draft
 * model's pass failed. */
#ifndef K3_DRAFT_H
#define K3_DRAFT_H

#include "common/error.h"
#include "coordinator/draft_model.h"
#include <stddef.h>
#include <stdint.h>

#define DRAFT_NGRAM_MAX 16

typedef enum { DRAFT_NONE = 0, DRAFT_NGRAM, DRAFT_IDS, DRAFT_MODEL } draft_kind;

typedef struct draft_source {
    draft_kind kind;
    int32_t *list;   /* ids source */
    size_t n_list;
    const char *model_dir;
    draft_model *model; /* model source, once attached */
} draft_source;

/* kind from "none" / "ngram" / "ids" / "model"; ids_path is read for "ids"; model_dir
 * (--draft-model) is the model source's checkpoint (alone it means kind "model"). */
int draft_open(draft_source *d, const char *kind, const char *ids_path, const char *model_dir, k3_error *err);
/* Loads a model source (draft_model_open); nothing for the others. */
int draft_attach(draft_source *d, const k3_config *tcfg, const state_fingerprint *tfp, const kernels *k, int threads,
                 size_t chunk, size_t cap, k3_error *err);
void draft_close(draft_source *d);
int draft_propose(draft_source *d, const int32_t *hist, size_t n_hist, size_t n_generated, int32_t *out, size_t kmax,
                  size_t *n_out, k3_error *err);
const char *draft_name(const draft_source *d);

#endif
