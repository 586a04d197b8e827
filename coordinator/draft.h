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
 * draft_propose writes at most kmax ids to out and returns how many. */
#ifndef K3_DRAFT_H
#define K3_DRAFT_H

#include "common/error.h"
#include <stddef.h>
#include <stdint.h>

#define DRAFT_NGRAM_MAX 16

typedef enum { DRAFT_NONE = 0, DRAFT_NGRAM, DRAFT_IDS } draft_kind;

typedef struct {
    draft_kind kind;
    int32_t *list;   /* ids source */
    size_t n_list;
} draft_source;

/* kind from "none" / "ngram" / "ids"; ids_path is read for "ids". */
int draft_open(draft_source *d, const char *kind, const char *ids_path, k3_error *err);
void draft_close(draft_source *d);
size_t draft_propose(const draft_source *d, const int32_t *hist, size_t n_hist, size_t n_generated, int32_t *out,
                     size_t kmax);
const char *draft_name(const draft_source *d);

#endif
