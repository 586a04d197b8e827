/* generate.c - chunked prefill and arg-max (see generate.h). */
#include "coordinator/generate.h"
#include <math.h>

int feed_tokens(engine *en, seq_state *st, const int32_t *ids, size_t n, size_t chunk, size_t want_from, float *logits,
                k3_error *err) {
    size_t V = (size_t)en->model->cfg.vocab_size;
    if (chunk == 0) chunk = 1;
    for (size_t off = 0; off < n;) {
        size_t T = n - off < chunk ? n - off : chunk;
        size_t start = st->pos; /* absolute position of ids[off] */
        size_t from = want_from > start ? want_from - start : 0;
        float *dst = NULL;
        if (logits && from < T) dst = logits + (start + from - want_from) * V;
        if (forward_chunk(en, st, ids + off, T, from, dst, err)) return -1;
        off += T;
    }
    return 0;
}

int32_t argmax_logits(const float *logits, size_t n) {
    int32_t best = -1;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(logits[i])) return -1;
        if (best < 0 || logits[i] > logits[best]) best = (int32_t)i;
    }
    return best;
}
