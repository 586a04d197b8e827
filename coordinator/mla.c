/* mla.c - gated multi-head latent attention, NoPE (K3-MODEL.md 4.3).
 *
 * The cache holds per position [RMSNorm(c_kv) | k_pe] (kv_lora + rope floats).
 * kv_b is applied on use by absorption: for head h,
 *   q_nope . (Wk_h c)  =  (Wk_h^T q_nope) . c      and    o_h = Wv_h (sum_s p_s c_s),
 * so the per-head keys and values are never expanded. The rope part of the key
 * is ONE vector shared by all heads, never rotated; the score scale is
 * (nope+rope)^-0.5. Output: o * sigmoid(Wg x) (gate only, no norm), then Wo. */
#include "common/activations.h"
#include "coordinator/layers.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

int mla_forward(trunk *tr, const kernels *k, const k3_config *c, const mla_weights *w, mla_state *st, size_t pos, const float *x,
                size_t T, float *out, k3_error *err) {
    size_t H = (size_t)c->num_attention_heads, qr = (size_t)c->q_lora_rank, kr = (size_t)c->kv_lora_rank,
           nope = (size_t)c->qk_nope_head_dim, rope = (size_t)c->qk_rope_head_dim, vd = (size_t)c->v_head_dim;
    size_t qh = nope + rope, row = kr + rope, kvh = nope + vd;
    double scale = 1.0 / sqrt((double)qh);
    float *qa = malloc(T * qr * sizeof *qa), *q = malloc(T * H * qh * sizeof *q);
    float *ckv = malloc(T * row * sizeof *ckv), *o = malloc(T * H * vd * sizeof *o);
    float *gate = c->mla_use_output_gate ? malloc(T * H * vd * sizeof *gate) : NULL;
    int rc = -1;
    if (!qa || !q || !ckv || !o || (c->mla_use_output_gate && !gate)) { k3_fail(err, "out of memory in MLA"); goto out; }
    if (pos + T > st->cap) { k3_fail(err, "MLA cache has no room for position %zu", pos + T - 1); goto out; }
    if (trunk_matmul(tr, k, &w->q_a, x, T, qa, err)) goto out;
    for (size_t t = 0; t < T; t++) rmsnorm(qa + t * qr, qa + t * qr, w->q_a_norm, qr, MLA_LATENT_NORM_EPS);
    if (trunk_matmul(tr, k, &w->q_b, qa, T, q, err)) goto out;
    if (trunk_matmul(tr, k, &w->kv_a, x, T, ckv, err)) goto out;
    for (size_t t = 0; t < T; t++) {
        float *dst = st->cache + (pos + t) * row;
        rmsnorm(dst, ckv + t * row, w->kv_a_norm, kr, MLA_LATENT_NORM_EPS);
        memcpy(dst + kr, ckv + t * row + kr, rope * sizeof *dst); /* k_pe: not normalised, not rotated */
    }
    if (c->mla_use_output_gate && trunk_matmul(tr, k, &w->g, x, T, gate, err)) goto out;
    if (trunk_need(tr, &w->kv_b, err)) goto out; /* read by every head below */
    int failed = 0;
#pragma omp parallel for schedule(static)
    for (size_t h = 0; h < H; h++) {
        size_t npos = pos + T;
        double *qlat = malloc((kr + kr + npos) * sizeof *qlat);
        float *ctxf = malloc(kr * sizeof *ctxf);
        if (!qlat || !ctxf) { failed = 1; free(qlat); free(ctxf); continue; }
        double *ctx = qlat + kr, *p = ctx + kr;
        for (size_t t = 0; t < T; t++) {
            const float *qn = q + (t * H + h) * qh, *qpe = qn + nope;
            /* q_lat[c] = sum_r Wkv_b[h*kvh + r][c] * q_nope[r], r in order */
            for (size_t cc = 0; cc < kr; cc++) qlat[cc] = 0;
            for (size_t r = 0; r < nope; r++) {
                double qv = qn[r];
                for (size_t cc = 0; cc < kr; cc++) qlat[cc] += (double)dense_at(&w->kv_b, h * kvh + r, cc) * qv;
            }
            size_t last = pos + t; /* causal: positions 0..last */
            for (size_t s = 0; s <= last; s++) {
                const float *cs = st->cache + s * row;
                double dl = 0, dp = 0;
                for (size_t cc = 0; cc < kr; cc++) dl += qlat[cc] * (double)cs[cc];
                for (size_t r = 0; r < rope; r++) dp += (double)qpe[r] * (double)cs[kr + r];
                p[s] = (dl + dp) * scale;
            }
            softmax_d(p, last + 1);
            for (size_t cc = 0; cc < kr; cc++) ctx[cc] = 0;
            for (size_t s = 0; s <= last; s++) {
                const float *cs = st->cache + s * row;
                for (size_t cc = 0; cc < kr; cc++) ctx[cc] += p[s] * (double)cs[cc];
            }
            for (size_t cc = 0; cc < kr; cc++) ctxf[cc] = (float)ctx[cc];
            float *oh = o + (t * H + h) * vd;
            for (size_t m = 0; m < vd; m++) {
                float val = dense_row_dot(k, &w->kv_b, h * kvh + nope + m, ctxf);
                if (c->mla_use_output_gate) val = (float)((double)val * sigmoid_d(gate[(t * H + h) * vd + m]));
                oh[m] = val;
            }
        }
        free(qlat);
        free(ctxf);
    }
    if (failed) { k3_fail(err, "out of memory in MLA heads"); goto out; }
    if (trunk_matmul(tr, k, &w->o, o, T, out, err)) goto out;
    rc = 0;
out:
    free(qa); free(q); free(ckv); free(o); free(gate);
    return rc;
}
