/* expert_compute.h - one routed expert on a batch of tokens, straight from MXFP4.
 *
 *   y_t = w2 . SiTU-GLU(w1 . z_t, w3 . z_t)      for t < ntok
 * z is [ntok][L], y is [ntok][L]; scratch holds 2*ntok*I floats. The result of
 * each token is bit-identical whatever ntok, thread count, SIMD level or
 * process computes it (kernels.h). Pure function: no state. */
#ifndef K3_EXPERT_COMPUTE_H
#define K3_EXPERT_COMPUTE_H

#include "common/kernels.h"
#include "workers/expert_store.h"

void expert_compute(const kernels *k, const expert_weights *w, double situ_beta, double situ_linear_beta,
                    const float *z, size_t ntok, float *y, float *scratch);

#endif
