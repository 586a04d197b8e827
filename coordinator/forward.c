/* forward.c - the layer walk with Attention Residuals, final mix, norm and lm head.
 *
 * Per token, B = [] (block snapshots), P = embedding:
 *   h = P if B empty else mix(B + [P], attn_res);  at a block start push P, P = none
 *   a = Attn(RMSNorm(h)); P = a or P + a;  h = mix(B + [P], mlp_res);  P += FFN(RMSNorm(h))
 * then h = mix(B + [P], output_res); logits = lm_head(RMSNorm(h, norm)). */
#include "coordinator/forward.h"
#include "common/activations.h"
#include "common/layer_schema.h"
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

typedef struct {
    float *P, *h, *xn, *a, *lm;
    float *blocks[64];
    int32_t *trace;
    fwd_segment *seg;
} fwd_bufs;

static int fwd_layout(scratch *sc, const k3_config *c, size_t R, size_t max_seqs, size_t lm_rows, fwd_bufs *B) {
    size_t E = (size_t)c->hidden_size, f = sizeof(float), re = R * E * f;
    int maxb = config_max_blocks(c), ok = 1;
    B->P = scratch_take(sc, re);
    B->h = scratch_take(sc, re);
    B->xn = scratch_take(sc, re);
    B->a = scratch_take(sc, re);
    B->lm = scratch_take(sc, R * lm_rows * f);
    for (int b = 0; b < maxb && b < 64; b++) ok &= (B->blocks[b] = scratch_take(sc, re)) != NULL;
    B->trace = scratch_take(sc, R * (size_t)c->num_experts_per_token * sizeof(int32_t));
    B->seg = scratch_take(sc, max_seqs * sizeof(fwd_segment));
    return ok && B->P && B->h && B->xn && B->a && B->lm && B->trace && B->seg ? 0 : -1;
}

static size_t layers_scratch_bytes(const k3_config *c, size_t R, size_t max_ctx, int nthreads) {
    size_t mx = mlp_scratch_bytes(c, R), b;
    if ((b = moe_scratch_bytes(c, R)) > mx) mx = b;
    if ((b = kda_scratch_bytes(c, R, nthreads)) > mx) mx = b;
    if ((b = mla_scratch_bytes(c, R, nthreads, max_ctx)) > mx) mx = b;
    return mx;
}

size_t forward_scratch_bytes(const k3_config *c, size_t max_rows, size_t max_ctx, int nthreads, size_t lm_chunk_rows) {
    scratch s = {0};
    fwd_bufs B;
    if (lm_chunk_rows == 0 || lm_chunk_rows > (size_t)c->vocab_size) lm_chunk_rows = (size_t)c->vocab_size;
    fwd_layout(&s, c, max_rows, max_rows, lm_chunk_rows, &B);
    return s.used + layers_scratch_bytes(c, max_rows, max_ctx, nthreads) + 64;
}

/* Fault the arena's pages in now, in the team's threads (a page a write), rather than inside
 * the first prompt's prefill: on a VM the first touch of fresh memory costs a hypervisor fault
 * per 4 KiB page (0.2-1 GB/s measured), which landed in the first request's prefill_s. */
static void arena_pretouch(char *p, size_t bytes, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (size_t o = 0; o < bytes; o += 4096) p[o] = 0;
}

int engine_init(engine *en, size_t max_rows, size_t max_ctx, int nthreads, k3_error *err) {
    const k3_config *c = &en->model->cfg;
    if (max_rows == 0) max_rows = 1;
    if (nthreads < 1) nthreads = 1;
    if (config_max_blocks(c) + 1 > 64) return k3_fail(err, "%d AttnRes blocks: more than this build supports (63)", config_max_blocks(c));
    en->max_rows = max_rows;
    en->max_ctx = max_ctx;
    en->nthreads = nthreads;
    size_t bytes = forward_scratch_bytes(c, max_rows, max_ctx, nthreads, trunk_lm_chunk_rows(en->trunk));
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes)) return k3_fail(err, "cannot allocate the %zu-byte scratch arena", bytes);
    en->arena = (scratch){p, bytes, 0};
    arena_pretouch(p, bytes, nthreads);
    /* the kernels' buffers of this thread and its team, now rather than in the first pass */
    if (engine_reserve_thread(en, err)) {
        engine_free(en);
        return -1;
    }
    return 0;
}

