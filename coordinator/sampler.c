/* sampler.c - greedy and seeded sampling of the next token (contract and algorithm: sampler.h). */
#include "coordinator/sampler.h"
#include "coordinator/generate.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The draw must not depend on excess precision (x87) anywhere. */
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "sampler.c needs FLT_EVAL_METHOD == 0 (IEEE double arithmetic without excess precision)"
#endif

/* ---- RNG: SplitMix64 seeding xoshiro256** ---- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void k3_rng_seed(k3_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

uint64_t k3_rng_next(k3_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double k3_rng_uniform(k3_rng *r) { return (double)(k3_rng_next(r) >> 11) * 0x1.0p-53; }

/* ---- exp from basic operations only ---- */

double sampler_exp(double x) {
    static const double LN2_HI = 0x1.62e42fee00000p-1;  /* 6.93147180369123816490e-01, 21 low zero bits */
    static const double LN2_LO = 0x1.a39ef35793c76p-33; /* 1.90821492927058770002e-10 */
    static const double INV_LN2 = 0x1.71547652b82fep+0;
    /* 1/n! for n = 13 .. 0, correctly rounded */
    static const double C[14] = {0x1.6124613a86d09p-33, 0x1.1eed8eff8d898p-29, 0x1.ae64567f544e4p-26,
                                 0x1.27e4fb7789f5cp-22, 0x1.71de3a556c734p-19, 0x1.a01a01a01a01ap-16,
                                 0x1.a01a01a01a01ap-13, 0x1.6c16c16c16c17p-10, 0x1.1111111111111p-7,
                                 0x1.5555555555555p-5,  0x1.5555555555555p-3,  0x1.0p-1,
                                 0x1.0p+0,              0x1.0p+0};
    if (!(x >= -708.0)) return 0.0; /* also -inf and NaN */
    if (x > 709.0) return HUGE_VAL;
    double kd = floor(x * INV_LN2 + 0.5);
    double r = (x - kd * LN2_HI) - kd * LN2_LO;
    double p = C[0];
    for (int i = 1; i < 14; i++) p = p * r + C[i];
    return ldexp(p, (int)kd);
}

/* ---- settings ---- */

void sampler_config_default(sampler_config *c) {
    memset(c, 0, sizeof *c);
    c->temperature = 0.0;
    c->top_p = 1.0;
    c->min_p = 0.0;
    c->top_k = 0;
    c->seed = 0;
}

int sampler_config_check(const sampler_config *c, k3_error *err) {
    if (!(isfinite(c->temperature) && c->temperature >= 0.0 && c->temperature <= 100.0)) {
        k3_refuse(err, "temperature must be a number in [0, 100] (0 = greedy), got %g", c->temperature);
        return -1;
    }
    if (c->top_k < 0) {
        k3_refuse(err, "top-k must be >= 0 (0 = off), got %d", c->top_k);
        return -1;
    }
    if (!(c->top_p > 0.0 && c->top_p <= 1.0)) {
        k3_refuse(err, "top-p must be in (0, 1] (1 = off), got %g", c->top_p);
        return -1;
    }
    if (!(c->min_p >= 0.0 && c->min_p <= 1.0)) {
        k3_refuse(err, "min-p must be in [0, 1] (0 = off), got %g", c->min_p);
        return -1;
    }
    if (!(c->presence_penalty >= -2.0 && c->presence_penalty <= 2.0)) {
        k3_refuse(err, "presence_penalty must be in [-2, 2] (0 = off), got %g", c->presence_penalty);
        return -1;
    }
    if (!(c->frequency_penalty >= -2.0 && c->frequency_penalty <= 2.0)) {
        k3_refuse(err, "frequency_penalty must be in [-2, 2] (0 = off), got %g", c->frequency_penalty);
        return -1;
    }
    if (!(c->repetition_penalty == 0.0 || (c->repetition_penalty > 0.0 && c->repetition_penalty <= 10.0))) {
        k3_refuse(err, "repetition_penalty must be in (0, 10] (1 = no change), got %g", c->repetition_penalty);
        return -1;
    }
    if (c->n_bias > K3_MAX_LOGIT_BIAS) {
        k3_refuse(err, "logit_bias: %zu entries, at most %d", c->n_bias, K3_MAX_LOGIT_BIAS);
        return -1;
    }
    for (size_t i = 0; i < c->n_bias; i++) {
        if (c->bias[i].id < 0) {
            k3_refuse(err, "logit_bias: token id %d is negative", c->bias[i].id);
            return -1;
        }
        if (!(c->bias[i].value >= -100.0 && c->bias[i].value <= 100.0)) {
            k3_refuse(err, "logit_bias: the bias of token %d must be in [-100, 100], got %g", c->bias[i].id,
                      c->bias[i].value);
            return -1;
        }
        for (size_t j = 0; j < i; j++)
            if (c->bias[j].id == c->bias[i].id) {
                k3_refuse(err, "logit_bias: token id %d is given twice", c->bias[i].id);
                return -1;
            }
    }
    return 0;
}

