/* mla.c - gated multi-head latent attention, NoPE (docs/MODEL.md 4.3).
 *
 * The cache holds per position [RMSNorm(c_kv) | k_pe] (kv_lora + rope floats).
 * kv_b is applied on use by absorption: for head h,
 *   q_nope . (Wk_h c)  =  (Wk_h^T q_nope) . c      and    o_h = Wv_h (sum_s p_s c_s),
 * so the per-head keys and values are never expanded. The rope part of the key
 * is ONE vector shared by all heads, never rotated; the score scale is
 * (nope+rope)^-0.5. Output: o * sigmoid(Wg x) (gate only, no norm), then Wo.
 *
 * A job is MLA_HB heads of one segment: their scores run across the heads (one
 * position's cached row against MLA_HB absorbed queries, lane j = head j) and their
 * latent contexts across the latent width, so the loops vectorize; every score,
 * context and q_lat element is still its own chain of double multiply-then-add in
 * the order above (r, then cc, then rope; positions in order), so the bits are those
 * of one head at a time, at any SIMD width. A job runs its tokens MLA_TB at a time
 * through q_lat and the values, so each kv_b row (1 KiB of bf16) is read from L3 once
 * for them and then from L1; every token's chains are the same operations in the
 * same order as one token at a time. */
#include "common/activations.h"
#include "coordinator/layers.h"
#include <math.h>
#include <omp.h>
#include <string.h>

enum { MLA_HB = 8, MLA_TB = 4 }; /* heads per job; tokens per pass over a head block's kv_b rows */

typedef struct {
    float *qa, *q, *ckv, *o, *gate;
    double *head;   /* [nthreads][MLA_HB * ((MLA_TB + 2) kv_lora + rope + max_ctx)] */
    float *ctxf;    /* [nthreads][MLA_TB * MLA_HB * kv_lora] */
} mla_bufs;

/* per thread: q_lat [TB][HB][kr], its transpose [kr][HB], q_pe [rope][HB], ctx [HB][kr], p [ctx][HB] */
static size_t mla_head_doubles(size_t kr, size_t rope, size_t max_ctx) {
    return MLA_HB * ((MLA_TB + 2) * kr + rope + max_ctx);
}

/* softmax_d (activations.c) over x[0], x[stride], ..., x[(n-1)*stride]: the same operations */
static void softmax_strided(double *x, size_t n, size_t stride) {
    double m = -INFINITY;
    for (size_t i = 0; i < n; i++) if (x[i * stride] > m) m = x[i * stride];
    double s = 0;
    for (size_t i = 0; i < n; i++) { x[i * stride] = exp(x[i * stride] - m); s += x[i * stride]; }
    for (size_t i = 0; i < n; i++) x[i * stride] /= s;
}

static int mla_layout(scratch *sc, const k3_config *c, size_t R, int nthreads, size_t max_ctx, mla_bufs *B) {
    size_t H = (size_t)c->num_attention_heads, qr = (size_t)c->q_lora_rank, kr = (size_t)c->kv_lora_rank,
           rope = (size_t)c->qk_rope_head_dim, vd = (size_t)c->v_head_dim, qh = (size_t)c->qk_nope_head_dim + rope;
    size_t f = sizeof(float), nt = (size_t)nthreads;
    B->qa = scratch_take(sc, R * qr * f);
    B->q = scratch_take(sc, R * H * qh * f);
    B->ckv = scratch_take(sc, R * (kr + rope) * f);
    B->o = scratch_take(sc, R * H * vd * f);
    B->gate = c->mla_use_output_gate ? scratch_take(sc, R * H * vd * f) : NULL;
    B->head = scratch_take(sc, nt * mla_head_doubles(kr, rope, max_ctx) * sizeof(double));
    B->ctxf = scratch_take(sc, nt * MLA_TB * MLA_HB * kr * f);
    return B->qa && B->q && B->ckv && B->o && (B->gate || !c->mla_use_output_gate) && B->head && B->ctxf ? 0 : -1;
}

