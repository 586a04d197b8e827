/* draft_model.c - a smaller checkpoint as the speculation draft (see draft_model.h). */
#include "coordinator/draft_model.h"
#include "coordinator/experts_local.h"
#include "coordinator/generate.h"
#include "coordinator/plan.h"
#include "coordinator/state_file.h"
#include <stdlib.h>
#include <string.h>

int draft_model_plan_bytes(const char *dir, size_t chunk, size_t cap, uint64_t *bytes, k3_error *err) {
    k3_config c;
    if (config_load(dir, &c, err)) return k3_fail(err, "--draft-model %s: %s", dir, err->msg);
    mem_plan p;
    int rc = plan_make(&p, &c, NULL, 0, 0, chunk, cap, err);
    if (!rc) *bytes = p.total - p.process_bytes; /* one process: the coordinator's */
    plan_free(&p);
    config_free(&c);
    return rc;
}

void draft_model_close(draft_model *d) {
    if (!d->open) return;
    engine_free(&d->en);
    if (d->eb.destroy) d->eb.destroy(&d->eb);
    trunk_free(d->tr);
    seq_state_free(&d->st);
    model_free(&d->m);
    free(d->fed);
    free(d->row);
    free(d->snap);
    memset(d, 0, sizeof *d);
}

int draft_model_open(draft_model *d, const char *dir, const k3_config *tcfg, const state_fingerprint *tfp,
                     const kernels *k, int threads, size_t chunk, size_t cap, k3_error *err) {
    memset(d, 0, sizeof *d);
    k3_error e = {0};
    if (model_load(dir, &d->m, &e)) return k3_fail(err, "--draft-model %s: %s", dir, e.msg);
    d->open = 1;
    if (d->m.cfg.vocab_size != tcfg->vocab_size) {
        k3_fail(err, "--draft-model %s: vocabulary of %d ids, the target's has %d (the draft must share the tokenizer)",
                dir, d->m.cfg.vocab_size, tcfg->vocab_size);
        goto fail;
    }
    state_fingerprint df; /* the tokenizer parts: the same bytes, else different ids */
    if (state_fingerprint_compute(&df, dir, NULL, &d->m.ck, &e)) {
        k3_fail(err, "--draft-model %s: %s", dir, e.msg);
        goto fail;
    }
    if (df.tok_model != tfp->tok_model || df.tok_config != tfp->tok_config) {
        k3_fail(err, "--draft-model %s: its %s differs from the target's (the draft must share the tokenizer)", dir,
                df.tok_model != tfp->tok_model ? "tiktoken.model" : "tokenizer_config.json");
        goto fail;
    }
    mem_plan p;
    if (plan_make(&p, &d->m.cfg, &d->m, 0, 0, chunk, cap, &e)) { k3_fail(err, "--draft-model %s: %s", dir, e.msg); goto fail; }
    trunk_config tc = {p.n_pinned, p.n_slots, p.lm_chunk_rows, 0, 0};
    uint64_t cache = p.expert_cache_per_worker;
    plan_free(&p);
    if (!(d->tr = trunk_create(&d->m, &tc, &e)) ||
        experts_local_create(&d->eb, &d->m, k, cache, CACHE_POLICY_DEFAULT, &e)) {
        k3_fail(err, "--draft-model %s: %s", dir, e.msg);
        goto fail;
    }
    d->en = (engine){.model = &d->m, .trunk = d->tr, .k = k, .experts = &d->eb};
    if (engine_init(&d->en, chunk, cap, threads, &e) || seq_state_init(&d->st, &d->m.cfg, &e)) {
        k3_fail(err, "--draft-model %s: %s", dir, e.msg);
        goto fail;
    }
    d->cap = cap;
    d->st.max_pos = cap;
    d->fed = malloc(cap * sizeof *d->fed);
    d->row = malloc((size_t)d->m.cfg.vocab_size * sizeof *d->row);
    d->snap = malloc(seq_state_recurrent_bytes(&d->m.cfg) + 1);
    if (!d->fed || !d->row || !d->snap) { k3_fail(err, "--draft-model %s: out of memory", dir); goto fail; }
    for (int u = 0; u < d->m.n_units; u++) d->trunk_bytes += d->m.units[u].bytes;
    d->trunk_bytes += (uint64_t)d->m.lm_head.rows * d->m.lm_head.cols * (d->m.lm_head.dtype == DTYPE_F32 ? 4 : 2);
    return 0;
fail:
    draft_model_close(d);
    return -1;
}

/* Feeds ids[0..n) to the draft in chunks, the last row's logits into d->row. */
static int feed(draft_model *d, const int32_t *ids, size_t n, k3_error *err) {
    while (n > 0) {
        size_t t = n < d->en.max_rows ? n : d->en.max_rows;
        memcpy(d->fed + d->st.pos, ids, t * sizeof *ids);
        if (forward_chunk(&d->en, &d->st, ids, t, t - 1, t == n ? d->row : NULL, err)) return -1;
        d->passes++;
        ids += t;
        n -= t;
    }
    return 0;
}

int draft_model_propose(draft_model *d, const int32_t *hist, size_t n, int32_t *out, size_t kmax, size_t *n_out,
                        k3_error *err) {
    const k3_config *c = &d->m.cfg;
    *n_out = 0;
    if (n == 0 || kmax == 0) return 0;
    if (n + kmax > d->cap) kmax = n < d->cap ? d->cap - n : 0;
    if (kmax == 0) return 0;
    size_t p = d->st.pos;
    if (p >= n || memcmp(d->fed, hist, p * sizeof *hist)) { /* not a prefix of the history: start over */
        seq_state_reset(&d->st, c);
        p = 0;
    }
    if (feed(d, hist + p, n - p, err)) goto fail;
    seq_state_save_recurrent(&d->st, c, d->snap);
    for (size_t i = 0; i < kmax; i++) {
        int32_t id = argmax_logits(d->row, (size_t)c->vocab_size);
        if (id < 0) break; /* a non-finite draft logit: propose what we have */
        out[(*n_out)++] = id;
        if (i + 1 < kmax && feed(d, &id, 1, err)) goto fail;
    }
    seq_state_restore_recurrent(&d->st, c, d->snap, n);
    return 0;
fail:
    seq_state_reset(&d->st, c); /* a failed pass leaves the state undefined: start over next time */
    return -1;
}