static int parse_double(const char *s, double *out) {
    char *end;
    errno = 0;
    if (!s || !*s) return -1;
    double v = strtod(s, &end);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

int sampler_parse_flag(sampler_config *c, const char *name, const char *value, k3_error *err) {
    if (!strncmp(name, "--", 2)) name += 2;
    sampler_config t = *c;
    if (!strcmp(name, "temperature")) {
        if (parse_double(value, &t.temperature)) goto bad_number;
    } else if (!strcmp(name, "top-p")) {
        if (parse_double(value, &t.top_p)) goto bad_number;
    } else if (!strcmp(name, "min-p")) {
        if (parse_double(value, &t.min_p)) goto bad_number;
    } else if (!strcmp(name, "top-k")) {
        char *end;
        errno = 0;
        long v = value && *value ? strtol(value, &end, 10) : 0;
        if (!value || !*value || errno || *end || v < 0 || v > 2147483647L) {
            k3_refuse(err, "--top-k wants an integer >= 0 (0 = off), got '%s'", value ? value : "");
            return -1;
        }
        t.top_k = (int)v;
    } else if (!strcmp(name, "presence-penalty")) {
        if (parse_double(value, &t.presence_penalty)) goto bad_number;
    } else if (!strcmp(name, "frequency-penalty")) {
        if (parse_double(value, &t.frequency_penalty)) goto bad_number;
    } else if (!strcmp(name, "repetition-penalty")) {
        if (parse_double(value, &t.repetition_penalty)) goto bad_number;
        if (t.repetition_penalty <= 0.0) {
            k3_refuse(err, "--repetition-penalty wants a number in (0, 10] (1 = off), got '%s'", value);
            return -1;
        }
        if (t.repetition_penalty == 1.0) t.repetition_penalty = 0.0; /* no change: off */
    } else if (!strcmp(name, "logit-bias")) { /* ID=B[,ID=B...], added to the ones before */
        const char *p = value ? value : "";
        do {
            char *end;
            errno = 0;
            long id = strtol(p, &end, 10);
            if (end == p || *end != '=' || errno || id < 0 || id > INT32_MAX) goto bad_bias;
            p = end + 1;
            double b = strtod(p, &end);
            if (end == p || (*end && *end != ',') || t.n_bias == K3_MAX_LOGIT_BIAS) goto bad_bias;
            t.bias[t.n_bias++] = (sampler_bias){(int32_t)id, b};
            p = *end ? end + 1 : end;
        } while (*p);
    } else if (!strcmp(name, "seed")) {
        char *end;
        errno = 0;
        if (!value || *value < '0' || *value > '9') goto bad_seed;
        unsigned long long v = strtoull(value, &end, 10);
        if (errno || *end) goto bad_seed;
        t.seed = (uint64_t)v;
    } else {
        k3_refuse(err, "unknown sampling setting '%s'", name);
        return -1;
    }
    if (sampler_config_check(&t, err)) return -1;
    *c = t;
    return 0;
bad_number:
    k3_refuse(err, "--%s wants a number, got '%s'", name, value ? value : "");
    return -1;
bad_seed:
    k3_refuse(err, "--seed wants an integer in [0, 18446744073709551615], got '%s'", value ? value : "");
    return -1;
bad_bias:
    k3_refuse(err, "--logit-bias wants ID=BIAS[,ID=BIAS...] (token ids, biases in [-100, 100], at most %d), got '%s'",
              K3_MAX_LOGIT_BIAS, value ? value : "");
    return -1;
}

void sampler_describe(const sampler_config *c, char *buf, size_t len) {
    int w;
    if (c->temperature == 0.0) w = snprintf(buf, len, "greedy (arg-max)");
    else {
        char k[32];
        if (c->top_k > 0) snprintf(k, sizeof k, "%d", c->top_k);
        else snprintf(k, sizeof k, "off");
        w = snprintf(buf, len, "temperature %g, top-k %s, top-p %g, min-p %g, seed %llu", c->temperature, k, c->top_p,
                     c->min_p, (unsigned long long)c->seed);
    }
    if (sampler_adjusts(c) && w >= 0 && (size_t)w < len)
        snprintf(buf + w, len - (size_t)w, ", presence %g, frequency %g, repetition %g, %zu logit biases",
                 c->presence_penalty, c->frequency_penalty, c->repetition_penalty, c->n_bias);
}

/* ---- the sampler ---- */

static int bias_cmp(const void *a, const void *b) {
    const int32_t x = ((const sampler_bias *)a)->id, y = ((const sampler_bias *)b)->id;
    return (x > y) - (x < y);
}

int sampler_init(sampler *s, const sampler_config *c, k3_error *err) {
    memset(s, 0, sizeof *s);
    if (sampler_config_check(c, err)) return -1;
    s->cfg = *c;
    qsort(s->cfg.bias, s->cfg.n_bias, sizeof s->cfg.bias[0], bias_cmp); /* by id, for the lookup */
    k3_rng_seed(&s->rng, c->seed);
    return 0;
}

void sampler_free(sampler *s) {
    free(s->cand);
    free(s->tmp);
    free(s->key);
    free(s->key2);
    free(s->adj);
    free(s->count);
    free(s->seen);
    free(s->in_prompt);
    free(s->pseen);
    s->cand = s->tmp = NULL;
    s->key = s->key2 = NULL;
    s->adj = NULL;
    s->count = NULL;
    s->seen = s->pseen = NULL;
    s->in_prompt = NULL;
    s->cap = s->n_kept = s->n_adj = s->n_seen = s->n_pseen = 0;
}

static void clear_counts(sampler *s) {
    for (size_t i = 0; i < s->n_seen; i++) s->count[s->seen[i]] = 0;
    s->n_seen = 0;
    for (size_t i = 0; i < s->n_pseen; i++) s->in_prompt[s->pseen[i]] = 0;
    s->n_pseen = 0;
}

static int repeats(const sampler_config *c) { return c->repetition_penalty != 0.0 && c->repetition_penalty != 1.0; }

void sampler_reset(sampler *s) {
    k3_rng_seed(&s->rng, s->cfg.seed);
    clear_counts(s);
}

void sampler_clear_counts(sampler *s) { clear_counts(s); }

int sampler_adjusts(const sampler_config *c) {
    return c->n_bias > 0 || c->presence_penalty != 0.0 || c->frequency_penalty != 0.0 || repeats(c);
}

int sampler_reserve(sampler *s, size_t n, k3_error *err) {
    if (!sampler_adjusts(&s->cfg)) return 0;
    for (size_t i = 0; i < s->cfg.n_bias; i++)
        if ((size_t)s->cfg.bias[i].id >= n)
            return k3_refuse(err, "logit_bias: token id %d is outside the vocabulary [0, %zu)", s->cfg.bias[i].id, n);
    if (s->n_adj >= n) return 0;
    float *a = malloc(n * sizeof *a);
    uint32_t *c = calloc(n, sizeof *c);
    int32_t *sn = malloc(n * sizeof *sn), *ps = repeats(&s->cfg) ? malloc(n * sizeof *ps) : NULL;
    uint8_t *ip = repeats(&s->cfg) ? calloc(n, 1) : NULL;
    if (!a || !c || !sn || (repeats(&s->cfg) && (!ps || !ip))) {
        free(a);
        free(c);
        free(sn);
        free(ps);
        free(ip);
        return k3_nomem(err, "out of memory in the sampler for the adjustments of %zu logits", n);
    }
    for (size_t i = 0; i < s->n_seen; i++) c[s->seen[i]] = s->count[s->seen[i]], sn[i] = s->seen[i];
    for (size_t i = 0; i < s->n_pseen; i++) ip[s->pseen[i]] = 1, ps[i] = s->pseen[i];
    free(s->adj);
    free(s->count);
    free(s->seen);
    free(s->in_prompt);
    free(s->pseen);
    s->adj = a;
    s->count = c;
    s->seen = sn;
    s->in_prompt = ip;
    s->pseen = ps;
    s->n_adj = n;
    return 0;
}

void sampler_observe_prompt(sampler *s, const int32_t *ids, size_t n) {
    if (!s->in_prompt) return;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && (size_t)ids[i] < s->n_adj && !s->in_prompt[ids[i]]) {
            s->in_prompt[ids[i]] = 1;
            s->pseen[s->n_pseen++] = ids[i];
        }
}