/* The vector loops below, compiled for the widest vectors the CPU has (resolved once at
 * load): they are element-wise (each lane its own chain), so every clone gives the same
 * bits, and -ffp-contract=off keeps multiply and add apart. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MLA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MLA_CLONES
#endif

/* ql[cc] += (double)w[cc] * qv over kr columns of a bf16 / f32 row */
MLA_CLONES static void axpy_bf16(double *ql, const uint16_t *wr, double qv, size_t kr) {
#pragma omp simd
    for (size_t cc = 0; cc < kr; cc++) ql[cc] += (double)bf16_to_f32(wr[cc]) * qv;
}
MLA_CLONES static void axpy_f32(double *ql, const float *wr, double qv, size_t kr) {
#pragma omp simd
    for (size_t cc = 0; cc < kr; cc++) ql[cc] += (double)wr[cc] * qv;
}

/* a[k][j] += q[cc][j] * c_k[cc] for cc < len, in order of cc, for the four rows c_0..c_3: four
 * independent chains per head, each q column loaded once for them */
static inline __attribute__((always_inline)) void dots4(const double *q, const float *c0, const float *c1,
                                                        const float *c2, const float *c3, size_t len,
                                                        double a[4][MLA_HB]) {
    for (size_t cc = 0; cc < len; cc++) {
        const double v0 = c0[cc], v1 = c1[cc], v2 = c2[cc], v3 = c3[cc], *qc = q + cc * MLA_HB;
#pragma omp simd
        for (size_t j = 0; j < MLA_HB; j++) {
            a[0][j] += qc[j] * v0;
            a[1][j] += qc[j] * v1;
            a[2][j] += qc[j] * v2;
            a[3][j] += qc[j] * v3;
        }
    }
}

/* p[ps][j] = (sum_cc qT[cc][j] * c_ps[cc] + sum_r qpeT[r][j] * c_ps[kr + r]) * scale, ps < n,
 * each sum in order */
MLA_CLONES static void mla_scores(const double *qT, const double *qpeT, const float *cache, size_t row, size_t kr,
                                  size_t rope, size_t n, double scale, double *p) {
    size_t ps = 0;
    /* four positions at a time: four independent chains per head, each q column loaded once
     * for them; every position's sums in the same order as one at a time */
    for (; ps + 4 <= n; ps += 4) {
        const float *c0 = cache + ps * row, *c1 = c0 + row, *c2 = c1 + row, *c3 = c2 + row;
        double l[4][MLA_HB] = {{0}}, e[4][MLA_HB] = {{0}};
        dots4(qT, c0, c1, c2, c3, kr, l);
        dots4(qpeT, c0 + kr, c1 + kr, c2 + kr, c3 + kr, rope, e);
        for (size_t k = 0; k < 4; k++)
            for (size_t j = 0; j < MLA_HB; j++) p[(ps + k) * MLA_HB + j] = (l[k][j] + e[k][j]) * scale;
    }
    for (; ps < n; ps++) {
        const float *cs = cache + ps * row;
        double dl[MLA_HB], dp[MLA_HB];
        for (size_t j = 0; j < MLA_HB; j++) dl[j] = dp[j] = 0;
        for (size_t cc = 0; cc < kr; cc++) {
            const double cv = cs[cc], *qc = qT + cc * MLA_HB;
#pragma omp simd
            for (size_t j = 0; j < MLA_HB; j++) dl[j] += qc[j] * cv;
        }
        for (size_t r = 0; r < rope; r++) {
            const double cv = cs[kr + r], *qc = qpeT + r * MLA_HB;
#pragma omp simd
            for (size_t j = 0; j < MLA_HB; j++) dp[j] += qc[j] * cv;
        }
        for (size_t j = 0; j < MLA_HB; j++) p[ps * MLA_HB + j] = (dl[j] + dp[j]) * scale;
    }
}

void mla_scores_heads(const double *qT, const double *qpeT, const float *cache, size_t row, size_t kr, size_t rope,
                      size_t n, double scale, double *p) {
    mla_scores(qT, qpeT, cache, row, kr, rope, n, scale, p);
}

/* ctx[j][cc] = sum_ps p[ps][j] * c_ps[cc], ps in order, for j < nb. 16 columns at a time for
 * all MLA_HB heads in registers (16 vectors of 8 doubles), positions inner: each element
 * the same chain (from 0, ps in order) as accumulating in memory, without the stores. */
