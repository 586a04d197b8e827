/* expert_compute.c - w2 . SiTU-GLU(w1 z, w3 z) from packed MXFP4 (see expert_compute.h). */
#include "workers/expert_compute.h"
#include "common/activations.h"

void expert_compute(const kernels *k, const expert_weights *w, double situ_beta, double situ_linear_beta,
                    const float *z, size_t ntok, float *y, float *scratch) {
    size_t I = w->w1.rows;
    float *g = scratch, *u = scratch + ntok * I;
    matmul_mxfp4(k, &w->w1, z, ntok, g);
    matmul_mxfp4(k, &w->w3, z, ntok, u);
    situ_glu(g, g, u, ntok * I, situ_beta, situ_linear_beta);
    matmul_mxfp4(k, &w->w2, g, ntok, y);
}