void sampler_observe(sampler *s, int32_t id) {
    if (!s->count || id < 0 || (size_t)id >= s->n_adj) return;
    if (s->count[id]++ == 0) s->seen[s->n_seen++] = id;
}

/* adj of one id (the contract's formula) */
static float adjusted_one(const sampler *s, const float *logits, int32_t id) {
    double x = (double)logits[id];
    const sampler_bias key = {id, 0.0}, *b = bsearch(&key, s->cfg.bias, s->cfg.n_bias, sizeof key, bias_cmp);
    if (b) x += b->value;
    const uint32_t c = s->count[id];
    if (repeats(&s->cfg) && (c > 0 || s->in_prompt[id]))
        x = x > 0 ? x / s->cfg.repetition_penalty : x * s->cfg.repetition_penalty;
    return (float)((x - (double)c * s->cfg.frequency_penalty) - (c > 0 ? s->cfg.presence_penalty : 0.0));
}

/* The adjusted row (the contract's adj) in s->adj, from logits[0 .. n) (sampler_reserve(n) made):
 * the row, then every id with a bias, a count or a prompt mark recomputed (an id in two of those
 * lists gets the same value twice) */
static const float *adjusted(sampler *s, const float *logits, size_t n) {
    float *a = s->adj;
    memcpy(a, logits, n * sizeof *a);
    for (size_t i = 0; i < s->cfg.n_bias; i++) a[s->cfg.bias[i].id] = adjusted_one(s, logits, s->cfg.bias[i].id);
    for (size_t j = 0; j < s->n_seen; j++) a[s->seen[j]] = adjusted_one(s, logits, s->seen[j]);
    for (size_t j = 0; j < s->n_pseen; j++) a[s->pseen[j]] = adjusted_one(s, logits, s->pseen[j]);
    return a;
}