typedef double mla_v8d __attribute__((vector_size(64)));
typedef float mla_v8f __attribute__((vector_size(32)));
MLA_CLONES static void mla_context(const double *p, const float *cache, size_t row, size_t kr, size_t n, size_t nb,
                                   double *ctx) {
    size_t c0 = 0;
    for (; c0 + 16 <= kr; c0 += 16) {
        mla_v8d a[MLA_HB][2];
#pragma GCC unroll 8
        for (size_t j = 0; j < MLA_HB; j++) a[j][0] = a[j][1] = (mla_v8d){0};
        for (size_t ps = 0; ps < n; ps++) {
            const float *cs = cache + ps * row + c0;
            const double *pp = p + ps * MLA_HB;
            mla_v8f f0, f1;
            memcpy(&f0, cs, sizeof f0);
            memcpy(&f1, cs + 8, sizeof f1);
            const mla_v8d v0 = __builtin_convertvector(f0, mla_v8d), v1 = __builtin_convertvector(f1, mla_v8d);
#pragma GCC unroll 8
            for (size_t j = 0; j < MLA_HB; j++) {
                const double pj = pp[j];
                a[j][0] += pj * v0;
                a[j][1] += pj * v1;
            }
        }
        for (size_t j = 0; j < nb; j++)
            for (size_t e = 0; e < 8; e++) { ctx[j * kr + c0 + e] = a[j][0][e]; ctx[j * kr + c0 + 8 + e] = a[j][1][e]; }
    }
    if (c0 == kr) return;
    for (size_t j = 0; j < nb; j++)
        for (size_t cc = c0; cc < kr; cc++) ctx[j * kr + cc] = 0;
    for (size_t ps = 0; ps < n; ps++) {
        const float *cs = cache + ps * row;
        for (size_t j = 0; j < nb; j++) {
            const double pj = p[ps * MLA_HB + j];
            double *cj = ctx + j * kr;
#pragma omp simd
            for (size_t cc = c0; cc < kr; cc++) cj[cc] += pj * (double)cs[cc];
        }
    }
}

void mla_context_heads(const double *p, const float *cache, size_t row, size_t kr, size_t n, size_t nb, double *ctx) {
    mla_context(p, cache, row, kr, n, nb, ctx);
}

size_t mla_scratch_bytes(const k3_config *c, size_t R, int nthreads, size_t max_ctx) {
    scratch s = {0};
    mla_bufs B;
    mla_layout(&s, c, R, nthreads, max_ctx, &B);
    return s.used;
}

