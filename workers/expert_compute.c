/* expert_compute.c - w2 . SiTU-GLU(w1 z, w3 z) from packed MXFP4 (see expert_compute.h). */
#include "workers/expert_compute.h"
#include "common/activations.h"

void expert_compute(const kernels *k, const expert_weights *w, double situ_beta, double situ_linear_beta,
                    const float *z, size_t ntok, float *y, float *scratch) {
    size_t I = w->w1.rows;
    float *g = scratch, *u = scratch + ntok * I;
    const mxfp4_weight w13[2] = {w->w1, w->w3}; /* one parallel region for both */
    const float *const xs[2] = {z, z};
    float *const ys[2] = {g, u};
    matmul_mxfp4_many(k, w13, xs, ntok, ys, 2);
    situ_glu(g, g, u, ntok * I, situ_beta, situ_linear_beta);
    matmul_mxfp4(k, &w->w2, g, ntok, y);
}
