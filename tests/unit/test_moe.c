/* test_moe.c - routing and combine traps (docs/MODEL.md 4.4, section 5 items 3 and 10)
 * that a whole-model test cannot see: the bias steers selection only, weights are
 * the unbiased sigmoid scores renormalised, ties go to the lower id, and the
 * expert outputs are summed in top-k order (an id-sorted sum gives other bits). */
#include "common/activations.h"
#include "coordinator/layers.h"
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "tests/unit/check.h"


int main(void) {
    k3_config c = {0};
    c.num_experts = 6;
    c.num_experts_per_token = 3;
    c.moe_renormalize = 1;
    c.routed_scaling_factor = 2.0;
    /* expert 4 has the highest raw score but a large negative bias; expert 1 a low score and a large bias */
    const float logits[6] = {0.5f, -2.0f, 0.1f, 0.1f, 3.0f, 1.0f};
    const float bias[6] = {0.0f, 0.9f, 0.0f, 0.0f, -0.9f, 0.0f};
    int32_t ids[3];
    double w[3];
    moe_route(&c, logits, bias, ids, w);
    /* keys: e0 .622, e1 .119+.9=1.019, e2 .525, e3 .525, e4 .953-.9=.053, e5 .731 -> top3: 1, 5, 0 */
    CHECK(ids[0] == 1 && ids[1] == 5 && ids[2] == 0, "selection by biased key: got %d %d %d", ids[0], ids[1], ids[2]);
    double s1 = sigmoid_d(-2.0), s5 = sigmoid_d(1.0), s0 = sigmoid_d(0.5), sum = s1 + s5 + s0;
    CHECK(fabs(w[0] - 2.0 * s1 / sum) < 1e-15 && fabs(w[1] - 2.0 * s5 / sum) < 1e-15 && fabs(w[2] - 2.0 * s0 / sum) < 1e-15,
          "weights must be the UNBIASED scores renormalised and scaled: %g %g %g", w[0], w[1], w[2]);
    /* ties: e2 and e3 have equal keys; with top-k 4 the lower id (2) must come first */
    c.num_experts_per_token = 4;
    int32_t ids4[4];
    double w4[4];
    moe_route(&c, logits, bias, ids4, w4);
    CHECK(ids4[3] == 2, "tie between experts 2 and 3 must pick the lower id, got %d", ids4[3]);
    /* no renormalisation when disabled */
    c.num_experts_per_token = 3;
    c.moe_renormalize = 0;
    c.routed_scaling_factor = 1.0;
    moe_route(&c, logits, bias, ids, w);
    CHECK(fabs(w[0] - s1) < 1e-15, "without renormalisation the weight is the raw score");

    /* non-finite router scores are refused, never ranked (a NaN compares false both ways) */
    float nl[6], nb[6];
    memcpy(nl, logits, sizeof nl);
    memcpy(nb, bias, sizeof nb);
    CHECK(moe_route(&c, nl, nb, ids, w) == 0, "finite scores must route");
    nl[3] = NAN;
    CHECK(moe_route(&c, nl, nb, ids, w) == -1 - 3, "a NaN logit of expert 3 must be refused");
    nl[3] = INFINITY; /* sigmoid(Inf) = 1 is finite, but the logit is not */
    CHECK(moe_route(&c, nl, nb, ids, w) == -1 - 3, "an Inf logit must be refused");
    nl[3] = 0.1f;
    nb[5] = -INFINITY;
    CHECK(moe_route(&c, nl, nb, ids, w) == -1 - 5, "an Inf bias must be refused");

    /* combine order: top-k ids (9, 2, 5) with outputs 1, 2^54, -2^54 (exact floats):
     * top-k order (1 + 2^54) - 2^54 = 0 in double; id order (2^54 - 2^54) + 1 = 1. */
    const double cw[3] = {1.0, 1.0, 1.0};
    const float y[3] = {1.0f, 18014398509481984.0f, -18014398509481984.0f};
    float acc;
    moe_combine(cw, y, 3, 1, &acc);
    CHECK(acc == 0.0f, "MoE combine must sum in top-k order (got %g, an id-sorted sum gives 1)", acc);
    if (check_report("test_moe")) return 1;
    printf("test_moe: ok\n");
    return 0;
}
