/* forward.c - the layer walk with Attention Residuals, final mix, norm and lm head.
 *
 * Per token, B = [] (block snapshots), P = embedding:
 *   h = P if B empty else mix(B + [P], attn_res);  at a block start push P, P = none
 *   a = Attn(RMSNorm(h)); P = a or P + a;  h = mix(B + [P], mlp_res);  P += FFN(RMSNorm(h))
 * then h = mix(B + [P], output_res); logits = lm_head(RMSNorm(h, norm)). */
#include "coordinator/forward.h"
#include "common/activations.h"
#include "coordinator/layers.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* AttnRes mix for one token: n sources of E floats, keys RMS-normalised (no
 * weight), score = key . wfold, softmax, output = sum p_s * RAW source. */
static void attn_res_mix(const float *const *src, size_t n, const double *wfold, size_t E, double eps, float *out) {
    double score[64];
    for (size_t s = 0; s < n; s++) {
        double ss = 0, dot = 0;
        for (size_t i = 0; i < E; i++) {
            ss += (double)src[s][i] * (double)src[s][i];
            dot += (double)src[s][i] * wfold[i];
        }
        score[s] = dot / sqrt(ss / (double)E + eps);
    }
    softmax_d(score, n);
    for (size_t i = 0; i < E; i++) {
        double acc = 0;
        for (size_t s = 0; s < n; s++) acc += score[s] * (double)src[s][i];
        out[i] = (float)acc;
    }
}

/* mix over B[0..nb) + [P] for chunk tokens first..T-1, into out[t - first]. */
static void mix_chunk(float *const *blocks, int nb, const float *P, size_t first, size_t T, size_t E,
                      const double *wfold, double eps, float *out) {
    for (size_t t = first; t < T; t++) {
        const float *src[64];
        for (int b = 0; b < nb; b++) src[b] = blocks[b] + t * E;
        src[nb] = P + t * E;
        attn_res_mix(src, (size_t)nb + 1, wfold, E, eps, out + (t - first) * E);
    }
}

int forward_chunk(engine *en, seq_state *st, const int32_t *tokens, size_t T, size_t logits_from, float *logits,
                  k3_error *err) {
    k3_model *m = en->model;
    const k3_config *c = &m->cfg;
    const kernels *k = en->k;
    size_t E = (size_t)c->hidden_size;
    int maxb = config_max_blocks(c);
    if (maxb + 1 > 64) return k3_fail(err, "%d AttnRes blocks: more than this build supports (63)", maxb);
    if (T == 0) return 0;
    for (size_t t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab_size)
            return k3_fail(err, "token id %d is outside the vocabulary [0, %d)", tokens[t], c->vocab_size);
    if (seq_state_reserve(st, c, st->pos + T, err)) return -1;

    int rc = -1, nb = 0, p_valid = 1;
    float *blocks[64] = {0};
    float *P = malloc(T * E * sizeof *P), *h = malloc(T * E * sizeof *h), *xn = malloc(T * E * sizeof *xn),
          *a = malloc(T * E * sizeof *a);
    int32_t *trace = en->on_route ? malloc(T * (size_t)c->num_experts_per_token * sizeof *trace) : NULL;
    if (!P || !h || !xn || !a || (en->on_route && !trace)) { k3_fail(err, "out of memory in forward"); goto out; }
    for (int b = 0; b < maxb; b++)
        if (!(blocks[b] = malloc(T * E * sizeof(float)))) { k3_fail(err, "out of memory in forward"); goto out; }

    for (size_t t = 0; t < T; t++) /* embedding rows, read on demand */
        if (trunk_embed_row(en->trunk, tokens[t], P + t * E, err)) goto out;

    for (int l = 0; l < c->num_hidden_layers; l++) {
        const layer_weights *lw = &m->layers[l];
        if (nb == 0) memcpy(h, P, T * E * sizeof *h);
        else mix_chunk(blocks, nb, P, 0, T, E, lw->attn_res_w, c->rms_norm_eps, h);
        if (l % c->attn_res_block_size == 0) { /* push, then clear */
            memcpy(blocks[nb++], P, T * E * sizeof *P);
            p_valid = 0;
        }
        for (size_t t = 0; t < T; t++) rmsnorm(xn + t * E, h + t * E, lw->input_norm, E, c->rms_norm_eps);
        int bad = lw->is_mla ? mla_forward(en->trunk, k, c, &lw->mla, &st->mla[l], st->pos, xn, T, a, err)
                             : kda_forward(en->trunk, k, c, &lw->kda, &st->kda[l], xn, T, a, err);
        trunk_release_current(en->trunk);
        if (bad) goto out;
        if (p_valid) for (size_t i = 0; i < T * E; i++) P[i] += a[i];
        else memcpy(P, a, T * E * sizeof *P);
        p_valid = 1;
        mix_chunk(blocks, nb, P, 0, T, E, lw->mlp_res_w, c->rms_norm_eps, h);
        for (size_t t = 0; t < T; t++) rmsnorm(xn + t * E, h + t * E, lw->post_norm, E, c->rms_norm_eps);
        bad = lw->is_moe ? moe_forward(en->trunk, k, c, &lw->moe, l, en->experts, xn, T, a, trace, err)
                         : mlp_forward(en->trunk, k, c, &lw->mlp, xn, T, a, err);
        trunk_release_current(en->trunk);
        if (bad) goto out;
        if (trace && lw->is_moe)
            for (size_t t = 0; t < T; t++)
                en->on_route(en->on_route_ctx, l, st->pos + t, trace + t * (size_t)c->num_experts_per_token,
                             c->num_experts_per_token);
        for (size_t i = 0; i < T * E; i++) P[i] += a[i];
    }
    size_t n = logits && logits_from < T ? T - logits_from : 0;
    if (n) {
        mix_chunk(blocks, nb, P, logits_from, T, E, m->out_res_w, c->rms_norm_eps, h);
        for (size_t t = 0; t < n; t++) rmsnorm(xn + t * E, h + t * E, m->final_norm, E, c->rms_norm_eps);
    }
    /* the lm head in row chunks; walked even when no logits are wanted, so the
     * trunk reader's fixed order holds */
    for (int ch = 0; ch < trunk_lm_chunks(en->trunk); ch++) {
        dense_weight w;
        size_t row0;
        if (trunk_acquire_lm(en->trunk, ch, &w, &row0, err)) goto out;
        if (n) {
            float *part = malloc(n * w.rows * sizeof *part);
            if (!part) { trunk_release_lm(en->trunk, ch); k3_fail(err, "out of memory in the lm head"); goto out; }
            matmul_dense(k, &w, xn, n, part);
            for (size_t t = 0; t < n; t++) memcpy(logits + t * (size_t)c->vocab_size + row0, part + t * w.rows, w.rows * sizeof *part);
            free(part);
        }
        trunk_release_lm(en->trunk, ch);
    }
    st->pos += T;
    rc = 0;
out:
    for (int b = 0; b < maxb; b++) free(blocks[b]);
    free(P); free(h); free(xn); free(a); free(trace);
    return rc;
}
