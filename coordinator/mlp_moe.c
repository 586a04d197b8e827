/* mlp_moe.c - dense SiTU MLP and the Stable LatentMoE layer (docs/MODEL.md 4.1, 4.4). */
#include "common/activations.h"
#include "coordinator/layers.h"
#include "coordinator/expert_predict.h"
#include <math.h>
#include <string.h>

float dense_at(const dense_weight *W, size_t r, size_t c) {
    size_t i = r * W->cols + c;
    if (W->dtype == DTYPE_F32) return ((const float *)W->data)[i];
    return bf16_to_f32(((const uint16_t *)W->data)[i]);
}

float dense_row_dot(const kernels *k, const dense_weight *W, size_t r, const float *x) {
    if (W->dtype == DTYPE_F32) return k->dot_f32((const float *)W->data + r * W->cols, x, W->cols);
    return k->dot_bf16((const uint16_t *)W->data + r * W->cols, x, W->cols);
}

static int mlp_layout(scratch *sc, const k3_config *c, size_t R, float **g, float **u) {
    size_t Ish = (size_t)c->moe_intermediate_size * (size_t)c->num_shared_experts;
    size_t I = (size_t)c->intermediate_size > Ish ? (size_t)c->intermediate_size : Ish;
    *g = scratch_take(sc, R * I * sizeof(float));
    *u = scratch_take(sc, R * I * sizeof(float));
    return *g && *u ? 0 : -1;
}

size_t mlp_scratch_bytes(const k3_config *c, size_t R) {
    scratch s = {0};
    float *g, *u;
    mlp_layout(&s, c, R, &g, &u);
    return s.used;
}

int mlp_forward(trunk_pass *tp, const kernels *k, const k3_config *c, const mlp_weights *w, const float *x, size_t R,
                float *out, scratch *sc, k3_error *err) {
    size_t I = w->gate.rows, mark = sc->used;
    int rc = -1;
    float *g, *u;
    if (mlp_layout(sc, c, R, &g, &u)) { k3_fail(err, "MLP scratch exceeds the engine's arena"); goto out; }
    const dense_weight *w2[2] = {&w->gate, &w->up}; /* one parallel region when in one unit */
    const float *xs[2] = {x, x};
    float *ys[2] = {g, u};
    if (trunk_matmul_many(tp, k, w2, xs, R, ys, 2, err)) goto out;
    situ_glu(g, g, u, R * I, c->situ_beta, c->situ_linear_beta);
    if (trunk_matmul(tp, k, &w->down, g, R, out, err)) goto out;
    rc = 0;
out:
    sc->used = mark;
    return rc;
}

double mlp_flop(const mlp_weights *w, size_t R) { return dense_flop(&w->gate, R) + dense_flop(&w->up, R) + dense_flop(&w->down, R); }

/* a ranks before b: higher key, or equal key and lower id. */
static int ranks_before(double ka, int a, double kb, int b) { return ka > kb || (ka == kb && a < b); }

int moe_route(const k3_config *c, const float *logits, const float *bias, int32_t *ids, double *weights) {
    int K = c->num_experts_per_token, n = 0;
    double *kk = weights; /* reuse weights[] as the key list while selecting */
    for (int e = 0; e < c->num_experts; e++) {
        double key = sigmoid_d(logits[e]) + (double)bias[e];
        if (!isfinite(logits[e]) || !isfinite(key)) return -1 - e; /* never rank a NaN or an Inf */
        if (n == K && !ranks_before(key, e, kk[K - 1], ids[K - 1])) continue;
        int pos = n < K ? n++ : K - 1;
        while (pos > 0 && ranks_before(key, e, kk[pos - 1], ids[pos - 1])) {
            kk[pos] = kk[pos - 1];
            ids[pos] = ids[pos - 1];
            pos--;
        }
        kk[pos] = key;
        ids[pos] = e;
    }
    double sum = 0;
    for (int j = 0; j < K; j++) {
        weights[j] = sigmoid_d(logits[ids[j]]); /* UNBIASED score */
        sum += weights[j];
    }
    for (int j = 0; j < K; j++) {
        if (c->moe_renormalize && K > 1) weights[j] /= (sum + 1e-20);
        weights[j] *= c->routed_scaling_factor;
    }
    return 0;
}

void moe_combine(const double *weights, const float *y, size_t K, size_t L, float *acc) {
    for (size_t i = 0; i < L; i++) {
        double s = 0;
        for (size_t j = 0; j < K; j++) s += weights[j] * (double)y[j * L + i]; /* top-k order: part of the contract */
        acc[i] = (float)s;
    }
}

typedef struct {
    float *logits, *z, *y, *acc, *shared, *plogits;
    int32_t *ptok, *pexp, *pids;
    double *wts, *pwts;
} moe_bufs;

