/* kda.c - Kimi Delta Attention over a chunk of tokens (docs/MODEL.md 4.2).
 *
 * Order per token and head: short conv + SiLU on q,k,v; q = L2norm(q)*D^-0.5,
 * k = L2norm(k); beta = sigmoid(b); alpha = exp(g) with the per-HEAD A_log;
 * S = diag(alpha) S; u = v - S^T k; S += k (beta u)^T; o = S^T q (updated S);
 * o = RMSNorm(o, o_norm) * sigmoid(gate)  (norm first, then gate); out = Wo o. */
#include "common/activations.h"
#include "coordinator/layers.h"
#include <math.h>
#include <omp.h>
#include <string.h>

/* Causal depthwise conv of width K, then SiLU, over T tokens, for channels [c0, c0 + nc) of
 * P: hist holds the previous K-1 inputs ([K-1][P], oldest first) and is advanced past the
 * chunk. ext: the caller's room for (K-1+T)*nc floats. With keep_n > 0, the history after
 * token i (i < keep_n) is also written to keep + i * keep_stride floats. Channels are
 * independent (each its own sum and SiLU), so the head jobs of kda_forward each convolve
 * their own head's channels: the bits of one convolution over all channels. */
static void conv_silu(float *io, float *hist, const float *w, size_t T, size_t P, size_t K, size_t c0, size_t nc,
                      float *ext, float *keep, size_t keep_stride, size_t keep_n) {
    size_t H1 = K - 1, cb = nc * sizeof *ext;
    for (size_t r = 0; r < H1; r++) memcpy(ext + r * nc, hist + r * P + c0, cb);
    for (size_t t = 0; t < T; t++) memcpy(ext + (H1 + t) * nc, io + t * P + c0, cb);
    for (size_t i = 0; i < keep_n && i < T; i++)
        for (size_t r = 0; r < H1; r++) memcpy(keep + i * keep_stride + r * P + c0, ext + (i + 1 + r) * nc, cb);
    for (size_t t = 0; t < T; t++)
        for (size_t c = 0; c < nc; c++) {
            double s = 0;
            for (size_t i = 0; i < K; i++) s += (double)w[(c0 + c) * K + i] * (double)ext[(t + i) * nc + c];
            io[t * P + c0 + c] = (float)(s * sigmoid_d(s));
        }
    for (size_t r = 0; r < H1; r++) memcpy(hist + r * P + c0, ext + (T + r) * nc, cb);
}

/* One head, one token: the delta-rule update and read. S is [D][D] (row = key dim).
 * The inner loops run across the value dim m: every element is its own chain (the
 * sums run over j), so their vectorization changes no bit; compiled for the widest
 * vectors the CPU has (target_clones, resolved at load; -ffp-contract=off keeps
 * multiply and add apart in every clone). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void kda_head_step(float *S, const float *q, const float *kv, const float *v, const double *alpha, double beta,
                          size_t D, float *o, double *acc) {
    for (size_t m = 0; m < D; m++) acc[m] = 0;
    for (size_t j = 0; j < D; j++) { /* decay, and S^T k on the decayed state */
        float *row = S + j * D;
        double a = alpha[j], kj = kv[j];
#pragma omp simd
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
#pragma omp simd
        for (size_t m = 0; m < D; m++) {
            row[m] = (float)((double)row[m] + kj * acc[m]);
            oacc[m] += (double)row[m] * qj;
        }
    }
    for (size_t m = 0; m < D; m++) o[m] = (float)oacc[m];
}

typedef struct {
    float *q, *kk, *v, *fa, *z, *b, *gate, *o, *ext; /* ext: [nthreads][(K-1+R) D] */
    double *head; /* [nthreads][3D] */
} kda_bufs;

static int kda_layout(scratch *sc, const k3_config *c, size_t R, int nthreads, kda_bufs *B) {
    size_t H = (size_t)c->kda_num_heads, D = (size_t)c->kda_head_dim, P = H * D, K = (size_t)c->short_conv_kernel_size;
    size_t f = sizeof(float);
    B->q = scratch_take(sc, R * P * f);
    B->kk = scratch_take(sc, R * P * f);
    B->v = scratch_take(sc, R * P * f);
    B->fa = scratch_take(sc, R * D * f);
    B->z = scratch_take(sc, R * P * f);
    B->b = scratch_take(sc, R * H * f);
    B->gate = scratch_take(sc, R * P * f);
    B->o = scratch_take(sc, R * P * f);
    B->ext = scratch_take(sc, (size_t)nthreads * (K - 1 + R) * D * f); /* per thread: one head's channels */
    B->head = scratch_take(sc, (size_t)nthreads * 3 * D * sizeof(double));
    return B->q && B->kk && B->v && B->fa && B->z && B->b && B->gate && B->o && B->ext && B->head ? 0 : -1;
}

