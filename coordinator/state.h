/* state.h - everything a conversation carries between tokens (owned by the coordinator).
 *
 * Per KDA layer: the recurrent state S [H][D_k][D_v] (fp32, starts at 0) and the
 * conv history: the last K-1 PRE-conv inputs of q, k, v ([3][K-1][P], oldest first,
 * zeros before the sequence start). Per MLA layer: the compressed cache, one row of
 * kv_lora + rope floats per position = [RMSNorm(c_kv) | k_pe] (the latent AFTER its
 * norm; kv_b is applied on use). Nothing else survives a token: the AttnRes block
 * stack lives within one token. A worker never holds any of this. */
#ifndef K3_STATE_H
#define K3_STATE_H

#include "common/config.h"
#include "common/error.h"
#include <stddef.h>

typedef struct {
    float *S;     /* [H][D][D] */
    float *conv;  /* [3][K-1][P] */
} kda_state;

typedef struct {
    float *cache; /* [cap][kv_lora + rope] */
    size_t cap;
} mla_state;

typedef struct {
    size_t pos;   /* tokens consumed so far */
    int n_layers;
    kda_state *kda;
    mla_state *mla;
    size_t max_pos; /* 0, or the planned context (--max-context): never more positions, never more cache */
    /* optional, set for one forward call (speculation): the recurrent part after each of the
     * call's first keep_n tokens, at keep + i * seq_state_recurrent_bytes (the layout of
     * seq_state_save_recurrent), written by the KDA layers as they go (no extra pass) */
    void *keep;
    size_t keep_n;
} seq_state;

int seq_state_init(seq_state *s, const k3_config *cfg, k3_error *err);
/* Back to an empty sequence (zeros, pos 0); keeps allocations. */
void seq_state_reset(seq_state *s, const k3_config *cfg);
/* Makes room for positions [0, need) in every MLA cache; with max_pos set, a
 * need past it is refused and no cache grows beyond it. */
int seq_state_reserve(seq_state *s, const k3_config *cfg, size_t need, k3_error *err);
void seq_state_free(seq_state *s);
/* The recurrent part (every KDA layer's S and conv history): what cannot be cut back to an
 * earlier position. Bytes of a copy, save into buf, and restore with the position it had
 * (MLA rows below that position are untouched by later feeds of higher positions, so
 * restoring the recurrent part and pos rolls a sequence back exactly). */
size_t seq_state_recurrent_bytes(const k3_config *cfg);
void seq_state_save_recurrent(const seq_state *s, const k3_config *cfg, void *buf);
void seq_state_restore_recurrent(seq_state *s, const k3_config *cfg, const void *buf, size_t pos);
/* Where KDA layer l's S ([H][D][D] floats) starts in that layout; its conv history
 * ([3][K-1][P] floats) follows it. */
size_t seq_state_recurrent_offset(const k3_config *cfg, int l);

#endif