static int moe_layout(scratch *sc, const k3_config *c, size_t R, moe_bufs *B) {
    size_t N = (size_t)c->num_experts, K = (size_t)c->num_experts_per_token, L = (size_t)c->routed_expert_hidden_size,
           E = (size_t)c->hidden_size, f = sizeof(float);
    B->logits = scratch_take(sc, R * N * f);
    B->z = scratch_take(sc, R * L * f);
    B->y = scratch_take(sc, R * K * L * f);
    B->acc = scratch_take(sc, R * L * f);
    B->shared = scratch_take(sc, R * E * f);
    B->ptok = scratch_take(sc, R * K * sizeof(int32_t));
    B->pexp = scratch_take(sc, R * K * sizeof(int32_t));
    B->wts = scratch_take(sc, R * K * sizeof(double));
    /* the next layer's prediction (expert_predict.h) */
    B->plogits = scratch_take(sc, R * N * f);
    B->pids = scratch_take(sc, R * K * sizeof(int32_t));
    B->pwts = scratch_take(sc, R * K * sizeof(double));
    return B->logits && B->z && B->y && B->acc && B->shared && B->ptok && B->pexp && B->wts && B->plogits && B->pids && B->pwts
               ? 0 : -1;
}

size_t moe_scratch_bytes(const k3_config *c, size_t R) {
    scratch s = {0};
    moe_bufs B;
    moe_layout(&s, c, R, &B);
    return s.used + mlp_scratch_bytes(c, R); /* the shared experts run inside */
}

int moe_forward(trunk_pass *tp, const kernels *k, const k3_config *c, const moe_weights *w, int layer,
                expert_backend *eb, const float *x, size_t R, float *out, int32_t *trace, scratch *sc, fwd_phases *pf,
                k3_error *err) {
    size_t N = (size_t)c->num_experts, K = (size_t)c->num_experts_per_token, L = (size_t)c->routed_expert_hidden_size,
           E = (size_t)c->hidden_size;
    size_t mark = sc->used;
    moe_bufs B;
    int rc = -1;
    if (moe_layout(sc, c, R, &B)) { k3_fail(err, "MoE scratch exceeds the engine's arena (%zu rows)", R); goto out; }
    /* 1-3: router on the FULL-width input; the latent down-projection (step 4) of the same
     * input in the same parallel region */
    {
        const dense_weight *w2[2] = {&w->router, &w->lat_down};
        const float *xs[2] = {x, x};
        float *ys[2] = {B.logits, B.z};
        if (trunk_matmul_many(tp, k, w2, xs, R, ys, 2, err)) goto out;
        fph_lap(pf, FP_MOE_IN, dense_flop(w2[0], R) + dense_flop(w2[1], R));
    }
    for (size_t t = 0; t < R; t++) {
        int bad = moe_route(c, B.logits + t * N, w->router_bias, B.pexp + t * K, B.wts + t * K);
        if (bad) {
            k3_fail(err, "layer %d: non-finite router score for expert %d (token %zu of the batch): refusing to route", layer, -1 - bad, t);
            goto out;
        }
        for (size_t j = 0; j < K; j++) B.ptok[t * K + j] = (int32_t)t;
        if (trace) memcpy(trace + t * K, B.pexp + t * K, K * sizeof *trace);
    }
    if (eb->predict) {
        /* score the prediction made for this layer; predict the next MoE layer from this input
         * and hand it to the backend, which starts its reads once this layer's experts are
         * computed (a hint: the next layer routes from its own input as always) */
        expert_predict_score(eb->predict, layer, B.pexp, R * K);
        const int32_t *list;
        size_t n;
        int nl = expert_predict_next(eb->predict, k, layer, x, R, B.plogits, B.pids, B.pwts, &list, &n);
        if (nl >= 0 && n && eb->hint && expert_predict_mode(eb->predict) == EP_HINT)
            expert_predict_add_hinted(eb->predict, eb->hint(eb, nl, list, n));
    }
    /* 4-5: (latent down-projection above), experts, combine in top-k order */
    fph_lap(pf, FP_ROUTE, 0);
    if (eb->run(eb, layer, B.z, R, B.ptok, B.pexp, R * K, B.y, err)) goto out;
    fph_lap(pf, FP_EXPERTS, 6.0 * (double)c->moe_intermediate_size * (double)L * (double)(R * K));
    for (size_t t = 0; t < R; t++) moe_combine(B.wts + t * K, B.y + t * K * L, K, L, B.acc + t * L);
    /* 6: latent norm on the AGGREGATE, then up-projection */
    if (c->latent_moe_use_norm)
        for (size_t t = 0; t < R; t++) rmsnorm(B.acc + t * L, B.acc + t * L, w->lat_norm, L, c->rms_norm_eps);
    if (trunk_matmul(tp, k, &w->lat_up, B.acc, R, out, err)) goto out;
    fph_lap(pf, FP_MOE_OUT, dense_flop(&w->lat_up, R));
    /* 7: shared experts on the ORIGINAL input, unweighted */
    if (c->num_shared_experts > 0) {
        if (mlp_forward(tp, k, c, &w->shared, x, R, B.shared, sc, err)) goto out;
        for (size_t i = 0; i < R * E; i++) out[i] += B.shared[i];
        fph_lap(pf, FP_SHARED, mlp_flop(&w->shared, R));
    }
    rc = 0;
out:
    sc->used = mark;
    return rc;
}
