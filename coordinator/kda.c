/* kda.c - Kimi Delta Attention over a chunk of tokens (K3-MODEL.md 4.2).
 *
 * Order per token and head: short conv + SiLU on q,k,v; q = L2norm(q)*D^-0.5,
 * k = L2norm(k); beta = sigmoid(b); alpha = exp(g) with the per-HEAD A_log;
 * S = diag(alpha) S; u = v - S^T k; S += k (beta u)^T; o = S^T q (updated S);
 * o = RMSNorm(o, o_norm) * sigmoid(gate)  (norm first, then gate); out = Wo o. */
#include "common/activations.h"
#include "coordinator/layers.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Causal depthwise conv of width K, then SiLU, over T tokens; hist holds the
 * previous K-1 inputs ([K-1][P], oldest first) and is advanced past the chunk. */
static int conv_silu(float *io, float *hist, const float *w, size_t T, size_t P, size_t K, k3_error *err) {
    size_t H1 = K - 1;
    float *ext = malloc((H1 + T) * P * sizeof *ext);
    if (!ext) return k3_fail(err, "out of memory in KDA conv");
    memcpy(ext, hist, H1 * P * sizeof *ext);
    memcpy(ext + H1 * P, io, T * P * sizeof *ext);
    for (size_t t = 0; t < T; t++)
        for (size_t c = 0; c < P; c++) {
            double s = 0;
            for (size_t i = 0; i < K; i++) s += (double)w[c * K + i] * (double)ext[(t + i) * P + c];
            io[t * P + c] = (float)(s * sigmoid_d(s));
        }
    memcpy(hist, ext + T * P, H1 * P * sizeof *ext);
    free(ext);
    return 0;
}

/* One head, one token: the delta-rule update and read. S is [D][D] (row = key dim). */
static void kda_head_step(float *S, const float *q, const float *kv, const float *v, const double *alpha, double beta,
                          size_t D, float *o, double *acc) {
    for (size_t m = 0; m < D; m++) acc[m] = 0;
    for (size_t j = 0; j < D; j++) { /* decay, and S^T k on the decayed state */
        float *row = S + j * D;
        double a = alpha[j], kj = kv[j];
        for (size_t m = 0; m < D; m++) {
            row[m] = (float)((double)row[m] * a);
            acc[m] += (double)row[m] * kj;
        }
    }
    for (size_t m = 0; m < D; m++) acc[m] = beta * ((double)v[m] - acc[m]); /* beta * u */
    double *oacc = acc + D;
    for (size_t m = 0; m < D; m++) oacc[m] = 0;
    for (size_t j = 0; j < D; j++) { /* delta write, then read the UPDATED state */
        float *row = S + j * D;
        double kj = kv[j], qj = q[j];
        for (size_t m = 0; m < D; m++) {
            row[m] = (float)((double)row[m] + kj * acc[m]);
            oacc[m] += (double)row[m] * qj;
        }
    }
    for (size_t m = 0; m < D; m++) o[m] = (float)oacc[m];
}

int kda_forward(trunk *tr, const kernels *k, const k3_config *c, const kda_weights *w, kda_state *st, const float *x, size_t T,
                float *out, k3_error *err) {
    size_t H = (size_t)c->kda_num_heads, D = (size_t)c->kda_head_dim, P = H * D, K = (size_t)c->short_conv_kernel_size;
    float *q = malloc(T * P * sizeof *q), *kk = malloc(T * P * sizeof *kk), *v = malloc(T * P * sizeof *v);
    float *fa = malloc(T * D * sizeof *fa), *z = malloc(T * P * sizeof *z), *b = malloc(T * H * sizeof *b);
    float *gate = malloc(T * P * sizeof *gate), *o = malloc(T * P * sizeof *o);
    int rc = -1;
    if (!q || !kk || !v || !fa || !z || !b || !gate || !o) { k3_fail(err, "out of memory in KDA"); goto out; }
    if (trunk_matmul(tr, k, &w->q, x, T, q, err)) goto out;
    if (trunk_matmul(tr, k, &w->k, x, T, kk, err)) goto out;
    if (trunk_matmul(tr, k, &w->v, x, T, v, err)) goto out;
    if (trunk_matmul(tr, k, &w->f_a, x, T, fa, err)) goto out;
    if (trunk_matmul(tr, k, &w->f_b, fa, T, z, err)) goto out;
    if (trunk_matmul(tr, k, &w->b, x, T, b, err)) goto out;
    if (trunk_matmul(tr, k, &w->g, x, T, gate, err)) goto out;
    size_t hist = (K - 1) * P;
    if (conv_silu(q, st->conv, w->conv_q, T, P, K, err) || conv_silu(kk, st->conv + hist, w->conv_k, T, P, K, err) ||
        conv_silu(v, st->conv + 2 * hist, w->conv_v, T, P, K, err))
        goto out;
    int failed = 0;
#pragma omp parallel for schedule(static)
    for (size_t h = 0; h < H; h++) {
        double *alpha = malloc(3 * D * sizeof *alpha);
        if (!alpha) { failed = 1; continue; }
        double *acc = alpha + D;
        double decay_rate = exp((double)w->a_log[h]); /* A_log is per HEAD */
        for (size_t t = 0; t < T; t++) {
            float *qh = q + t * P + h * D, *kh = kk + t * P + h * D, *oh = o + t * P + h * D;
            l2norm_scaled(qh, D, 1.0 / sqrt((double)D));
            l2norm_scaled(kh, D, 1.0);
            double beta = sigmoid_d(b[t * H + h]);
            for (size_t j = 0; j < D; j++) {
                double zz = (double)z[t * P + h * D + j] + (double)w->dt_bias[h * D + j];
                double g = c->has_gate_lower_bound ? c->gate_lower_bound * sigmoid_d(decay_rate * zz)
                                                   : -decay_rate * (zz > 20 ? zz : log1p(exp(zz)));
                alpha[j] = exp(g);
            }
            kda_head_step(st->S + h * D * D, qh, kh, v + t * P + h * D, alpha, beta, D, oh, acc);
            rmsnorm(oh, oh, w->o_norm, D, c->rms_norm_eps);
            for (size_t j = 0; j < D; j++) oh[j] = (float)((double)oh[j] * sigmoid_d(gate[t * P + h * D + j]));
        }
        free(alpha);
    }
    if (failed) { k3_fail(err, "out of memory in KDA heads"); goto out; }
    if (trunk_matmul(tr, k, &w->o, o, T, out, err)) goto out;
    rc = 0;
out:
    free(q); free(kk); free(v); free(fa); free(z); free(b); free(gate); free(o);
    return rc;
}
