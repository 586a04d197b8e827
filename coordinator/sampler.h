/* sampler.h - choosing the next token from one row of logits: greedy, or seeded sampling with
 * temperature, top-k, top-p and min-p (docs/CHAT.md has the same text with examples).
 *
 * Contract
 * - sampler_pick is a pure function of (the bits of the n logits, the config, the RNG state). It
 *   uses no libm transcendental, no threads and no global state, and the build compiles with
 *   -ffp-contract=off, so a seed gives the same ids on any IEEE-754 machine, thread count, worker
 *   count and memory budget (the engine's logits are already bit-identical across those).
 * - Greedy (temperature == 0, the default): arg-max with the lowest id on ties, exactly
 *   argmax_logits (generate.h); top_k / top_p / min_p are ignored and the RNG is not touched.
 * - Sampling (temperature > 0). All arithmetic in IEEE-754 double; x_i = (double)logits[i].
 *   0. Any non-finite logit: fail (K3_EFAIL, naming the first one's id), the RNG is not advanced.
 *   1. Order the candidates 0..n-1 by x descending, ties by lower id first (a total order).
 *   2. top-k (k > 0): keep the first min(k, n) candidates; k == 0 keeps all.
 *   3. Weights w_i = sampler_exp((x_i - x_0) / T) for the kept candidates (x_0 = the largest, so
 *      w_0 = 1 and every w_i is in [0, 1]); Z = w_0 + w_1 + ... summed left to right in the order
 *      of step 1.
 *   4. top-p (p < 1): keep the shortest prefix 0..m-1 whose running sum (left to right) is >= p * Z;
 *      all of them if rounding never gets there. p == 1 keeps all.
 *   5. min-p (q > 0): keep the candidates with w_i >= q, i.e. prob_i >= q * prob_max (a prefix;
 *      the first always stays). q == 0 keeps all.
 *   6. Draw: Z' = sum of the kept w_i left to right; u = k3_rng_uniform() (exactly one draw per
 *      sampled token, even when one candidate is left); r = u * Z'; the pick is the first kept
 *      candidate whose running sum is > r (the last kept one if rounding leaves none).
 *   Candidates whose weight is exactly 0 (far below the top) can never be picked and are dropped
 *   before sorting; this changes nothing in the result.
 * - sampler_exp(x): exp for x <= 0 from +, -, *, / and ldexp only: k = floor(x / ln2 + 0.5),
 *   r = (x - k*LN2_HI) - k*LN2_LO (fdlibm's split of ln 2), exp(r) by the degree-13 Taylor
 *   polynomial in Horner form, times 2^k; x < -708 gives 0. Relative error below 1e-15.
 * - RNG (k3_rng): xoshiro256** (Blackman & Vigna, 2018) whose four state words are the first four
 *   outputs of SplitMix64 started at the seed; k3_rng_uniform = (next >> 11) * 2^-53, in [0, 1).
 * - Adjustments (the OpenAI request fields logit_bias, presence_penalty, frequency_penalty and
 *   vLLM's repetition_penalty; the command line's --logit-bias, --presence-penalty, ...): before
 *   step 0 (and before the greedy arg-max) the row is replaced by
 *     adj_i = (float)((R_i((double)logits[i] + bias_i) - c_i * frequency) - (c_i > 0 ? presence : 0))
 *   where bias_i is the configured bias of id i (0 if none), c_i the number of times id i was
 *   emitted since sampler_init / sampler_reset (every id sampler_pick returned and every id given
 *   to sampler_observe: the server's forced tool-call ids), and R_i(v) = v / r when v > 0, v * r
 *   otherwise, with r = repetition_penalty, for an id in the prompt (sampler_observe_prompt) or
 *   with c_i > 0; R_i(v) = v for the others and when r is 0 (off, the default). Without
 *   adjustments nothing changes (no copy, no counts). The counts are kept sparse (lists of the
 *   ids seen); the pick reads adj only, so the contract above holds for adj bit for bit.
 * - sampler_reset re-seeds the RNG and clears the counts (a fresh conversation repeats its first
 *   reply).
 * - Settings are checked by sampler_init: temperature finite in [0, 100], top_k >= 0, top_p in
 *   (0, 1], min_p in [0, 1], presence / frequency penalty in [-2, 2], repetition penalty 0 (off)
 *   or in (0, 10], at most K3_MAX_LOGIT_BIAS biases, each on a distinct id >= 0 with a value in
 *   [-100, 100] (an id past the row's n is refused by sampler_reserve / sampler_pick); anything
 *   else is refused with a message naming the setting.
 * - Errors (common/error.h): sampler_pick returns the id, or -1 with err filled (K3_EFAIL for a
 *   non-finite logit, K3_ENOMEM, K3_EINPUT for n == 0); the others 0 or -1. err may be NULL. */
#ifndef K3_SAMPLER_H
#define K3_SAMPLER_H