int sampler_is_greedy(const sampler *s) { return s->cfg.temperature == 0.0; }

static int reserve(sampler *s, size_t n) {
    if (s->cap >= n) return 0;
    sampler_cand *c = malloc(n * sizeof *c), *c2 = malloc(n * sizeof *c2);
    uint64_t *k = malloc(n * sizeof *k), *k2 = malloc(n * sizeof *k2);
    if (!c || !c2 || !k || !k2) {
        free(c);
        free(c2);
        free(k);
        free(k2);
        return -1;
    }
    free(s->cand);
    free(s->tmp);
    free(s->key);
    free(s->key2);
    s->cand = c;
    s->tmp = c2;
    s->key = k;
    s->key2 = k2;
    s->cap = n;
    return 0;
}

/* An unsigned key that orders floats by DEcreasing value (-0 and +0 equal). */
static uint32_t desc_key(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if (u == 0x80000000u) u = 0;
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* increasing with the value */
    return ~u;
}

/* Sorts tmp[0..m) (in increasing id order) into cand[0..m) by (logit descending, id ascending):
 * a stable LSD radix sort on the 32-bit key of the float logit, so equal logits keep their id
 * order. A total order, so this is the same array any correct sort would give. */
static void sort_candidates(sampler *s, size_t m) {
    uint64_t *a = s->key, *b = s->key2;
    for (size_t i = 0; i < m; i++) a[i] = (uint64_t)desc_key((float)s->tmp[i].x) << 32 | (uint64_t)i;
    for (int pass = 0; pass < 4; pass++) {
        int shift = 32 + 8 * pass;
        size_t count[256] = {0};
        for (size_t i = 0; i < m; i++) count[(a[i] >> shift) & 255]++;
        int skip = 0;
        for (int d = 0; d < 256; d++) skip |= count[d] == m;
        if (skip) continue; /* every key has the same digit here */
        size_t pos = 0;
        for (int d = 0; d < 256; d++) {
            size_t c = count[d];
            count[d] = pos;
            pos += c;
        }
        for (size_t i = 0; i < m; i++) b[count[(a[i] >> shift) & 255]++] = a[i];
        uint64_t *t = a;
        a = b;
        b = t;
    }
    for (size_t i = 0; i < m; i++) s->cand[i] = s->tmp[a[i] & 0xFFFFFFFFu];
}