size_t forward_x_doubles(const k3_config *c) {
    size_t dense = 2 * (size_t)ls_widest_trunk_input(c);
    size_t experts = (size_t)c->num_experts_per_token * (size_t)c->moe_intermediate_size;
    if ((size_t)c->routed_expert_hidden_size > experts) experts = (size_t)c->routed_expert_hidden_size;
    return dense > experts ? dense : experts;
}

int engine_reserve_thread(const engine *en, k3_error *err) {
    size_t nx = forward_x_doubles(&en->model->cfg);
    if (matmul_reserve_x(nx))
        return k3_fail(err, "cannot allocate the one-token input buffer (%zu bytes)", nx * sizeof(double));
    if (en->k && matmul_reserve_gemm(en->k, en->nthreads))
        return k3_fail(err, "cannot allocate the prefill kernels' workspace (%zu bytes a thread)", matmul_gemm_ws_bytes());
    return 0;
}

void engine_free(engine *en) {
    free(en->arena.base);
    en->arena = (scratch){0};
}

static int forward_walk(engine *en, trunk_pass *tp, forward_seq *seqs, size_t n_seqs, k3_error *err) {
    k3_model *m = en->model;
    const k3_config *c = &m->cfg;
    const kernels *k = en->k;
    size_t E = (size_t)c->hidden_size, V = (size_t)c->vocab_size, K = (size_t)c->num_experts_per_token;
    size_t R = 0;
    for (size_t i = 0; i < n_seqs; i++) {
        if (seqs[i].n == 0) return k3_fail(err, "forward: sequence %zu of the batch has no tokens", i);
        for (size_t t = 0; t < seqs[i].n; t++)
            if (seqs[i].tokens[t] < 0 || seqs[i].tokens[t] >= c->vocab_size)
                return k3_fail(err, "token id %d is outside the vocabulary [0, %d)", seqs[i].tokens[t], c->vocab_size);
        if (seqs[i].st->pos + seqs[i].n > en->max_ctx)
            return k3_fail(err, "the sequence would reach %zu positions, past the engine's context of %zu",
                           seqs[i].st->pos + seqs[i].n, en->max_ctx);
        R += seqs[i].n;
    }
    if (R > en->max_rows)
        return k3_fail(err, "a forward call of %zu rows exceeds the engine's %zu (split it)", R, en->max_rows);
    scratch *sc = &en->arena;
    fwd_bufs B;
    if (fwd_layout(sc, c, R, n_seqs, trunk_lm_chunk_rows(en->trunk), &B))
        return k3_fail(err, "forward scratch exceeds the engine's arena (%zu rows, %zu sequences)", R, n_seqs);
    float *P = B.P, *h = B.h, *xn = B.xn, *a = B.a;
    float *const *blocks = B.blocks;
    int32_t *trace = en->on_route ? B.trace : NULL;
    fwd_segment *sg = B.seg;
    fwd_phases *pf = &en->phases;
    fph_begin(pf);
    for (size_t i = 0; i < n_seqs; i++) /* a chunk's embedding rows read ahead, together */
        if (seqs[i].n > 1) trunk_embed_prefetch(en->trunk, seqs[i].tokens, seqs[i].n);
    for (size_t i = 0, row = 0; i < n_seqs; i++) {
        if (seq_state_reserve(seqs[i].st, c, seqs[i].st->pos + seqs[i].n, err)) return -1;
        sg[i] = (fwd_segment){seqs[i].st, row, seqs[i].n, seqs[i].st->pos};
        for (size_t t = 0; t < seqs[i].n; t++) /* embedding rows, read on demand */
            if (trunk_embed_row(en->trunk, seqs[i].tokens[t], P + (row + t) * E, err)) return -1;
        row += seqs[i].n;
    }
    int nb = 0, p_valid = 1;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const layer_weights *lw = &m->layers[l];
        if (nb == 0) memcpy(h, P, R * E * sizeof *h);
        else mix_chunk(blocks, nb, P, 0, R, E, lw->attn_res_w, c->rms_norm_eps, h);
        if (l % c->attn_res_block_size == 0) { /* push, then clear */
            memcpy(blocks[nb++], P, R * E * sizeof *P);
            p_valid = 0;
        }
        for (size_t t = 0; t < R; t++) rmsnorm(xn + t * E, h + t * E, lw->input_norm, E, c->rms_norm_eps);
        fph_lap(pf, FP_MIX, 0);
        int bad = lw->is_mla ? mla_forward(tp, k, c, &lw->mla, l, sg, n_seqs, xn, R, a, sc, en->nthreads, en->max_ctx, pf, err)
                             : kda_forward(tp, k, c, &lw->kda, l, sg, n_seqs, xn, R, a, sc, en->nthreads, pf, err);
        trunk_release_current(tp);
        if (bad) return -1;
        if (p_valid) for (size_t i = 0; i < R * E; i++) P[i] += a[i];
        else memcpy(P, a, R * E * sizeof *P);
        p_valid = 1;
        mix_chunk(blocks, nb, P, 0, R, E, lw->mlp_res_w, c->rms_norm_eps, h);
        for (size_t t = 0; t < R; t++) rmsnorm(xn + t * E, h + t * E, lw->post_norm, E, c->rms_norm_eps);
        fph_lap(pf, FP_MIX, 0);
        bad = lw->is_moe ? moe_forward(tp, k, c, &lw->moe, l, en->experts, xn, R, a, trace, sc, pf, err)
                         : mlp_forward(tp, k, c, &lw->mlp, xn, R, a, sc, err);
        trunk_release_current(tp);
        if (bad) return -1;
        if (!lw->is_moe) fph_lap(pf, FP_MLP, mlp_flop(&lw->mlp, R));
        if (trace && lw->is_moe)
            for (size_t i = 0; i < n_seqs; i++)
                for (size_t t = 0; t < sg[i].n; t++)
                    en->on_route(en->on_route_ctx, l, sg[i].pos + t, trace + (sg[i].row0 + t) * K, (int)K);
        for (size_t i = 0; i < R * E; i++) P[i] += a[i];
    }
    /* rows that want logits, packed: the final mix and norm only for them */
    size_t n = 0;
    for (size_t i = 0; i < n_seqs; i++) {
        if (!seqs[i].logits || seqs[i].logits_from >= seqs[i].n) continue;
        size_t first = sg[i].row0 + seqs[i].logits_from, cnt = seqs[i].n - seqs[i].logits_from;
        mix_chunk(blocks, nb, P, first, first + cnt, E, m->out_res_w, c->rms_norm_eps, h + n * E);
        n += cnt;
    }
    fph_lap(pf, FP_MIX, 0);
    for (size_t t = 0; t < n; t++) rmsnorm(xn + t * E, h + t * E, m->final_norm, E, c->rms_norm_eps);
    /* the lm head in row chunks; walked even when no logits are wanted, so the
     * trunk reader's fixed order holds */
    for (int ch = 0; ch < trunk_lm_chunks(en->trunk); ch++) {
        dense_weight w;
        size_t row0;
        if (trunk_acquire_lm(tp, ch, &w, &row0, err)) return -1;
        if (n) {
            matmul_dense(k, &w, xn, n, B.lm);
            size_t r = 0;
            for (size_t i = 0; i < n_seqs; i++) {
                if (!seqs[i].logits || seqs[i].logits_from >= seqs[i].n) continue;
                for (size_t t = 0; t < seqs[i].n - seqs[i].logits_from; t++, r++)
                    memcpy(seqs[i].logits + t * V + row0, B.lm + r * w.rows, w.rows * sizeof *B.lm);
            }
        }
        trunk_release_lm(tp, ch);
    }
    fph_lap(pf, FP_LM_HEAD, 2.0 * (double)V * (double)E * (double)n);
    for (size_t i = 0; i < n_seqs; i++) seqs[i].st->pos += seqs[i].n;
    return 0;
}

int forward_batch(engine *en, forward_seq *seqs, size_t n_seqs, k3_error *err) {
    if (n_seqs == 0) return 0;
    if (!en->arena.base) return k3_fail(err, "forward: the engine was not initialised (engine_init)");
    if (en->on_pass) en->on_pass(en->on_pass_ctx);
    trunk_pass tp;
    trunk_pass_begin(en->trunk, &tp);
    size_t mark = en->arena.used;
    int rc = forward_walk(en, &tp, seqs, n_seqs, err);
    en->passes++;
    en->arena.used = mark;
    trunk_pass_end(&tp, rc != 0);
    return rc;
}

int forward_chunk(engine *en, seq_state *st, const int32_t *tokens, size_t T, size_t logits_from, float *logits,
                  k3_error *err) {
    if (T == 0) return 0;
    forward_seq s = {st, tokens, T, logits_from, logits};
    return forward_batch(en, &s, 1, err);
}