#include "common/error.h"
#include <stddef.h>
#include <stdint.h>


#define K3_MAX_LOGIT_BIAS 1024

typedef struct {
    int32_t id;
    double value; /* [-100, 100], added to the logit */
} sampler_bias;

typedef struct {
    double temperature; /* 0 = greedy (default) */
    double top_p;       /* (0, 1]; 1 = off (default) */
    double min_p;       /* [0, 1]; 0 = off (default) */
    int top_k;          /* >= 0; 0 = off (default) */
    uint64_t seed;      /* default 0 */
    double presence_penalty, frequency_penalty; /* [-2, 2]; 0 = off (default) */
    double repetition_penalty;                  /* 0 = off (default), else (0, 10]; 1 changes nothing */
    size_t n_bias;                              /* 0 = none (default) */
    sampler_bias bias[K3_MAX_LOGIT_BIAS];
} sampler_config;

typedef struct {
    uint64_t s[4];
} k3_rng;

/* One candidate after filtering: its logit (as double), weight w (unnormalised; w / wsum is its
 * probability) and id. */
typedef struct {
    double x, w;
    int32_t id;
} sampler_cand;

typedef struct {
    sampler_config cfg;
    k3_rng rng;
    /* scratch, readable after sampler_filter / sampler_pick: the kept candidates in the order of
     * step 1 (cand[0 .. n_kept)) and the sum of their weights */
    sampler_cand *cand;
    size_t cap, n_kept;
    double wsum;
    /* internal scratch of the sort */
    sampler_cand *tmp;
    uint64_t *key, *key2;
    /* the adjustments' row and counts (sampler_reserve; only with adjustments): adj[0 .. n_adj),
     * count[id] for every id, seen[0 .. n_seen) the ids with a count > 0 */
    float *adj;
    uint32_t *count;
    int32_t *seen;
    size_t n_adj, n_seen;
    /* the prompt's distinct ids (repetition_penalty only): in_prompt[id], pseen[0 .. n_pseen) */
    uint8_t *in_prompt;
    int32_t *pseen;
    size_t n_pseen;
} sampler;

/* Defaults: greedy, top_k 0, top_p 1, min_p 0, seed 0. */
void sampler_config_default(sampler_config *c);
/* Checks the settings (message into err, -1 if refused). */
int sampler_config_check(const sampler_config *c, k3_error *err);
/* Sets one setting from command-line text: name is "temperature", "top-k", "top-p", "min-p",
 * "seed", "presence-penalty", "frequency-penalty", "repetition-penalty" (1 = off) or "logit-bias"
 * (ID=BIAS[,ID=BIAS...], added to the biases before) (a leading "--" is accepted). Strict: the
 * whole value must parse and be in range. 0, or -1 with a message naming the flag. */
int sampler_parse_flag(sampler_config *c, const char *name, const char *value, k3_error *err);
/* One line describing the settings ("greedy" or "temperature 0.7, top-k 40, ..., seed 1"). */
void sampler_describe(const sampler_config *c, char *buf, size_t len);

int sampler_init(sampler *s, const sampler_config *c, k3_error *err);
void sampler_free(sampler *s);
void sampler_reset(sampler *s);
int sampler_is_greedy(const sampler *s);

int32_t sampler_pick(sampler *s, const float *logits, size_t n, k3_error *err);

/* Whether the settings adjust the row (a bias, a non-zero presence / frequency penalty, a
 * repetition penalty other than 0 / 1). */
int sampler_adjusts(const sampler_config *c);
/* Room for rows of n logits (the vocabulary): with adjustments, the row copy and the counts,
 * allocated once here rather than in the first pick; an id of a bias >= n is refused naming it.
 * 0, or -1 (K3_EINPUT, K3_ENOMEM). Without adjustments nothing. */
int sampler_reserve(sampler *s, size_t n, k3_error *err);
/* Counts id as emitted (an id not picked by this sampler, e.g. a forced one). Ids outside the
 * reserved row are ignored (and the pick refuses such a row anyway). */
void sampler_observe(sampler *s, int32_t id);
/* Forgets the counts and the prompt marks (a new reply in the same conversation; the RNG goes on). */
void sampler_clear_counts(sampler *s);
/* Marks the prompt's ids for repetition_penalty (nothing without one; after sampler_reserve). */
void sampler_observe_prompt(sampler *s, const int32_t *ids, size_t n);

/* Steps 0-5 only (no draw, the RNG untouched): fills s->cand / s->n_kept / s->wsum.
 * Greedy: the arg-max alone with weight 1. 0 or -1 (as sampler_pick). */
int sampler_filter(sampler *s, const float *logits, size_t n, k3_error *err);

/* The exact exp and RNG above (exposed for tests and tools). */
double sampler_exp(double x);
void k3_rng_seed(k3_rng *r, uint64_t seed);
uint64_t k3_rng_next(k3_rng *r);
double k3_rng_uniform(k3_rng *r);

#endif
