/* generate.h - feeding tokens through the engine: chunked prefill and greedy choice.
 *
 * feed_tokens runs ids[0..n) (positions st->pos..) through forward_chunk in
 * chunks of at most `chunk` tokens and stores the logits of every fed position
 * p >= want_from (absolute position) at logits[(p - want_from) * vocab].
 * Chunking never changes a bit of the result (forward.h). */
#ifndef K3_GENERATE_H
#define K3_GENERATE_H

#include "coordinator/forward.h"

int feed_tokens(engine *en, seq_state *st, const int32_t *ids, size_t n, size_t chunk, size_t want_from, float *logits,
                k3_error *err);
/* arg-max, lowest id on ties; -1 if any logit is not finite. */
int32_t argmax_logits(const float *logits, size_t n);

#endif
