/* state_gen.h - a generating sequence (gen_seq, generate.h) to and from a state file.
 *
 * gen_seq_save writes g's history, fed state, sampler settings and generator state, with the
 * caller's run settings (run->kind, text, gen_target, n_prompt, ckpt_every, tmpl, thinking;
 * the sampler fields and stop ids are taken from g). Atomic (state_file.h).
 * gen_seq_adopt makes g continue a loaded state: g must be gen_seq_init'ed (empty) with
 * cap >= n; it takes over *st (which is left empty, to be seq_state_free'd), copies ids
 * (ids[0..st->pos) fed, the rest pending) and sets the generator state when rng != NULL. */
#ifndef K3_STATE_GEN_H
#define K3_STATE_GEN_H

#include "coordinator/generate.h"
#include "coordinator/state_file.h"

int gen_seq_save(const char *path, const state_fingerprint *fp, const k3_config *cfg, const gen_seq *g,
                 state_run *run, k3_error *err);
int gen_seq_adopt(gen_seq *g, seq_state *st, const int32_t *ids, size_t n, const k3_rng *rng, k3_error *err);

#endif
