/* mlp_moe.c - dense SiTU MLP and the Stable LatentMoE layer (K3-MODEL.md 4.1, 4.4). */
#include "common/activations.h"
#include "coordinator/layers.h"
#include <math.h>
#include <stdlib.h>
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

int mlp_forward(trunk *tr, const kernels *k, const k3_config *c, const mlp_weights *w, const float *x, size_t T,
                float *out, k3_error *err) {
    size_t I = w->gate.rows;
    int rc = -1;
    float *g = malloc(T * I * sizeof *g), *u = malloc(T * I * sizeof *u);
    if (!g || !u) { k3_fail(err, "out of memory in MLP"); goto out; }
    if (trunk_matmul(tr, k, &w->gate, x, T, g, err)) goto out;
    if (trunk_matmul(tr, k, &w->up, x, T, u, err)) goto out;
    situ_glu(g, g, u, T * I, c->situ_beta, c->situ_linear_beta);
    if (trunk_matmul(tr, k, &w->down, g, T, out, err)) goto out;
    rc = 0;
out:
    free(g);
    free(u);
    return rc;
}

/* a ranks before b: higher key, or equal key and lower id. */
static int ranks_before(double ka, int a, double kb, int b) { return ka > kb || (ka == kb && a < b); }

void moe_route(const k3_config *c, const float *logits, const float *bias, int32_t *ids, double *weights) {
    int K = c->num_experts_per_token, n = 0;
    double *kk = weights; /* reuse weights[] as the key list while selecting */
    for (int e = 0; e < c->num_experts; e++) {
        double key = sigmoid_d(logits[e]) + (double)bias[e];
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
}

void moe_combine(const double *weights, const float *y, size_t K, size_t L, float *acc) {
    for (size_t i = 0; i < L; i++) {
        double s = 0;
        for (size_t j = 0; j < K; j++) s += weights[j] * (double)y[j * L + i]; /* top-k order: part of the contract */
        acc[i] = (float)s;
    }
}

int moe_forward(trunk *tr, const kernels *k, const k3_config *c, const moe_weights *w, int layer, expert_backend *eb,
                const float *x, size_t T, float *out, int32_t *trace, k3_error *err) {
    size_t N = (size_t)c->num_experts, K = (size_t)c->num_experts_per_token, L = (size_t)c->routed_expert_hidden_size,
           E = (size_t)c->hidden_size;
    float *logits = malloc(T * N * sizeof *logits), *z = malloc(T * L * sizeof *z);
    float *y = malloc(T * K * L * sizeof *y), *acc = malloc(T * L * sizeof *acc);
    float *shared = malloc(T * E * sizeof *shared);
    int32_t *ptok = malloc(T * K * sizeof *ptok), *pexp = malloc(T * K * sizeof *pexp);
    double *wts = malloc(T * K * sizeof *wts);
    int rc = -1;
    if (!logits || !z || !y || !acc || !shared || !ptok || !pexp || !wts) { k3_fail(err, "out of memory in MoE layer %d", layer); goto out; }
    /* 1-3: router on the FULL-width input */
    if (trunk_matmul(tr, k, &w->router, x, T, logits, err)) goto out;
    for (size_t t = 0; t < T; t++) {
        moe_route(c, logits + t * N, w->router_bias, pexp + t * K, wts + t * K);
        for (size_t j = 0; j < K; j++) ptok[t * K + j] = (int32_t)t;
        if (trace) memcpy(trace + t * K, pexp + t * K, K * sizeof *trace);
    }
    /* 4-5: latent down-projection, experts, combine in top-k order */
    if (trunk_matmul(tr, k, &w->lat_down, x, T, z, err)) goto out;
    if (eb->run(eb, layer, z, T, ptok, pexp, T * K, y, err)) goto out;
    for (size_t t = 0; t < T; t++) moe_combine(wts + t * K, y + t * K * L, K, L, acc + t * L);
    /* 6: latent norm on the AGGREGATE, then up-projection */
    if (c->latent_moe_use_norm)
        for (size_t t = 0; t < T; t++) rmsnorm(acc + t * L, acc + t * L, w->lat_norm, L, c->rms_norm_eps);
    if (trunk_matmul(tr, k, &w->lat_up, acc, T, out, err)) goto out;
    /* 7: shared experts on the ORIGINAL input, unweighted */
    if (c->num_shared_experts > 0) {
        if (mlp_forward(tr, k, c, &w->shared, x, T, shared, err)) goto out;
        for (size_t i = 0; i < T * E; i++) out[i] += shared[i];
    }
    rc = 0;
out:
    free(logits); free(z); free(y); free(acc); free(shared); free(ptok); free(pexp); free(wts);
    return rc;
}