size_t kda_scratch_bytes(const k3_config *c, size_t R, int nthreads) {
    scratch s = {0};
    kda_bufs B;
    kda_layout(&s, c, R, nthreads, &B);
    return s.used;
}

int kda_forward(trunk_pass *tp, const kernels *k, const k3_config *c, const kda_weights *w, int l, const fwd_segment *sg,
                size_t nseg, const float *x, size_t R, float *out, scratch *sc, int nthreads, fwd_phases *pf, k3_error *err) {
    size_t H = (size_t)c->kda_num_heads, D = (size_t)c->kda_head_dim, P = H * D, K = (size_t)c->short_conv_kernel_size;
    size_t mark = sc->used;
    kda_bufs B;
    int rc = -1;
    if (kda_layout(sc, c, R, nthreads, &B)) { k3_fail(err, "KDA scratch exceeds the engine's arena (%zu rows)", R); goto out; }
    float *q = B.q, *kk = B.kk, *v = B.v, *z = B.z, *b = B.b, *gate = B.gate, *o = B.o;
    { /* in walk order, a parallel region per run of one unit: q k v f_a, then f_b (of f_a) b g */
        const dense_weight *w4[4] = {&w->q, &w->k, &w->v, &w->f_a}, *w3[3] = {&w->f_b, &w->b, &w->g};
        const float *x4[4] = {x, x, x, x}, *x3[3] = {B.fa, x, x};
        float *y4[4] = {q, kk, v, B.fa}, *y3[3] = {z, b, gate};
        if (trunk_matmul_many(tp, k, w4, x4, R, y4, 4, err) || trunk_matmul_many(tp, k, w3, x3, R, y3, 3, err)) goto out;
        double fl = 0;
        for (int i = 0; i < 4; i++) fl += dense_flop(w4[i], R);
        for (int i = 0; i < 3; i++) fl += dense_flop(w3[i], R);
        fph_lap(pf, FP_KDA_MATMUL, fl);
    }
    size_t hist = (K - 1) * P;
    /* per-position states (state.h keep): S after token i at keep_S(s, i), its conv history after it */
    size_t kstride = seq_state_recurrent_bytes(c) / sizeof(float), koff = seq_state_recurrent_offset(c, l) / sizeof(float);
    size_t jobs = nseg * H;
    /* one region: a job is one head of one segment, its channels' short convolutions (q, k, v)
     * and then its delta-rule steps (a decode step had four regions, three of them for the
     * convolutions) */
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (size_t job = 0; job < jobs; job++) {
        size_t s = job / H, h = job % H;
        double *alpha = B.head + (size_t)omp_get_thread_num() * 3 * D;
        double *acc = alpha + D;
        float *ext = B.ext + (size_t)omp_get_thread_num() * (K - 1 + R) * D;
        float *S = sg[s].st->kda[l].S + h * D * D;
        size_t kn = sg[s].st->keep ? sg[s].st->keep_n : 0;
        float *kS = kn ? (float *)sg[s].st->keep + koff + h * D * D : NULL;
        {
            kda_state *st = &sg[s].st->kda[l];
            size_t r0 = sg[s].row0, n = sg[s].n;
            float *kc = kn ? (float *)sg[s].st->keep + koff + H * D * D : NULL;
            conv_silu(q + r0 * P, st->conv, w->conv_q, n, P, K, h * D, D, ext, kc, kstride, kn);
            conv_silu(kk + r0 * P, st->conv + hist, w->conv_k, n, P, K, h * D, D, ext, kc ? kc + hist : NULL, kstride, kn);
            conv_silu(v + r0 * P, st->conv + 2 * hist, w->conv_v, n, P, K, h * D, D, ext, kc ? kc + 2 * hist : NULL, kstride,
                      kn);
        }
        double decay_rate = exp((double)w->a_log[h]); /* A_log is per HEAD */
        for (size_t t = sg[s].row0; t < sg[s].row0 + sg[s].n; t++) {
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
            kda_head_step(S, qh, kh, v + t * P + h * D, alpha, beta, D, oh, acc);
            if (t - sg[s].row0 < kn) memcpy(kS + (t - sg[s].row0) * kstride, S, D * D * sizeof *S);
            rmsnorm(oh, oh, w->o_norm, D, c->rms_norm_eps);
            for (size_t j = 0; j < D; j++) oh[j] = (float)((double)oh[j] * sigmoid_d(gate[t * P + h * D + j]));
        }
    }
    fph_lap(pf, FP_KDA_CORE, 16.0 * (double)H * (double)D * (double)D * (double)R);
    if (trunk_matmul(tp, k, &w->o, o, R, out, err)) goto out;
    fph_lap(pf, FP_KDA_MATMUL, dense_flop(&w->o, R));
    rc = 0;
out:
    sc->used = mark;
    return rc;
}
