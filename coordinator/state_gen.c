/* state_gen.c - gen_seq to and from state files (see state_gen.h). */
#include "coordinator/state_gen.h"
#include <string.h>

int gen_seq_save(const char *path, const state_fingerprint *fp, const k3_config *cfg, const gen_seq *g,
                 state_run *run, k3_error *err) {
    run->sampling = g->smp.cfg;
    run->rng = g->smp.rng;
    run->stop_ids = g->stop_ids;
    run->n_stop_ids = g->n_stop_ids;
    return state_file_save(path, fp, cfg, g->ids, g->n, &g->st, run, err);
}

int gen_seq_adopt(gen_seq *g, seq_state *st, const int32_t *ids, size_t n, const k3_rng *rng, k3_error *err) {
    if (n > g->cap) return k3_fail(err, "a history of %zu ids does not fit a context of %zu", n, g->cap);
    if (st->pos > n) return k3_fail(err, "state has %zu fed positions but a history of %zu", st->pos, n);
    seq_state old = g->st;
    g->st = *st;
    *st = old;
    memcpy(g->ids, ids, n * sizeof *ids);
    g->n = n;
    if (rng) g->smp.rng = *rng;
    return 0;
}
