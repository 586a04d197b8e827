/* mla.c - gated multi-head latent attention, NoPE (docs/MODEL.md 4.3).
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
#include <omp.h>
#include <string.h>

typedef struct {
    float *qa, *q, *ckv, *o, *gate;
    double *head;   /* [nthreads][2 kv_lora + max_ctx] */
    float *ctxf;    /* [nthreads][kv_lora] */
} mla_bufs;

static int mla_layout(scratch *sc, const k3_config *c, size_t R, int nthreads, size_t max_ctx, mla_bufs *B) {
    size_t H = (size_t)c->num_attention_heads, qr = (size_t)c->q_lora_rank, kr = (size_t)c->kv_lora_rank,
           rope = (size_t)c->qk_rope_head_dim, vd = (size_t)c->v_head_dim, qh = (size_t)c->qk_nope_head_dim + rope;
    size_t f = sizeof(float), nt = (size_t)nthreads;
    B->qa = scratch_take(sc, R * qr * f);
    B->q = scratch_take(sc, R * H * qh * f);
    B->ckv = scratch_take(sc, R * (kr + rope) * f);
    B->o = scratch_take(sc, R * H * vd * f);
    B->gate = c->mla_use_output_gate ? scratch_take(sc, R * H * vd * f) : NULL;
    B->head = scratch_take(sc, nt * (2 * kr + max_ctx) * sizeof(double));
    B->ctxf = scratch_take(sc, nt * kr * f);
    return B->qa && B->q && B->ckv && B->o && (B->gate || !c->mla_use_output_gate) && B->head && B->ctxf ? 0 : -1;
}

size_t mla_scratch_bytes(const k3_config *c, size_t R, int nthreads, size_t max_ctx) {
    scratch s = {0};
    mla_bufs B;
    mla_layout(&s, c, R, nthreads, max_ctx, &B);
    return s.used;
}

int mla_forward(trunk_pass *tp, const kernels *k, const k3_config *c, const mla_weights *w, int l, const fwd_segment *sg,
                size_t nseg, const float *x, size_t R, float *out, scratch *sc, int nthreads, size_t max_ctx,
                k3_error *err) {
    size_t H = (size_t)c->num_attention_heads, qr = (size_t)c->q_lora_rank, kr = (size_t)c->kv_lora_rank,
           nope = (size_t)c->qk_nope_head_dim, rope = (size_t)c->qk_rope_head_dim, vd = (size_t)c->v_head_dim;
    size_t qh = nope + rope, row = kr + rope, kvh = nope + vd;
    double scale = 1.0 / sqrt((double)qh);
    size_t mark = sc->used;
    mla_bufs B;
    int rc = -1;
    if (mla_layout(sc, c, R, nthreads, max_ctx, &B)) { k3_fail(err, "MLA scratch exceeds the engine's arena (%zu rows)", R); goto out; }
    for (size_t s = 0; s < nseg; s++) {
        if (sg[s].pos + sg[s].n > sg[s].st->mla[l].cap) { k3_fail(err, "MLA cache has no room for position %zu", sg[s].pos + sg[s].n - 1); goto out; }
        if (sg[s].pos + sg[s].n > max_ctx) {
            k3_fail(err, "position %zu is past the engine's context of %zu positions", sg[s].pos + sg[s].n - 1, max_ctx);
            goto out;
        }
    }
    float *qa = B.qa, *q = B.q, *ckv = B.ckv, *o = B.o, *gate = B.gate;
    if (trunk_matmul(tp, k, &w->q_a, x, R, qa, err)) goto out;
    for (size_t t = 0; t < R; t++) rmsnorm(qa + t * qr, qa + t * qr, w->q_a_norm, qr, MLA_LATENT_NORM_EPS);
    if (trunk_matmul(tp, k, &w->q_b, qa, R, q, err)) goto out;
    if (trunk_matmul(tp, k, &w->kv_a, x, R, ckv, err)) goto out;
    for (size_t s = 0; s < nseg; s++)
        for (size_t i = 0; i < sg[s].n; i++) {
            size_t t = sg[s].row0 + i;
            float *dst = sg[s].st->mla[l].cache + (sg[s].pos + i) * row;
            rmsnorm(dst, ckv + t * row, w->kv_a_norm, kr, MLA_LATENT_NORM_EPS);
            memcpy(dst + kr, ckv + t * row + kr, rope * sizeof *dst); /* k_pe: not normalised, not rotated */
        }
    if (c->mla_use_output_gate && trunk_matmul(tp, k, &w->g, x, R, gate, err)) goto out;
    dense_weight kvb;
    if (trunk_get(tp, &w->kv_b, &kvb, err)) goto out; /* read by every head below */
    size_t jobs = nseg * H;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (size_t job = 0; job < jobs; job++) {
        size_t s = job / H, h = job % H;
        int me = omp_get_thread_num();
        double *qlat = B.head + (size_t)me * (2 * kr + max_ctx);
        float *ctxf = B.ctxf + (size_t)me * kr;
        double *ctx = qlat + kr, *p = ctx + kr;
        const float *cache = sg[s].st->mla[l].cache;
        for (size_t i = 0; i < sg[s].n; i++) {
            size_t t = sg[s].row0 + i;
            const float *qn = q + (t * H + h) * qh, *qpe = qn + nope;
            /* q_lat[c] = sum_r Wkv_b[h*kvh + r][c] * q_nope[r], r in order */
            for (size_t cc = 0; cc < kr; cc++) qlat[cc] = 0;
            for (size_t r = 0; r < nope; r++) {
                double qv = qn[r];
                for (size_t cc = 0; cc < kr; cc++) qlat[cc] += (double)dense_at(&kvb, h * kvh + r, cc) * qv;
            }
            size_t last = sg[s].pos + i; /* causal: positions 0..last */
            for (size_t ps = 0; ps <= last; ps++) {
                const float *cs = cache + ps * row;
                double dl = 0, dp = 0;
                for (size_t cc = 0; cc < kr; cc++) dl += qlat[cc] * (double)cs[cc];
                for (size_t r = 0; r < rope; r++) dp += (double)qpe[r] * (double)cs[kr + r];
                p[ps] = (dl + dp) * scale;
            }
            softmax_d(p, last + 1);
            for (size_t cc = 0; cc < kr; cc++) ctx[cc] = 0;
            for (size_t ps = 0; ps <= last; ps++) {
                const float *cs = cache + ps * row;
                for (size_t cc = 0; cc < kr; cc++) ctx[cc] += p[ps] * (double)cs[cc];
            }
            for (size_t cc = 0; cc < kr; cc++) ctxf[cc] = (float)ctx[cc];
            float *oh = o + (t * H + h) * vd;
            for (size_t m = 0; m < vd; m++) {
                float val = dense_row_dot(k, &kvb, h * kvh + nope + m, ctxf);
                if (c->mla_use_output_gate) val = (float)((double)val * sigmoid_d(gate[(t * H + h) * vd + m]));
                oh[m] = val;
            }
        }
    }
    if (trunk_matmul(tp, k, &w->o, o, R, out, err)) goto out;
    rc = 0;
out:
    sc->used = mark;
    return rc;
}