/* The failure of step 0, naming the first non-finite logit. */
static int non_finite(const float *logits, size_t n, k3_error *err) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(logits[i])) return k3_fail(err, "non-finite logit %g at id %zu", (double)logits[i], i);
    return k3_fail(err, "non-finite logits");
}

int sampler_filter(sampler *s, const float *logits, size_t n, k3_error *err) {
    s->n_kept = 0;
    s->wsum = 0.0;
    if (n == 0 || n > (size_t)INT32_MAX) return k3_refuse(err, "sampler: %zu logits (want 1 .. 2^31-1)", n);
    if (sampler_is_greedy(s)) {
        int32_t id = argmax_logits(logits, n);
        if (id < 0) return non_finite(logits, n, err);
        if (reserve(s, 1)) return k3_nomem(err, "out of memory in the sampler");
        s->cand[0] = (sampler_cand){(double)logits[id], 1.0, id};
        s->n_kept = 1;
        s->wsum = 1.0;
        return 0;
    }
    /* step 0 and the largest logit */
    double x0 = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(logits[i])) return non_finite(logits, n, err);
        if ((double)logits[i] > x0) x0 = (double)logits[i];
    }
    if (reserve(s, n)) return k3_nomem(err, "out of memory in the sampler for %zu candidates", n);
    const double T = s->cfg.temperature;
    /* weights (step 3's formula; a candidate's weight does not depend on the order); zero weights
     * are dropped: they sort after every positive one and can never be drawn */
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        double x = (double)logits[i];
        double w = sampler_exp((x - x0) / T);
        if (w > 0.0) s->tmp[m++] = (sampler_cand){x, w, (int32_t)i};
    }
    /* step 1 */
    sort_candidates(s, m);
    /* step 2: top-k */
    size_t k = m;
    if (s->cfg.top_k > 0 && (size_t)s->cfg.top_k < k) k = (size_t)s->cfg.top_k;
    /* step 3: Z */
    double Z = 0.0;
    for (size_t j = 0; j < k; j++) Z += s->cand[j].w;
    /* step 4: top-p */
    if (s->cfg.top_p < 1.0) {
        double target = s->cfg.top_p * Z, run = 0.0;
        for (size_t j = 0; j < k; j++) {
            run += s->cand[j].w;
            if (run >= target) {
                k = j + 1;
                break;
            }
        }
    }
    /* step 5: min-p (weights are non-increasing along the order, so this is a prefix) */
    if (s->cfg.min_p > 0.0) {
        size_t j = 1;
        while (j < k && s->cand[j].w >= s->cfg.min_p) j++;
        k = j;
    }
    /* the kept mass for step 6 */
    double Zk = 0.0;
    for (size_t j = 0; j < k; j++) Zk += s->cand[j].w;
    s->n_kept = k;
    s->wsum = Zk;
    return 0;
}

static int32_t pick_from(sampler *s, const float *logits, size_t n, k3_error *err) {
    if (sampler_filter(s, logits, n, err)) return -1;
    if (sampler_is_greedy(s)) return s->cand[0].id;
    double r = k3_rng_uniform(&s->rng) * s->wsum, run = 0.0;
    for (size_t j = 0; j < s->n_kept; j++) {
        run += s->cand[j].w;
        if (run > r) return s->cand[j].id;
    }
    return s->cand[s->n_kept - 1].id;
}

int32_t sampler_pick(sampler *s, const float *logits, size_t n, k3_error *err) {
    if (!sampler_adjusts(&s->cfg)) return pick_from(s, logits, n, err);
    if (n == 0 || n > (size_t)INT32_MAX) return k3_refuse(err, "sampler: %zu logits (want 1 .. 2^31-1)", n);
    if (n != s->n_adj && sampler_reserve(s, n, err)) return -1; /* once (gen_seq_init / the scheduler did it) */
    if (n != s->n_adj) /* counts are per id of one vocabulary */
        return k3_refuse(err, "sampler: a row of %zu logits after rows of %zu (the adjustments count ids)", n, s->n_adj);
    const int32_t id = pick_from(s, adjusted(s, logits, n), n, err);
    if (id >= 0) sampler_observe(s, id);
    return id;
}
