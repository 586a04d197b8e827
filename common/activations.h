/* activations.h - the small exact pieces of the model math (docs/MODEL.md 4.1).
 * Scalar code shared by every path, so every path computes the same bits.
 * Sums run in double, sequentially in index order. */
#ifndef K3_ACTIVATIONS_H
#define K3_ACTIVATIONS_H

#include <stddef.h>

/* y_i = w_i * x_i / sqrt(mean(x^2) + eps); y may alias x. w may be NULL (= 1). */
void rmsnorm(float *y, const float *x, const float *w, size_t n, double eps);
/* x / sqrt(sum(x^2) + 1e-6) * scale, in place. */
void l2norm_scaled(float *x, size_t n, double scale);
/* SiTU-GLU: beta*tanh(g/beta) * sigmoid(g) * lbeta*tanh(u/lbeta); sigmoid on the UNCAPPED g.
 * exp and tanh of its own (activations.c), vectorized with the same operations in every
 * lane (target_clones: AVX-512, AVX2, baseline): the bits do not depend on the CPU's vector
 * width. Split over the OpenMP threads from SITU_PAR_MIN elements on (element-wise: the
 * same bits). */
#define SITU_PAR_MIN 4096
void situ_glu(float *out, const float *g, const float *u, size_t n, double beta, double lbeta);
/* The same operations one element at a time, never vectorized, one thread (tests compare). */
void situ_glu_scalar(float *out, const float *g, const float *u, size_t n, double beta, double lbeta);
double sigmoid_d(double x);
/* In-place softmax over n doubles (max-subtracted, double sum). */
void softmax_d(double *x, size_t n);

#endif