int mla_forward(trunk_pass *tp, const kernels *k, const k3_config *c, const mla_weights *w, int l, const fwd_segment *sg,
                size_t nseg, const float *x, size_t R, float *out, scratch *sc, int nthreads, size_t max_ctx,
                fwd_phases *pf, k3_error *err) {
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
    fph_lap(pf, FP_MLA_MATMUL, dense_flop(&w->q_a, R));
    for (size_t t = 0; t < R; t++) rmsnorm(qa + t * qr, qa + t * qr, w->q_a_norm, qr, MLA_LATENT_NORM_EPS);
    fph_lap(pf, FP_MLA_CORE, 0);
    if (trunk_matmul(tp, k, &w->q_b, qa, R, q, err)) goto out;
    if (trunk_matmul(tp, k, &w->kv_a, x, R, ckv, err)) goto out;
    fph_lap(pf, FP_MLA_MATMUL, dense_flop(&w->q_b, R) + dense_flop(&w->kv_a, R));
    for (size_t s = 0; s < nseg; s++)
        for (size_t i = 0; i < sg[s].n; i++) {
            size_t t = sg[s].row0 + i;
            float *dst = sg[s].st->mla[l].cache + (sg[s].pos + i) * row;
            rmsnorm(dst, ckv + t * row, w->kv_a_norm, kr, MLA_LATENT_NORM_EPS);
            memcpy(dst + kr, ckv + t * row + kr, rope * sizeof *dst); /* k_pe: not normalised, not rotated */
        }
    fph_lap(pf, FP_MLA_CORE, 0);
    if (c->mla_use_output_gate && trunk_matmul(tp, k, &w->g, x, R, gate, err)) goto out;
    fph_lap(pf, FP_MLA_MATMUL, c->mla_use_output_gate ? dense_flop(&w->g, R) : 0);
    dense_weight kvb;
    if (trunk_get(tp, &w->kv_b, &kvb, err)) goto out; /* read by every head below */
    const size_t nhb = (H + MLA_HB - 1) / MLA_HB, jobs = nseg * nhb, per = mla_head_doubles(kr, rope, max_ctx);
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (size_t job = 0; job < jobs; job++) {
        const size_t s = job / nhb, h0 = (job % nhb) * MLA_HB, nb = H - h0 < MLA_HB ? H - h0 : MLA_HB;
        int me = omp_get_thread_num();
        double *qlat = B.head + (size_t)me * per, *qT = qlat + MLA_TB * MLA_HB * kr, *qpeT = qT + MLA_HB * kr;
        double *ctx = qpeT + MLA_HB * rope, *p = ctx + MLA_HB * kr;
        float *ctxf = B.ctxf + (size_t)me * MLA_TB * MLA_HB * kr;
        const float *cache = sg[s].st->mla[l].cache;
        for (size_t i0 = 0; i0 < sg[s].n; i0 += MLA_TB) {
            const size_t tb = sg[s].n - i0 < MLA_TB ? sg[s].n - i0 : MLA_TB;
            /* q_lat[u][j][c] = sum_r Wkv_b[h*kvh + r][c] * q_nope[u][r], r in order; heads past H:
             * zeros. Each kv_b row is read once for the tb tokens (it stays in L1 for them). */
            for (size_t e = 0; e < tb * MLA_HB * kr; e++) qlat[e] = 0;
            for (size_t j = 0; j < nb; j++)
                for (size_t r = 0; r < nope; r++) {
                    const size_t wrow = (h0 + j) * kvh + r;
                    for (size_t u = 0; u < tb; u++) {
                        const size_t t = sg[s].row0 + i0 + u;
                        const double qv = q[(t * H + h0 + j) * qh + r];
                        double *ql = qlat + (u * MLA_HB + j) * kr;
                        if (kvb.dtype == DTYPE_BF16) axpy_bf16(ql, (const uint16_t *)kvb.data + wrow * kvb.cols, qv, kr);
                        else axpy_f32(ql, (const float *)kvb.data + wrow * kvb.cols, qv, kr);
                    }
                }
            for (size_t u = 0; u < tb; u++) {
                const size_t i = i0 + u, t = sg[s].row0 + i;
                const double *qlu = qlat + u * MLA_HB * kr;
                for (size_t cc = 0; cc < kr; cc++)
                    for (size_t j = 0; j < MLA_HB; j++) qT[cc * MLA_HB + j] = qlu[j * kr + cc];
                for (size_t r = 0; r < rope; r++)
                    for (size_t j = 0; j < MLA_HB; j++)
                        qpeT[r * MLA_HB + j] = j < nb ? (double)q[(t * H + h0 + j) * qh + nope + r] : 0.0;
                size_t last = sg[s].pos + i; /* causal: positions 0..last */
                mla_scores(qT, qpeT, cache, row, kr, rope, last + 1, scale, p);
                for (size_t j = 0; j < nb; j++) softmax_strided(p + j, last + 1, MLA_HB);
                mla_context(p, cache, row, kr, last + 1, nb, ctx);
                for (size_t j = 0; j < nb; j++)
                    for (size_t cc = 0; cc < kr; cc++) ctxf[(u * MLA_HB + j) * kr + cc] = (float)ctx[j * kr + cc];
            }
            /* values: each kv_b row once for the tb tokens */
            for (size_t j = 0; j < nb; j++) {
                const size_t h = h0 + j;
                for (size_t m = 0; m < vd; m++)
                    for (size_t u = 0; u < tb; u++) {
                        const size_t t = sg[s].row0 + i0 + u;
                        float val = dense_row_dot(k, &kvb, h * kvh + nope + m, ctxf + (u * MLA_HB + j) * kr);
                        if (c->mla_use_output_gate) val = (float)((double)val * sigmoid_d(gate[(t * H + h) * vd + m]));
                        o[(t * H + h) * vd + m] = val;
                    }
            }
        }
    }
    { /* per head and token: q_lat (nope x kv_lora), the values (v_head_dim x kv_lora); per attended
       * position: a score over kv_lora + rope and a context over kv_lora */
        double fl = 0;
        for (size_t s = 0; s < nseg; s++)
            for (size_t i = 0; i < sg[s].n; i++)
                fl += 2.0 * (double)H * ((double)(nope + vd) * (double)kr + (double)(sg[s].pos + i + 1) * (double)(2 * kr + rope));
        fph_lap(pf, FP_MLA_CORE, fl);
    }
    if (trunk_matmul(tp, k, &w->o, o, R, out, err)) goto out;
    fph_lap(pf, FP_MLA_MATMUL, dense_flop(&w->o, R));
    rc = 0;
out:
    sc->used = mark;
    return rc;
}
