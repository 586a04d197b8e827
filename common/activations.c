/* activations.c - RMSNorm, L2 norm, SiTU-GLU, sigmoid, softmax (see activations.h). */
#include "common/activations.h"
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

void rmsnorm(float *y, const float *x, const float *w, size_t n, double eps) {
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    double inv = 1.0 / sqrt(ss / (double)n + eps);
    for (size_t i = 0; i < n; i++) y[i] = (float)((double)x[i] * inv * (w ? (double)w[i] : 1.0));
}

void l2norm_scaled(float *x, size_t n, double scale) {
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    double inv = 1.0 / sqrt(ss + 1e-6);
    for (size_t i = 0; i < n; i++) x[i] = (float)((double)x[i] * inv * scale);
}

double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }

/* ---- SiTU-GLU: exp and tanh of its own, the same IEEE operations in every lane ----
 * Written so that one source gives the scalar code and the SIMD clones (target_clones, omp
 * simd): no libm call, no branch (both sides computed, then selected), explicit fma() where
 * a fused operation is meant (-ffp-contract=off adds none). Every element is computed by the
 * same sequence of correctly rounded operations whatever the vector width, so every clone
 * and thread split gives the same bits. Accuracy: a few ulp of double, far below the float
 * the result is rounded to. */

static inline __attribute__((always_inline)) double bits_to_d(uint64_t b) { double d; memcpy(&d, &b, sizeof d); return d; }
static inline __attribute__((always_inline)) uint64_t d_to_bits(double d) { uint64_t b; memcpy(&b, &d, sizeof b); return b; }

/* e^x for x clamped to [-700, 709] (below: ~1e-304, what SiTU's sums cannot see; above: the
 * largest finite powers): x = n ln2 + r, |r| <= ln2/2, e^r by its Taylor series to r^13
 * (truncation < 1e-17), times 2^n built in the exponent bits (n in [-1010, 1023]: normal). */
static inline __attribute__((always_inline)) double situ_exp(double x) {
    const double shift = 0x1.8p52; /* adding it rounds to an integer held in the low mantissa bits */
    x = x < -700.0 ? -700.0 : x;
    x = x > 709.0 ? 709.0 : x;
    double t = fma(x, 0x1.71547652b82fep0, shift); /* x / ln2 + shift */
    double n = t - shift;
    double r = fma(-n, 0x1.62e42fefa3800p-1, x);   /* ln2, high part (exact products with n) */
    r = fma(-n, 0x1.ef35793c76730p-45, r);          /* ln2, low part */
    double p = 1.0 / 6227020800.0;                  /* 1/13! */
    p = fma(p, r, 1.0 / 479001600.0);
    p = fma(p, r, 1.0 / 39916800.0);
    p = fma(p, r, 1.0 / 3628800.0);
    p = fma(p, r, 1.0 / 362880.0);
    p = fma(p, r, 1.0 / 40320.0);
    p = fma(p, r, 1.0 / 5040.0);
    p = fma(p, r, 1.0 / 720.0);
    p = fma(p, r, 1.0 / 120.0);
    p = fma(p, r, 1.0 / 24.0);
    p = fma(p, r, 1.0 / 6.0);
    p = fma(p, r, 0.5);
    p = fma(p, r, 1.0);
    p = fma(p, r, 1.0);
    uint64_t ni = d_to_bits(t) - d_to_bits(shift); /* n as a two's complement integer */
    return p * bits_to_d((ni + 1023u) << 52);
}

/* tanh(y): below |y| = 1/8 its odd Taylor series to y^13 (next term < 1e-17 relative), else
 * sign(y) (1 - e) / (1 + e) with e = e^(-2|y|) (cancellation at most ~4 ulp there). */
static inline __attribute__((always_inline)) double situ_tanh(double y) {
    double a = fabs(y), y2 = y * y;
    double s = 21844.0 / 6081075.0;
    s = fma(s, y2, -1382.0 / 155925.0);
    s = fma(s, y2, 62.0 / 2835.0);
    s = fma(s, y2, -17.0 / 315.0);
    s = fma(s, y2, 2.0 / 15.0);
    s = fma(s, y2, -1.0 / 3.0);
    double small = copysign(fma(s * y2, y, y), y); /* y = -0: the fma alone gives +0 */
    double e = situ_exp(-2.0 * a);
    double big = copysign((1.0 - e) / (1.0 + e), y);
    /* both computed, then selected by a mask: a plain ?: lets the compiler move the division
     * into a branch, which AVX2 cannot vectorize (it may trap) */
    uint64_t m = (uint64_t)0 - (uint64_t)(a < 0.125);
    return bits_to_d((d_to_bits(small) & m) | (d_to_bits(big) & ~m));
}

/* out[i], i in [0, n): one thread's share */
__attribute__((target_clones("avx512f", "arch=haswell", "default"))) /* haswell: AVX2 with FMA */
static void situ_glu_span(float *out, const float *g, const float *u, size_t n, double beta, double lbeta) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        double gv = g[i], uv = u[i];
        double sig = 1.0 / (1.0 + situ_exp(-gv));
        out[i] = (float)(beta * situ_tanh(gv / beta) * sig * (lbeta * situ_tanh(uv / lbeta)));
    }
}

__attribute__((optimize("no-tree-vectorize")))
void situ_glu_scalar(float *out, const float *g, const float *u, size_t n, double beta, double lbeta) {
    for (size_t i = 0; i < n; i++) {
        double gv = g[i], uv = u[i];
        double sig = 1.0 / (1.0 + situ_exp(-gv));
        out[i] = (float)(beta * situ_tanh(gv / beta) * sig * (lbeta * situ_tanh(uv / lbeta)));
    }
}

void situ_glu(float *out, const float *g, const float *u, size_t n, double beta, double lbeta) {
    /* element by element: the threads and the vector width change no bit; a decode step's
     * shared MLP (6144) and dense MLP (33792) are worth splitting */
    if (n < SITU_PAR_MIN) { situ_glu_span(out, g, u, n, beta, lbeta); return; }
#pragma omp parallel
    {
        size_t nt = (size_t)omp_get_num_threads(), th = (size_t)omp_get_thread_num();
        size_t per = (n + nt - 1) / nt, i0 = th * per < n ? th * per : n, i1 = i0 + per < n ? i0 + per : n;
        situ_glu_span(out + i0, g + i0, u + i0, i1 - i0, beta, lbeta);
    }
}

void softmax_d(double *x, size_t n) {
    double m = -INFINITY;
    for (size_t i = 0; i < n; i++) if (x[i] > m) m = x[i];
    double s = 0;
    for (size_t i = 0; i < n; i++) { x[i] = exp(x[i] - m); s += x[i]; }
    for (size_t i = 0; i < n; i++) x[i] /= s;
}
