/* activations.c - RMSNorm, L2 norm, SiTU-GLU, sigmoid, softmax (see activations.h). */
#include "common/activations.h"
#include <math.h>

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

void situ_glu(float *out, const float *g, const float *u, size_t n, double beta, double lbeta) {
    /* element by element: the threads change no bit; ~35 ns an element (libm tanh, exp), so a
     * decode step's shared MLP (6144) and dense MLP (33792) are worth splitting */
#pragma omp parallel for schedule(static) if (n >= SITU_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        double gv = g[i], uv = u[i];
        out[i] = (float)(beta * tanh(gv / beta) * sigmoid_d(gv) * (lbeta * tanh(uv / lbeta)));
    }
}

void softmax_d(double *x, size_t n) {
    double m = -INFINITY;
    for (size_t i = 0; i < n; i++) if (x[i] > m) m = x[i];
    double s = 0;
    for (size_t i = 0; i < n; i++) { x[i] = exp(x[i] - m); s += x[i]; }
    for (size_t i = 0; i < n; i++) x[i] /= s;
}
