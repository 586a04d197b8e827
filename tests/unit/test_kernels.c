/* test_kernels.c - unit test of the exact kernels (common/kernels.h): the scalar
 * path against an independent re-implementation of the documented partition,
 * scalar / AVX2 / AVX-512 bit-identical (dense F32, dense BF16, MXFP4, many sizes
 * and tails; row counts with full and partial 8-row blocks, so the drivers'
 * row-block kernels are checked against the single-row dots), multi-token ==
 * single-token (also prefill-sized batches through the multi-token kernels),
 * fma == multiply-then-add on the contract's exact products, 1 thread == many threads, MXFP4
 * decoding traps (nibble order, scale byte 0, negative codes, E2M1 table) and
 * mxfp4_check_scales. Exits non-zero and prints every failure. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/activations.h"
#include "common/kernels.h"
#include "common/kernels_impl.h"
#include "tests/unit/check.h"

typedef struct {
    const kernels *levels[3]; /* scalar first, then every SIMD level this CPU has */
    int nlevels;
} tstate;


/* ---- deterministic random data ---- */

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Finite floats with a wide exponent spread, so any change of summation order shows. */
static float rnd_float(uint64_t *s) {
    uint64_t r = rng_next(s);
    if ((r & 63) == 0) return (r & 64) ? -0.0f : 0.0f;
    double m = (double)((r >> 8) & 0xffffff) / 16777216.0 + 0.5;
    int e = (int)((r >> 40) % 41) - 20;
    return (float)((r & 128 ? -m : m) * ldexp(1.0, e));
}

static uint16_t rnd_bf16(uint64_t *s) {
    uint64_t r = rng_next(s);
    uint16_t exp = (uint16_t)(127 - 20 + (r >> 20) % 41); /* finite, normal */
    return (uint16_t)(((r & 1) << 15) | (exp << 7) | ((r >> 8) & 0x7f));
}

/* ---- independent reference of the documented partition ---- */

/* E2M1 from its bit fields: s | e e | m, bias 1, e == 0 subnormal (m * 0.5). */
static double e2m1_decode(unsigned code) {
    unsigned sgn = (code >> 3) & 1, e = (code >> 1) & 3, m = code & 1;
    double v = e == 0 ? 0.5 * m : ldexp(1.0 + 0.5 * m, (int)e - 1);
    return sgn ? -v : v;
}

typedef enum { REF_F32, REF_BF16, REF_MXFP4, REF_MXFP4_SWAPPED } ref_kind;

static double ref_weight(ref_kind kind, const void *w, const uint8_t *scales, size_t i) {
    switch (kind) {
    case REF_F32: return ((const float *)w)[i];
    case REF_BF16: {
        uint32_t u = (uint32_t)((const uint16_t *)w)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case REF_MXFP4:
    case REF_MXFP4_SWAPPED: {
        uint8_t byte = ((const uint8_t *)w)[i / 2];
        int low = (i % 2 == 0) == (kind == REF_MXFP4);
        unsigned code = low ? (byte & 15u) : (byte >> 4);
        return ldexp(e2m1_decode(code), (int)scales[i / 32] - 127);
    }
    }
    return 0;
}

static float ref_dot(ref_kind kind, const void *w, const uint8_t *scales, const float *x, size_t n) {
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i;
    for (i = 0; i < n; i++) lane[i % 8] += ref_weight(kind, w, scales, i) * (double)x[i];
    for (; i % 8 != 0; i++) lane[i % 8] += 0.0;
    return (float)(((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7])));
}

/* ---- helpers ---- */

static int bits_equal(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof *a) == 0; }

static size_t first_diff(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, sizeof *a)) return i;
    return n;
}

/* Runs one weight through every level with ntok = 1..5 and checks everything. */
typedef struct {
    int is_mxfp4;
    dense_weight d;
    mxfp4_weight m;
} any_weight;

static void run_matmul(const kernels *k, const any_weight *W, const float *x, size_t ntok, float *y) {
    if (W->is_mxfp4) matmul_mxfp4(k, &W->m, x, ntok, y);
    else matmul_dense(k, &W->d, x, ntok, y);
}

static void check_weight(tstate *ts, const char *what, const any_weight *W, const float *x) {
    size_t rows = W->is_mxfp4 ? W->m.rows : W->d.rows, cols = W->is_mxfp4 ? W->m.cols : W->d.cols;
    const size_t maxtok = 5;
    float *ref = malloc(maxtok * rows * sizeof *ref);
    float *base = malloc(maxtok * rows * sizeof *base);
    float *y = malloc(maxtok * rows * sizeof *y);
    float *y1 = malloc(rows * sizeof *y1);
    if (!ref || !base || !y || !y1) abort();

    ref_kind kind = W->is_mxfp4 ? REF_MXFP4 : W->d.dtype == DTYPE_F32 ? REF_F32 : REF_BF16;
    for (size_t t = 0; t < maxtok; t++)
        for (size_t r = 0; r < rows; r++) {
            const void *wr;
            const uint8_t *sr = NULL;
            if (W->is_mxfp4) {
                wr = W->m.packed + r * cols / 2;
                sr = W->m.scales + r * cols / 32;
            } else if (W->d.dtype == DTYPE_F32) wr = (const float *)W->d.data + r * cols;
            else wr = (const uint16_t *)W->d.data + r * cols;
            ref[t * rows + r] = ref_dot(kind, wr, sr, x + t * cols, cols);
        }

    /* scalar path == independent reference, every token */
    run_matmul(ts->levels[0], W, x, maxtok, base);
    size_t d = first_diff(base, ref, maxtok * rows);
    CHECK(d == maxtok * rows, "%s rows=%zu cols=%zu: scalar != reference at [%zu] (%a vs %a)", what, rows,
          cols, d, d < maxtok * rows ? base[d] : 0.0f, d < maxtok * rows ? ref[d] : 0.0f);

    for (int l = 0; l < ts->nlevels; l++) {
        const kernels *k = ts->levels[l];
        /* single-token calls, one per token */
        for (size_t t = 0; t < maxtok; t++) {
            run_matmul(k, W, x + t * cols, 1, y1);
            CHECK(bits_equal(y1, base + t * rows, rows), "%s rows=%zu cols=%zu: %s ntok=1 token %zu != scalar",
                  what, rows, cols, k->name, t);
        }
        /* batches of 1..5 tokens == the single-token bits */
        for (size_t nt = 1; nt <= maxtok; nt++) {
            run_matmul(k, W, x, nt, y);
            CHECK(bits_equal(y, base, nt * rows), "%s rows=%zu cols=%zu: %s ntok=%zu != single-token scalar",
                  what, rows, cols, k->name, nt);
        }
        /* the level's dot function directly == the driver */
        for (size_t r = 0; r < rows; r++) {
            float v;
            if (W->is_mxfp4) v = k->dot_mxfp4(W->m.packed + r * cols / 2, W->m.scales + r * cols / 32, x, cols);
            else if (W->d.dtype == DTYPE_F32) v = k->dot_f32((const float *)W->d.data + r * cols, x, cols);
            else v = k->dot_bf16((const uint16_t *)W->d.data + r * cols, x, cols);
            CHECK(memcmp(&v, base + r, sizeof v) == 0, "%s rows=%zu cols=%zu: %s dot row %zu != scalar", what,
                  rows, cols, k->name, r);
        }
    }
    free(ref);
    free(base);
    free(y);
    free(y1);
}

/* x for up to 5 tokens, deliberately misaligned by one float. */
static float *make_x(uint64_t *s, size_t cols, float **to_free) {
    float *buf = malloc((5 * cols + 1) * sizeof *buf);
    if (!buf) abort();
    for (size_t i = 0; i < 5 * cols + 1; i++) buf[i] = rnd_float(s);
    *to_free = buf;
    return buf + 1;
}

static void test_dense(tstate *ts, dense_dtype dt) {
    static const size_t extra_cols[] = {71, 96, 127, 128, 129, 255, 1000, 1023, 3072, 3584, 7168, 7175};
    /* row counts across the one-token row block (K3_ROWBLOCK, 8): none, one, one + a partial, two */
    static const size_t rows_list[] = {1, 3, 7, 13, 8, 17, 16, 24};
    uint64_t seed = dt == DTYPE_F32 ? 1 : 2;
    size_t ncols = 70 + sizeof extra_cols / sizeof extra_cols[0];
    for (size_t ci = 0; ci < ncols; ci++) {
        size_t cols = ci < 70 ? ci + 1 : extra_cols[ci - 70];
        size_t rows = rows_list[ci % 8];
        size_t esz = dt == DTYPE_F32 ? 4 : 2;
        uint8_t *wbuf = malloc(rows * cols * esz + esz);
        if (!wbuf) abort();
        void *w = wbuf + esz; /* misaligned by one element */
        for (size_t i = 0; i < rows * cols; i++) {
            if (dt == DTYPE_F32) ((float *)w)[i] = rnd_float(&seed);
            else ((uint16_t *)w)[i] = rnd_bf16(&seed);
        }
        float *xf;
        float *x = make_x(&seed, cols, &xf);
        any_weight W = {.is_mxfp4 = 0, .d = {dt, rows, cols, w}};
        check_weight(ts, dt == DTYPE_F32 ? "dense f32" : "dense bf16", &W, x);
        free(xf);
        free(wbuf);
    }
}

static void fill_mxfp4(uint64_t *s, uint8_t *packed, uint8_t *scales, size_t rows, size_t cols) {
    for (size_t i = 0; i < rows * cols / 2; i++) packed[i] = (uint8_t)rng_next(s);
    for (size_t i = 0; i < rows * cols / 32; i++) {
        uint64_t r = rng_next(s);
        scales[i] = (r & 31) == 0 ? (uint8_t)(r >> 8) % 255 : (uint8_t)(107 + (r >> 8) % 41);
    }
}

static void test_mxfp4_sizes(tstate *ts) {
    static const size_t cols_list[] = {32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 640, 1056, 3072, 3584, 7168};
    static const size_t rows_list[] = {1, 3, 5, 7, 13, 17, 8, 16, 24};
    uint64_t seed = 3;
    for (size_t ci = 0; ci < sizeof cols_list / sizeof cols_list[0]; ci++) {
        size_t cols = cols_list[ci], rows = rows_list[ci % 9];
        uint8_t *packed = malloc(rows * cols / 2 + 1), *scales = malloc(rows * cols / 32 + 1);
        if (!packed || !scales) abort();
        fill_mxfp4(&seed, packed + 1, scales + 1, rows, cols); /* misaligned */
        float *xf;
        float *x = make_x(&seed, cols, &xf);
        any_weight W = {.is_mxfp4 = 1, .m = {rows, cols, packed + 1, scales + 1}};
        check_weight(ts, "mxfp4", &W, x);
        free(xf);
        free(packed);
        free(scales);
    }
}

/* 1 thread vs several: rows split differently, bits identical. */
static void test_threads(tstate *ts) {
    const size_t rows = 301, cols = 7168, ntok = 5; /* 5 (make_x holds 5 tokens): the multi-token kernels too */
    uint64_t seed = 4;
    float *wf = malloc(rows * cols * sizeof *wf);
    uint16_t *wb = malloc(rows * cols * sizeof *wb);
    uint8_t *packed = malloc(rows * cols / 2), *scales = malloc(rows * cols / 32);
    float *y1 = malloc(ntok * rows * sizeof *y1), *yn = malloc(ntok * rows * sizeof *yn);
    if (!wf || !wb || !packed || !scales || !y1 || !yn) abort();
    for (size_t i = 0; i < rows * cols; i++) {
        wf[i] = rnd_float(&seed);
        wb[i] = rnd_bf16(&seed);
    }
    fill_mxfp4(&seed, packed, scales, rows, cols);
    float *xf;
    float *x = make_x(&seed, cols, &xf);
    any_weight Ws[3] = {{.is_mxfp4 = 0, .d = {DTYPE_F32, rows, cols, wf}},
                        {.is_mxfp4 = 0, .d = {DTYPE_BF16, rows, cols, wb}},
                        {.is_mxfp4 = 1, .m = {rows, cols, packed, scales}}};
    static const char *names[3] = {"f32", "bf16", "mxfp4"};
    static const int nthreads[] = {2, 3, 4, 7};
    int saved = omp_get_max_threads();
    for (int l = 0; l < ts->nlevels; l++)
        for (int wi = 0; wi < 3; wi++) {
            omp_set_num_threads(1);
            run_matmul(ts->levels[l], &Ws[wi], x, ntok, y1);
            for (size_t ti = 0; ti < sizeof nthreads / sizeof nthreads[0]; ti++) {
                omp_set_num_threads(nthreads[ti]);
                run_matmul(ts->levels[l], &Ws[wi], x, ntok, yn);
                CHECK(bits_equal(y1, yn, ntok * rows), "threads: %s %s 1 thread != %d threads", ts->levels[l]->name,
                      names[wi], nthreads[ti]);
            }
        }
    omp_set_num_threads(saved);
    free(xf);
    free(wf);
    free(wb);
    free(packed);
    free(scales);
    free(y1);
    free(yn);
}

/* Prefill-sized batches: row counts across the multi-token kernels' row tiles (24;
 * AVX-512: 96-row panels of 12-row sub-tiles) and micro-kernels (3; AVX-512: 4), token
 * counts across their token blocks (16; AVX-512: at most 72, balanced) and
 * micro-kernels (4; AVX-512: 6), column counts across their column blocks (AVX2 128, AVX-512 256)
 * with tails:
 * every (row, token) of a batch == a single-token scalar call. */
static void test_batches(tstate *ts) {
    static const size_t shapes[][3] = {/* rows, cols, ntok */
                                       {1, 8, 4},     {2, 9, 5},      {25, 128, 6},  {47, 129, 7},
                                       {50, 300, 16}, {49, 256, 17},  {97, 1000, 33}, {24, 7175, 19},
                                       {73, 64, 40},  {5, 3584, 64},  {26, 160, 23}, {3, 3072, 12},
                                       /* the AVX-512 blocking: 4-row x 6-token micro-kernels, 12-row weight
                                        * sub-tiles in 96-row panels, 256-column blocks, token blocks of at
                                        * most 72 split evenly (73 -> 37 + 36, 97 -> 49 + 48, 100 -> 50 + 50,
                                        * 145 -> 49 + 49 + 47, 481 -> 6 x 69 + 67) */
                                       {30, 200, 25}, {23, 136, 48},  {7, 520, 53},  {48, 264, 11},
                                       {200, 300, 49}, {121, 264, 97}, {96, 128, 64}, {98, 40, 100},
                                       {20, 600, 73}, {11, 776, 145}, {193, 257, 72},
                                       /* the last 1-5 tokens of a block: 7/8 tokens x 3 rows, 3/4 x 6, 5 x 4,
                                        * 1/2 x 8 (a block of fewer than 6: 4 or 5 tokens, rows 5, 13, 27) */
                                       {50, 96, 31}, {27, 64, 26}, {29, 72, 27}, {53, 40, 28}, {13, 100, 4},
                                       {27, 64, 5}, {5, 32, 8}, {45, 33, 43}, {9, 32, 481}};
    uint64_t seed = 5;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const size_t rows = shapes[si][0], ntok = shapes[si][2];
        for (int kind = 0; kind < 3; kind++) {
            size_t cols = shapes[si][1];
            if (kind == 2) cols = (cols + 31) / 32 * 32;
            float *wf = malloc(rows * cols * sizeof *wf), *x = malloc(ntok * cols * sizeof *x);
            uint16_t *wb = malloc(rows * cols * sizeof *wb);
            uint8_t *packed = malloc(rows * cols / 2 + 1), *scales = malloc(rows * cols / 32 + 1);
            float *ref = malloc(ntok * rows * sizeof *ref), *y = malloc(ntok * rows * sizeof *y);
            if (!wf || !x || !wb || !packed || !scales || !ref || !y) abort();
            for (size_t i = 0; i < rows * cols; i++) {
                wf[i] = rnd_float(&seed);
                wb[i] = rnd_bf16(&seed);
            }
            fill_mxfp4(&seed, packed, scales, rows, cols);
            for (size_t i = 0; i < ntok * cols; i++) x[i] = rnd_float(&seed);
            any_weight W;
            if (kind == 0) W = (any_weight){.is_mxfp4 = 0, .d = {DTYPE_F32, rows, cols, wf}};
            else if (kind == 1) W = (any_weight){.is_mxfp4 = 0, .d = {DTYPE_BF16, rows, cols, wb}};
            else W = (any_weight){.is_mxfp4 = 1, .m = {rows, cols, packed, scales}};
            float *y1 = malloc(rows * sizeof *y1);
            if (!y1) abort();
            for (size_t t = 0; t < ntok; t++) {
                run_matmul(ts->levels[0], &W, x + t * cols, 1, y1);
                memcpy(ref + t * rows, y1, rows * sizeof *y1);
            }
            for (int l = 0; l < ts->nlevels; l++) {
                run_matmul(ts->levels[l], &W, x, ntok, y);
                size_t d = first_diff(y, ref, ntok * rows);
                CHECK(d == ntok * rows,
                      "batch %s rows=%zu cols=%zu ntok=%zu: %s differs from single-token scalar at token %zu row %zu",
                      kind == 0 ? "f32" : kind == 1 ? "bf16" : "mxfp4", rows, cols, ntok, ts->levels[l]->name,
                      d / rows, d % rows);
            }
            free(y1);
            free(wf);
            free(x);
            free(wb);
            free(packed);
            free(scales);
            free(ref);
            free(y);
        }
    }
}

/* The AVX-512 gemm decodes an MXFP4 sub-tile (12 rows x a 256-column block) into f32 when
 * every block scale in it is <= 252 (E2M1 x 2^(s-127) exact in f32, s = 0 an f32 subnormal)
 * and into double otherwise: scale bytes at both ends of that range, one column block of one
 * sub-tile at a time (the others in the f32 range), == one token at a time. */
static void test_mxfp4_gemm_scales(tstate *ts) {
    static const uint8_t special[] = {0, 1, 2, 125, 126, 127, 250, 251, 252, 253, 254};
    const size_t rows = 40, cols = 768, ntok = 19;
    uint8_t *packed = malloc(rows * cols / 2), *scales = malloc(rows * cols / 32);
    float *x = malloc(ntok * cols * sizeof *x), *ref = malloc(ntok * rows * sizeof *ref), *y = malloc(ntok * rows * sizeof *y);
    if (!packed || !scales || !x || !ref || !y) abort();
    uint64_t seed = 77;
    for (size_t i = 0; i < rows * cols / 2; i++) packed[i] = (uint8_t)rng_next(&seed);
    for (size_t i = 0; i < ntok * cols; i++) x[i] = rnd_float(&seed);
    mxfp4_weight W = {rows, cols, packed, scales, 0};
    for (size_t sp = 0; sp < sizeof special; sp++)
        for (int where = 0; where < 3; where++) {
            /* where 0: every block of every row; 1: one block (row 13, column block 1); 2: every
             * block of rows 24..35 (a whole sub-tile), the rest at scales 120..131 */
            for (size_t i = 0; i < rows * cols / 32; i++) {
                const size_t r = i / (cols / 32), b = i % (cols / 32);
                const int hit = where == 0 || (where == 1 && r == 13 && b == 8 + 3) || (where == 2 && r >= 24 && r < 36);
                scales[i] = hit ? special[sp] : (uint8_t)(120 + (i * 7) % 12);
            }
            for (size_t t = 0; t < ntok; t++) matmul_mxfp4(ts->levels[0], &W, x + t * cols, 1, ref + t * rows);
            for (int l = 0; l < ts->nlevels; l++) {
                matmul_mxfp4(ts->levels[l], &W, x, ntok, y);
                size_t d = first_diff(y, ref, ntok * rows);
                CHECK(d == ntok * rows, "mxfp4 gemm scale byte %u (where %d) %s: token %zu row %zu differs (%a, want %a)",
                      special[sp], where, ts->levels[l]->name, d / rows, d % rows, d < ntok * rows ? y[d] : 0.0f,
                      d < ntok * rows ? ref[d] : 0.0f);
            }
        }
    free(packed);
    free(scales);
    free(x);
    free(ref);
    free(y);
}

/* A random MXFP4 matrix with room for maxtok tokens of input, output and reference. */
typedef struct {
    mxfp4_weight W;
    uint8_t *pk, *sc;
    float *x, *y, *ref;
} mx_case;

static void mx_case_make(mx_case *m, uint64_t *seed, size_t rows, size_t cols, size_t maxtok) {
    m->pk = malloc(rows * cols / 2);
    m->sc = malloc(rows * cols / 32);
    m->x = malloc(maxtok * cols * sizeof(float));
    m->y = malloc(maxtok * rows * sizeof(float));
    m->ref = malloc(maxtok * rows * sizeof(float));
    if (!m->pk || !m->sc || !m->x || !m->y || !m->ref) abort();
    fill_mxfp4(seed, m->pk, m->sc, rows, cols);
    for (size_t e = 0; e < maxtok * cols; e++) m->x[e] = rnd_float(seed);
    m->W = (mxfp4_weight){rows, cols, m->pk, m->sc, 0};
}

static void mx_case_free(mx_case *m) {
    free(m->pk);
    free(m->sc);
    free(m->x);
    free(m->y);
    free(m->ref);
}

/* matmul_mxfp4_many (an expert's w1 and w3 in one parallel region: expert_compute.c) ==
 * one scalar matmul_mxfp4 per weight, for shapes across the row block and the multi-token
 * tiles, token counts on both sides of the multi-token kernels, more weights than one
 * region takes. */
static void test_mxfp4_many(tstate *ts) {
    enum { NW = 10 };
    static const size_t shapes[NW][2] = {{5, 64}, {24, 128}, {1, 32}, {50, 320}, {7, 3584},
                                         {31, 96}, {8, 32}, {97, 224}, {17, 1056}, {48, 160}};
    uint64_t seed = 12;
    mx_case mc[NW];
    mxfp4_weight W[NW];
    float *xs[NW], *ys[NW], *ref[NW];
    for (int i = 0; i < NW; i++) {
        mx_case_make(&mc[i], &seed, shapes[i][0], shapes[i][1], 7);
        W[i] = mc[i].W, xs[i] = mc[i].x, ys[i] = mc[i].y, ref[i] = mc[i].ref;
    }
    static const size_t ntoks[] = {1, 2, 3, 4, 7};
    for (size_t ti = 0; ti < sizeof ntoks / sizeof ntoks[0]; ti++) {
        size_t nt = ntoks[ti];
        for (int i = 0; i < NW; i++)
            for (size_t t = 0; t < nt; t++) matmul_mxfp4(ts->levels[0], &W[i], xs[i] + t * W[i].cols, 1, ref[i] + t * W[i].rows);
        for (int l = 0; l < ts->nlevels; l++) {
            matmul_mxfp4_many(ts->levels[l], W, (const float *const *)xs, nt, ys, NW);
            for (int i = 0; i < NW; i++) {
                size_t d = first_diff(ys[i], ref[i], nt * W[i].rows);
                CHECK(d == nt * W[i].rows, "matmul_mxfp4_many %s ntok=%zu weight %d (%zux%zu): row %zu differs",
                      ts->levels[l]->name, nt, i, W[i].rows, W[i].cols, d % W[i].rows);
            }
        }
    }
    for (int i = 0; i < NW; i++) mx_case_free(&mc[i]);
}

/* matmul_mxfp4_list (every routed expert of a decode step in one region: expert_batch.c)
 * == one scalar matmul_mxfp4 per weight and token: token counts per matrix on both sides of
 * the multi-token kernels, one-token matrices sharing their x (converted to double once per
 * call) or not, more matrices than one region takes (K3_MATMUL_LIST_MAX). */
static void test_mxfp4_list(tstate *ts) {
    enum { NW = K3_MATMUL_LIST_MAX + 6 };
    static const size_t shapes[7][2] = {{16, 64}, {24, 128}, {1, 32}, {50, 320}, {9, 3584}, {8, 96}, {17, 1056}};
    static const size_t ntoks[5] = {1, 1, 2, 4, 3};
    uint64_t seed = 13;
    mx_case mc[NW];
    mxfp4_weight W[NW];
    float *ys[NW], *ref[NW];
    const float *xp[NW];
    size_t nt[NW];
    for (int i = 0; i < NW; i++) {
        nt[i] = ntoks[i % 5];
        mx_case_make(&mc[i], &seed, shapes[i % 7][0], shapes[i % 7][1], 4);
        W[i] = mc[i].W, ys[i] = mc[i].y, ref[i] = mc[i].ref;
        xp[i] = mc[i].x;
        /* a one-token matrix after one of the same width: the same x (an expert's w1 and w3) */
        if (i >= 7 && nt[i] == 1 && nt[i - 7] == 1 && i % 3 == 0) xp[i] = xp[i - 7];
    }
    for (int i = 0; i < NW; i++)
        for (size_t t = 0; t < nt[i]; t++)
            matmul_mxfp4(ts->levels[0], &W[i], xp[i] + t * W[i].cols, 1, ref[i] + t * W[i].rows);
    for (int l = 0; l < ts->nlevels; l++) {
        for (int i = 0; i < NW; i++) memset(ys[i], 0xff, 4 * W[i].rows * sizeof(float));
        matmul_mxfp4_list(ts->levels[l], W, xp, nt, ys, NW);
        for (int i = 0; i < NW; i++) {
            size_t d = first_diff(ys[i], ref[i], nt[i] * W[i].rows);
            CHECK(d == nt[i] * W[i].rows, "matmul_mxfp4_list %s weight %d (%zux%zu, %zu tokens): row %zu differs",
                  ts->levels[l]->name, i, W[i].rows, W[i].cols, nt[i], d % W[i].rows);
        }
    }
    for (int i = 0; i < NW; i++) mx_case_free(&mc[i]);
}

/* matmul_dense_many (several matmuls in one parallel region: kda.c, mlp_moe.c through
 * trunk_matmul_many) == one matmul_dense per weight, for mixed dtypes and shapes, token
 * counts on both sides of the multi-token kernels, more weights than one region takes. */
static void test_many(tstate *ts) {
    enum { NW = 11 };
    static const size_t shapes[NW][2] = {{5, 40}, {24, 129}, {1, 8}, {50, 300}, {7, 7175}, {31, 64},
                                         {4, 16}, {97, 200}, {3, 3}, {26, 128}, {48, 520}};
    uint64_t seed = 11;
    dense_weight W[NW];
    void *wbuf[NW];
    float *xs[NW], *ys[NW], *ref[NW];
    for (int i = 0; i < NW; i++) {
        size_t rows = shapes[i][0], cols = shapes[i][1];
        int bf = i % 3 != 1;
        wbuf[i] = malloc(rows * cols * (bf ? 2 : 4));
        xs[i] = malloc(7 * cols * sizeof(float));
        ys[i] = malloc(7 * rows * sizeof(float));
        ref[i] = malloc(7 * rows * sizeof(float));
        if (!wbuf[i] || !xs[i] || !ys[i] || !ref[i]) abort();
        for (size_t e = 0; e < rows * cols; e++) {
            if (bf) ((uint16_t *)wbuf[i])[e] = rnd_bf16(&seed);
            else ((float *)wbuf[i])[e] = rnd_float(&seed);
        }
        for (size_t e = 0; e < 7 * cols; e++) xs[i][e] = rnd_float(&seed);
        W[i] = (dense_weight){bf ? DTYPE_BF16 : DTYPE_F32, rows, cols, wbuf[i], -1, 0};
    }
    static const size_t ntoks[] = {1, 2, 3, 4, 7};
    for (int l = 0; l < ts->nlevels; l++)
        for (size_t ti = 0; ti < sizeof ntoks / sizeof ntoks[0]; ti++) {
            size_t nt = ntoks[ti];
            for (int i = 0; i < NW; i++) matmul_dense(ts->levels[l], &W[i], xs[i], nt, ref[i]);
            matmul_dense_many(ts->levels[l], W, (const float *const *)xs, nt, ys, NW);
            for (int i = 0; i < NW; i++) {
                size_t d = first_diff(ys[i], ref[i], nt * W[i].rows);
                CHECK(d == nt * W[i].rows, "matmul_dense_many %s ntok=%zu weight %d (%zux%zu): row %zu differs",
                      ts->levels[l]->name, nt, i, W[i].rows, W[i].cols, d % W[i].rows);
            }
        }
    for (int i = 0; i < NW; i++) {
        free(wbuf[i]);
        free(xs[i]);
        free(ys[i]);
        free(ref[i]);
    }
}

/* The SIMD paths use fused multiply-add: fma(w, x, acc) == acc + w*x bit for bit
 * because the double product of a float/bf16/E2M1*2^k weight and a float is exact.
 * Checked here on the C library's fma for random and extreme operands. */
static void test_fma_is_exact(void) {
    uint64_t seed = 6;
    for (int i = 0; i < 200000; i++) {
        double w = i & 1 ? (double)bf16_to_f32(rnd_bf16(&seed)) : (double)rnd_float(&seed);
        if (i % 3 == 0) w = (double)E2M1_VALUES[rng_next(&seed) & 15] * ldexp(1.0, (int)(rng_next(&seed) % 255) - 127);
        double x = (double)rnd_float(&seed), acc = (double)rnd_float(&seed) * ldexp(1.0, (int)(rng_next(&seed) % 60) - 30);
        if (i % 7 == 0) x = i % 14 == 0 ? 0x1p127 : 0x1p-149;
        double f = fma(w, x, acc), m = acc + w * x;
        CHECK(memcmp(&f, &m, sizeof f) == 0, "fma(%a, %a, %a) = %a != acc + w*x = %a", w, x, acc, f, m);
    }
}

/* Products and lane sums are in double: (1+2^-23)^2 - (1+2^-22) = 2^-46 in lane 0
 * (float products would give 0); the other lanes get exact zeros. */
static void test_double_products(tstate *ts) {
    float w[9] = {0}, x[9] = {0};
    w[0] = x[0] = 1.0f + 0x1p-23f;
    w[8] = -(1.0f + 0x1p-22f);
    x[8] = 1.0f;
    for (int l = 0; l < ts->nlevels; l++) {
        float v = ts->levels[l]->dot_f32(w, x, 9);
        CHECK(v == 0x1p-46f, "%s dot_f32: expected 2^-46 (double products), got %a", ts->levels[l]->name, v);
    }
    /* an fp32 overflow that double absorbs: 2^100 * 2^100 - 2^100 * 2^100 in lane 0, plus 1 */
    float w2[10] = {0}, x2[10] = {0};
    w2[0] = x2[0] = 0x1p100f;
    w2[8] = -0x1p100f;
    x2[8] = 0x1p100f;
    w2[9] = 1.0f;
    x2[9] = 1.0f;
    for (int l = 0; l < ts->nlevels; l++) {
        float v = ts->levels[l]->dot_f32(w2, x2, 10);
        CHECK(v == 1.0f, "%s dot_f32: expected 1 (no fp32 overflow), got %a", ts->levels[l]->name, v);
    }
}

/* The partition is the documented one and not another: a sequential sum gives
 * other bits on this data, and so does a 4-lane partition. Guards the reference. */
static void test_partition_is_sensitive(tstate *ts) {
    float w[16], x[16];
    for (int i = 0; i < 16; i++) {
        w[i] = 1.0f;
        x[i] = 0.0f;
    }
    x[0] = 0x1p60f;
    x[4] = 1.0f;
    x[8] = -0x1p60f;
    /* 8 lanes: lane0 = 2^60 - 2^60 = 0, lane4 = 1 -> 1. Sequential or 4 lanes: 2^60 + 1 = 2^60, then 0. */
    for (int l = 0; l < ts->nlevels; l++) {
        float v = ts->levels[l]->dot_f32(w, x, 16);
        CHECK(v == 1.0f, "%s dot_f32: 8-lane partition expected 1, got %a", ts->levels[l]->name, v);
    }
}

/* The lane reduction order ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)): lanes a, b hold
 * +-2^60 and lane c holds 1 (1 + 2^60 rounds to 2^60), so every other
 * association loses or keeps the 1 differently for some (a, b, c). */
static void test_reduction_order(tstate *ts) {
    static const float fill[2] = {0.0f, 1.0f};
    float w[8], x[8];
    for (int f = 0; f < 2; f++)
        for (int a = 0; a < 8; a++)
            for (int b = 0; b < 8; b++)
                for (int c = 0; c < 8; c++) {
                    if (a == b || a == c || b == c) continue;
                    for (int i = 0; i < 8; i++) {
                        w[i] = 1.0f;
                        x[i] = fill[f];
                    }
                    x[a] = 0x1p60f;
                    x[b] = -0x1p60f;
                    x[c] = 3.0f;
                    float want = ref_dot(REF_F32, w, NULL, x, 8);
                    for (int l = 0; l < ts->nlevels; l++) {
                        float v = ts->levels[l]->dot_f32(w, x, 8);
                        CHECK(memcmp(&v, &want, sizeof v) == 0,
                              "%s reduction order: +2^60 in lane %d, -2^60 in lane %d, 3 in lane %d, fill %g: got %a "
                              "want %a",
                              ts->levels[l]->name, a, b, c, fill[f], v, want);
                    }
                }
}

static void test_e2m1_table(void) {
    static const float expect[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    for (int c = 0; c < 16; c++) {
        CHECK(memcmp(&E2M1_VALUES[c], &expect[c], sizeof(float)) == 0, "E2M1_VALUES[%d] = %a, expected %a", c,
              E2M1_VALUES[c], expect[c]);
        CHECK((double)E2M1_VALUES[c] == e2m1_decode((unsigned)c), "E2M1_VALUES[%d] disagrees with bit fields",
              c);
    }
    CHECK(signbit(E2M1_VALUES[8]), "E2M1_VALUES[8] must be -0.0");
}

/* Every code in every nibble position of one block, against the hand value. */
static void test_mxfp4_codes(tstate *ts) {
    uint8_t packed[16], scale = 127;
    float x[32];
    for (int l = 0; l < ts->nlevels; l++)
        for (int pos = 0; pos < 32; pos++)
            for (unsigned c = 0; c < 16; c++) {
                memset(packed, 0, sizeof packed);
                memset(x, 0, sizeof x);
                packed[pos / 2] = (uint8_t)(pos % 2 == 0 ? c : c << 4);
                /* the neighbour nibble gets a distinct code with x = 0 there: a wrong nibble reads it */
                packed[pos / 2] |= (uint8_t)(pos % 2 == 0 ? 0x70 : 0x07);
                x[pos] = 3.0f;
                float v = ts->levels[l]->dot_mxfp4(packed, &scale, x, 32);
                float want = (float)(3.0 * e2m1_decode(c));
                if (c == 8) want = 0.0f; /* -0.0 * 3 = -0.0, added to a +0.0 lane: +0.0 */
                CHECK(memcmp(&v, &want, sizeof v) == 0, "%s mxfp4 code %u at element %d: got %a want %a",
                      ts->levels[l]->name, c, pos, v, want);
            }
}

/* Low nibble = even element: the kernels agree with the reference and differ
 * from a nibble-swapped decode of the same bytes. */
static void test_mxfp4_nibble_order(tstate *ts) {
    uint8_t packed[16], scale = 127;
    float x[32];
    memset(x, 0, sizeof x);
    memset(packed, 0, sizeof packed);
    packed[0] = 0x21; /* element 0 = code 1 (0.5), element 1 = code 2 (1.0) */
    x[0] = 1.0f;
    for (int l = 0; l < ts->nlevels; l++) {
        float v = ts->levels[l]->dot_mxfp4(packed, &scale, x, 32);
        CHECK(v == 0.5f, "%s mxfp4: byte 0x21, x=e0: expected 0.5 (low nibble = element 0), got %a",
              ts->levels[l]->name, v);
    }
    uint64_t seed = 5;
    uint8_t rp[64 * 16], rs[64];
    float rx[64 * 32];
    fill_mxfp4(&seed, rp, rs, 1, 64 * 32);
    for (size_t b = 0; b < 64; b++) rs[b] = (uint8_t)(117 + b % 21); /* finite result */
    for (size_t i = 0; i < 64 * 32; i++) rx[i] = rnd_float(&seed);
    float right = ref_dot(REF_MXFP4, rp, rs, rx, 64 * 32);
    float swapped = ref_dot(REF_MXFP4_SWAPPED, rp, rs, rx, 64 * 32);
    CHECK(right != swapped, "nibble-swapped decode should give a different answer (%a)", right);
    for (int l = 0; l < ts->nlevels; l++) {
        float v = ts->levels[l]->dot_mxfp4(rp, rs, rx, 64 * 32);
        CHECK(v == right && v != swapped, "%s mxfp4 random row: got %a, right %a, nibble-swapped %a",
              ts->levels[l]->name, v, right, swapped);
    }
}

/* Scale byte 0 is 2^-127 (not zero); 254 is 2^127. */
static void test_mxfp4_scale_extremes(tstate *ts) {
    uint8_t packed[16] = {0};
    float x[32] = {0};
    packed[0] = 0x07; /* element 0 = 6.0 */
    x[0] = 0x1p100f;
    uint8_t s0 = 0, s254 = 254;
    for (int l = 0; l < ts->nlevels; l++) {
        float v = ts->levels[l]->dot_mxfp4(packed, &s0, x, 32);
        CHECK(v == 6.0f * 0x1p-27f, "%s mxfp4 scale byte 0: expected 6*2^-127*2^100 = %a, got %a",
              ts->levels[l]->name, 6.0f * 0x1p-27f, v);
        x[0] = 0x1p-120f;
        v = ts->levels[l]->dot_mxfp4(packed, &s254, x, 32);
        CHECK(v == 6.0f * 128.0f, "%s mxfp4 scale byte 254: expected 768, got %a", ts->levels[l]->name, v);
        x[0] = 0x1p100f;
    }
    /* 6 * 2^127 overflows fp32 but not double: w*x with x = 2^-127 gives 6 exactly */
    x[0] = 0x1p-127f; /* subnormal float */
    for (int l = 0; l < ts->nlevels; l++) {
        float v = ts->levels[l]->dot_mxfp4(packed, &s254, x, 32);
        CHECK(v == 6.0f, "%s mxfp4 6*2^127*2^-127: expected 6, got %a", ts->levels[l]->name, v);
    }
}

/* bf16 weights and float activations at the ends of their ranges through every level's
 * one-token row blocks (the AVX-512 one builds |w| 2^-896 from the bits and scales x by
 * 2^896): subnormal and largest finite weights, +-0, subnormal and largest floats, with
 * products that overflow float but not double; each row equals the scalar reference. */
static void test_bf16_extremes(tstate *ts) {
    static const uint16_t wv[] = {0x0001, 0x8001, 0x007f, 0x807f, 0x0080, 0x8080, 0x7f7f, 0xff7f, 0x0000, 0x8000,
                                  0x3f80, 0xbf80, 0x0040, 0x7f00, 0x00ff, 0x8123};
    static const float xv[] = {0x1p-149f, -0x1p-149f, 0x1.fffffep127f, -0x1.fffffep127f, 0.0f, -0.0f, 1.0f,
                               0x1p-126f, 3.0f, -0x1.234p-140f, 0x1.8p100f, -2.5f};
    static const size_t cols_list[] = {1, 7, 8, 9, 15, 16, 17, 31, 33, 47, 64, 100};
    const size_t nw = sizeof wv / sizeof wv[0], nx = sizeof xv / sizeof xv[0];
    uint64_t seed = 9;
    for (size_t ci = 0; ci < sizeof cols_list / sizeof cols_list[0]; ci++) {
        const size_t cols = cols_list[ci], rows = 24; /* the 16-row and the 8-row kernels */
        uint16_t *w = malloc(rows * cols * sizeof *w);
        float *xf;
        float *x = make_x(&seed, cols, &xf);
        if (!w) abort();
        for (size_t i = 0; i < rows * cols; i++) w[i] = wv[rng_next(&seed) % nw];
        for (size_t t = 0; t < 5; t++)
            for (size_t c = 0; c < cols; c++)
                if (rng_next(&seed) % 3 == 0) x[t * cols + c] = xv[rng_next(&seed) % nx];
        /* rows of only the extremes, so no large term hides a small one */
        for (size_t c = 0; c < cols; c++) w[c] = wv[c % nw], x[c] = xv[c % nx];
        any_weight W = {.is_mxfp4 = 0, .d = {DTYPE_BF16, rows, cols, w}};
        check_weight(ts, "dense bf16 extremes", &W, x);
        free(xf);
        free(w);
    }
}

/* Every one-token bf16 row kernel of the AVX-512 level called directly (not only the one the
 * drivers pick for this CPU): the 8-row shift kernel, the 16-row shift kernel and the 16-row
 * byte kernel (vpermi2b, where the CPU has AVX512-VBMI), each row against the independent
 * reference, on random and extreme weights and activations and widths with every tail. */
static void test_bf16_row_variants(tstate *ts) {
#ifdef K3_HAVE_X86_KERNELS
    if (!kernels_get(SIMD_AVX512)) {
        printf("SKIP bf16 row variants: no AVX-512\n");
        return;
    }
    static const uint16_t wv[] = {0x0001, 0x8001, 0x007f, 0x807f, 0x0080, 0x8080, 0x7f7f, 0xff7f, 0x0000, 0x8000,
                                  0x3f80, 0xbf80, 0x0040, 0x7f00, 0x00ff, 0x8123};
    static const float xv[] = {0x1p-149f, -0x1p-149f, 0x1.fffffep127f, -0x1.fffffep127f, 0.0f, -0.0f, 1.0f,
                               0x1p-126f, 3.0f, -0x1.234p-140f, 0x1.8p100f, -2.5f};
    static const struct { const char *name; k3_rows_bf16_xs_fn fn; size_t rows; int vbmi; } var[] = {
        {"xs 8 rows", k3_rows_bf16_xs_avx512, 8, 0},
        {"xs16 shift", k3_rows_bf16_xs16_avx512, 16, 0},
        {"xsb16 bytes", k3_rows_bf16_xsb16_avx512, 16, 1},
    };
    const int vbmi = k3_cpu_has_vbmi();
    if (!vbmi) printf("SKIP bf16 row variant xsb16: no AVX512-VBMI\n");
    uint64_t seed = 21;
    for (size_t cols = 1; cols <= 200; cols += cols < 72 ? 1 : 13) {
        for (int extreme = 0; extreme < 2; extreme++) {
            const size_t rows = 16;
            uint16_t *w = malloc(rows * cols * sizeof *w);
            float *x = malloc(cols * sizeof *x), *got = malloc(rows * sizeof *got);
            double *xs = malloc(cols * sizeof *xs);
            if (!w || !x || !got || !xs) abort();
            for (size_t i = 0; i < rows * cols; i++)
                w[i] = extreme && rng_next(&seed) % 2 ? wv[rng_next(&seed) % (sizeof wv / sizeof wv[0])] : rnd_bf16(&seed);
            for (size_t c = 0; c < cols; c++) {
                x[c] = extreme && rng_next(&seed) % 3 == 0 ? xv[rng_next(&seed) % (sizeof xv / sizeof xv[0])] : rnd_float(&seed);
                xs[c] = (double)x[c] * K3_BF16_XS_SCALE;
            }
            for (size_t v = 0; v <= sizeof var / sizeof var[0]; v++) {
                /* v == the count: the byte kernel prefetching a "next job" (here the same rows, 1..3x
                 * their bytes: larger, equal and smaller prefetch steps) */
                const int nx = v == sizeof var / sizeof var[0];
                if (nx ? !vbmi : var[v].vbmi && !vbmi) continue;
                if (nx) k3_rows_bf16_xsb16n_avx512(w, xs, cols, got, w, rows * cols * sizeof *w * (1 + cols % 3));
                else var[v].fn(w, xs, cols, got);
                for (size_t r = 0; r < (nx ? 16 : var[v].rows); r++) {
                    const float ref = ref_dot(REF_BF16, w + r * cols, NULL, x, cols);
                    CHECK(memcmp(&ref, &got[r], sizeof ref) == 0, "bf16 row kernel %s cols=%zu%s row %zu: %a, reference %a",
                          nx ? "xsb16n bytes + next" : var[v].name, cols, extreme ? " (extremes)" : "", r, got[r], ref);
                }
            }
            free(w), free(x), free(got), free(xs);
        }
    }
    (void)ts;
#else
    (void)ts;
#endif
}

/* Every one-token MXFP4 8-row kernel of the AVX-512 level called directly: x in float, x in
 * double with the vpermi2pd table, x in double with the vpermw word table (Zen 4's), the same
 * from the lane layout (k3_mxfp4_to_lanes, whose inverse must give the codes back), each row
 * against the independent reference; random codes and scales, then every code with the scale
 * bytes 0, 1, 127, 253 and 254 (the ends of the exponent range). */
static void test_mxfp4_row_variants(tstate *ts) {
#ifdef K3_HAVE_X86_KERNELS
    if (!kernels_get(SIMD_AVX512)) {
        printf("SKIP mxfp4 row variants: no AVX-512\n");
        return;
    }
    static const uint8_t edge_scales[] = {0, 1, 127, 253, 254};
    static const size_t cols_list[] = {32, 64, 96, 128, 160, 256, 320, 1056, 3072, 3584};
    uint64_t seed = 23;
    for (size_t ci = 0; ci < sizeof cols_list / sizeof cols_list[0]; ci++)
        for (int edge = 0; edge < 2; edge++) {
            const size_t cols = cols_list[ci], rows = 8;
            uint8_t *packed = malloc(rows * cols / 2), *scales = malloc(rows * cols / 32);
            float *x = malloc(cols * sizeof *x), *got = malloc(rows * sizeof *got);
            double *xd = malloc(cols * sizeof *xd);
            if (!packed || !scales || !x || !got || !xd) abort();
            fill_mxfp4(&seed, packed, scales, rows, cols);
            if (edge) {
                for (size_t i = 0; i < rows * cols / 2; i++) packed[i] = (uint8_t)(i * 17 + (i >> 3)); /* every code, both nibbles */
                for (size_t i = 0; i < rows * cols / 32; i++) scales[i] = edge_scales[i % sizeof edge_scales];
            }
            for (size_t c = 0; c < cols; c++) x[c] = rnd_float(&seed), xd[c] = (double)x[c];
            /* the lane layout of the same codes (whole 128-column groups only), and back */
            uint8_t *lanes = NULL;
            if (cols % K3_MXFP4_LANE_COLS == 0) {
                uint8_t *back = malloc(rows * cols / 2);
                if (!(lanes = malloc(rows * cols / 2)) || !back) abort();
                k3_mxfp4_to_lanes(packed, lanes, rows, cols);
                k3_mxfp4_from_lanes(lanes, back, rows, cols);
                CHECK(memcmp(back, packed, rows * cols / 2) == 0, "mxfp4 lane layout cols=%zu: the round trip changed the codes", cols);
                free(back);
            }
            for (int v = 0; v < 4; v++) {
                static const char *names[4] = {"x float", "xd vpermi2pd", "xd vpermw", "xd lanes"};
                if (v == 0) k3_rows_mxfp4_avx512(packed, scales, x, cols, got);
                else if (v == 1) k3_rows_mxfp4_xd_avx512(packed, scales, xd, cols, got);
                else if (v == 2) k3_rows_mxfp4_xdw_avx512(packed, scales, xd, cols, got);
                else if (lanes) k3_rows_mxfp4_xdl_avx512(lanes, scales, xd, cols, got);
                else continue;
                for (size_t r = 0; r < rows; r++) {
                    const float ref = ref_dot(REF_MXFP4, packed + r * cols / 2, scales + r * cols / 32, x, cols);
                    CHECK(memcmp(&ref, &got[r], sizeof ref) == 0, "mxfp4 row kernel %s cols=%zu%s row %zu: %a, reference %a",
                          names[v], cols, edge ? " (every code, edge scales)" : "", r, got[r], ref);
                }
            }
            free(packed), free(scales), free(x), free(got), free(xd), free(lanes);
        }
    (void)ts;
#else
    (void)ts;
#endif
}

/* The AVX-512 gemm's two ways of giving the micro-kernels their weights (k3_gemm_weights:
 * widened there, or each sub-tile decoded into doubles once per token block; a CPU's drivers use
 * one), each called directly: == the scalar matmul one token at a time, for f32, bf16 (with and
 * without a partial last 8-column step, extreme values), MXFP4 in both layouts (scale bytes up to
 * 254: the double decode either way), partial panels and sub-tiles, 4 to 150 tokens (one and
 * three token blocks). */
static void test_gemm_weights(tstate *ts) {
#ifdef K3_HAVE_X86_KERNELS
    if (!kernels_get(SIMD_AVX512)) {
        printf("SKIP gemm weights: no AVX-512\n");
        return;
    }
    static const uint16_t wv[] = {0x0001, 0x8001, 0x007f, 0x807f, 0x0080, 0x7f7f, 0xff7f, 0x0000, 0x8000, 0x3f80};
    static const size_t shapes[][2] = {{12, 96}, {40, 203}, {97, 256}, {13, 520}, {200, 128}, {24, 1024}};
    static const size_t ntoks[] = {4, 7, 19, 80, 150};
    enum { MAXT = 150 };
    double *ws = aligned_alloc(64, (k3_gemm_ws_doubles_avx512() * sizeof(double) + 63) & ~(size_t)63);
    if (!ws) abort();
    uint64_t seed = 91;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const size_t rows = shapes[si][0], cols = shapes[si][1];
        float *x = malloc(MAXT * cols * sizeof *x), *wf = malloc(rows * cols * sizeof *wf);
        float *ref = malloc(MAXT * rows * sizeof *ref), *y = malloc(MAXT * rows * sizeof *y);
        uint16_t *wb = malloc(rows * cols * sizeof *wb);
        uint8_t *pk = malloc(rows * cols / 2 + 1), *lp = malloc(rows * cols / 2 + 1), *sc = malloc(rows * cols / 32 + 1);
        if (!x || !wf || !ref || !y || !wb || !pk || !lp || !sc) abort();
        for (size_t i = 0; i < MAXT * cols; i++) x[i] = rnd_float(&seed);
        for (size_t i = 0; i < rows * cols; i++) {
            wf[i] = rnd_float(&seed);
            wb[i] = rng_next(&seed) % 8 == 0 ? wv[rng_next(&seed) % (sizeof wv / sizeof wv[0])] : rnd_bf16(&seed);
        }
        const int mx = cols % 32 == 0, lanes = cols % 128 == 0;
        if (mx) {
            fill_mxfp4(&seed, pk, sc, rows, cols);
            for (size_t b = 0; b < rows * cols / 32; b++)
                if (b % 7 == 3) sc[b] = (uint8_t)(250 + b % 5); /* 250..254: both sides of 252 */
            memcpy(lp, pk, rows * cols / 2);
            if (lanes) mxfp4_repack_lanes(lp, rows, cols);
        }
        for (int kind = 0; kind < 4; kind++) { /* f32, bf16, MXFP4 release, MXFP4 lanes */
            if ((kind >= 2 && !mx) || (kind == 3 && !lanes)) continue;
            const dense_weight D = {kind == 0 ? DTYPE_F32 : DTYPE_BF16, rows, cols, kind == 0 ? (const void *)wf : wb, 0, 0};
            const mxfp4_weight M = {rows, cols, pk, sc, 0};
            for (size_t t = 0; t < MAXT; t++) {
                if (kind < 2) matmul_dense(ts->levels[0], &D, x + t * cols, 1, ref + t * rows);
                else matmul_mxfp4(ts->levels[0], &M, x + t * cols, 1, ref + t * rows);
            }
            for (size_t ti = 0; ti < sizeof ntoks / sizeof ntoks[0]; ti++)
                for (int how = 0; how < 2; how++) {
                    const size_t nt = ntoks[ti];
                    memset(y, 0xff, nt * rows * sizeof *y);
                    for (size_t r0 = 0; r0 < rows; r0 += K3_GEMM_NR_AVX512) {
                        const size_t nr = rows - r0 < K3_GEMM_NR_AVX512 ? rows - r0 : K3_GEMM_NR_AVX512;
                        const k3_gemm_weights hw = how ? K3_GEMM_DOUBLE : K3_GEMM_WIDEN;
                        if (kind == 0) k3_gemm_f32_avx512(wf, rows, cols, r0, nr, x, nt, y, ws, hw);
                        else if (kind == 1) k3_gemm_bf16_avx512(wb, rows, cols, r0, nr, x, nt, y, ws, hw);
                        else if (kind == 2) k3_gemm_mxfp4_avx512(pk, sc, rows, cols, r0, nr, x, nt, y, ws, hw);
                        else k3_gemm_mxfp4l_avx512(lp, sc, rows, cols, r0, nr, x, nt, y, ws, hw);
                    }
                    const size_t d = first_diff(y, ref, nt * rows);
                    CHECK(d == nt * rows, "gemm %s %s %zux%zu, %zu tokens: token %zu row %zu differs (%a, want %a)",
                          kind == 0 ? "f32" : kind == 1 ? "bf16" : kind == 2 ? "mxfp4" : "mxfp4 lanes",
                          how ? "double" : "widen", rows, cols, nt, d / rows, d % rows, d < nt * rows ? y[d] : 0.0f,
                          d < nt * rows ? ref[d] : 0.0f);
                }
        }
        free(x), free(wf), free(ref), free(y), free(wb), free(pk), free(lp), free(sc);
    }
    free(ws);
#else
    (void)ts;
    printf("SKIP gemm weights: no x86 kernels\n");
#endif
}

/* The lane layout as the drivers take it (mxfp4_weight.lanes, made by mxfp4_repack_lanes, which
 * the expert cache runs on resident experts): the in-place repack == k3_mxfp4_to_lanes (the
 * vpermi2b one where the CPU has VBMI), and matmul_mxfp4_list on lane weights == the scalar
 * matmul of the same codes in the release layout, at every level, for one token (the lane row
 * kernel), two and three (it again, token by token), panels of 4 to 80 tokens (the AVX-512 gemm's
 * lane decode into f32, and into double for scale bytes above 252), partial row blocks and other
 * levels (the scalar lane dot), mixed in one list with release weights and a shared x. A lane
 * weight whose width is not a multiple of 128 gives NaN. */
static void test_mxfp4_lanes(tstate *ts) {
    uint64_t seed = 29;
    static const size_t rep_shapes[][2] = {{1, 128}, {3, 256}, {8, 3584}, {5, 7168}};
    for (size_t i = 0; i < sizeof rep_shapes / sizeof rep_shapes[0]; i++) {
        const size_t rows = rep_shapes[i][0], cols = rep_shapes[i][1], nb = rows * cols / 2;
        uint8_t *a = malloc(nb), *want = malloc(nb);
        if (!a || !want) abort();
        for (size_t b = 0; b < nb; b++) a[b] = (uint8_t)rng_next(&seed);
        k3_mxfp4_to_lanes(a, want, rows, cols);
        mxfp4_repack_lanes(a, rows, cols);
        CHECK(memcmp(a, want, nb) == 0, "mxfp4_repack_lanes %zux%zu differs from k3_mxfp4_to_lanes", rows, cols);
        free(a), free(want);
    }
    enum { NW = 12, MAXT = 80 };
    static const size_t shapes[NW][2] = {{16, 128}, {24, 256}, {5, 128}, {50, 384}, {9, 3584}, {8, 1024},
                                         {97, 512}, {16, 128}, {200, 256}, {12, 640}, {33, 128}, {8, 256}};
    static const size_t ntoks[] = {1, 2, 3, 4, 7, 19, MAXT};
    mx_case mc[NW];
    mxfp4_weight W[NW];
    float *ys[NW], *ref[NW];
    const float *xp[NW];
    size_t nt[NW];
    for (int i = 0; i < NW; i++) {
        mx_case_make(&mc[i], &seed, shapes[i][0], shapes[i][1], MAXT);
        if (i == 9 || i == 11) /* scale bytes above 252: the gemm's double decode */
            for (size_t b = 0; b < shapes[i][0] * shapes[i][1] / 32; b++)
                if (b % 5 == 2) mc[i].sc[b] = (uint8_t)(253 + b % 2);
        ref[i] = mc[i].ref, ys[i] = mc[i].y;
    }
    for (size_t ti = 0; ti < sizeof ntoks / sizeof ntoks[0]; ti++) {
        for (int i = 0; i < NW; i++) {
            nt[i] = ntoks[(ti + (size_t)i) % (sizeof ntoks / sizeof ntoks[0])];
            if (i == 7) nt[i] = nt[0]; /* the same x as weight 0 (an expert's w1 and w3) */
            xp[i] = i == 7 ? mc[0].x : mc[i].x;
            W[i] = mc[i].W;
            W[i].packed = mc[i].pk;
            for (size_t t = 0; t < nt[i]; t++) /* the release layout, scalar, one token at a time */
                matmul_mxfp4(ts->levels[0], &W[i], xp[i] + t * W[i].cols, 1, ref[i] + t * W[i].rows);
        }
        uint8_t *lp[NW] = {0};
        for (int i = 0; i < NW; i++) {
            if (i % 4 == 3 && i != 7) continue; /* stays in the release layout */
            const size_t nb = W[i].rows * W[i].cols / 2;
            if (!(lp[i] = malloc(nb))) abort();
            memcpy(lp[i], mc[i].pk, nb);
            mxfp4_repack_lanes(lp[i], W[i].rows, W[i].cols);
            W[i].packed = lp[i];
            W[i].lanes = 1;
        }
        for (int l = 0; l < ts->nlevels; l++) {
            for (int i = 0; i < NW; i++) memset(ys[i], 0xff, MAXT * W[i].rows * sizeof(float));
            matmul_mxfp4_list(ts->levels[l], W, xp, nt, ys, NW);
            for (int i = 0; i < NW; i++) {
                size_t d = first_diff(ys[i], ref[i], nt[i] * W[i].rows);
                CHECK(d == nt[i] * W[i].rows, "matmul_mxfp4_list %s %s weight %d (%zux%zu, %zu tokens): token %zu row %zu differs",
                      ts->levels[l]->name, W[i].lanes ? "lanes" : "release", i, W[i].rows, W[i].cols, nt[i],
                      d / W[i].rows, d % W[i].rows);
            }
            /* one matrix alone (matmul_mxfp4) on lanes: the same */
            matmul_mxfp4(ts->levels[l], &W[4], xp[4], nt[4], ys[4]);
            CHECK(first_diff(ys[4], ref[4], nt[4] * W[4].rows) == nt[4] * W[4].rows, "matmul_mxfp4 %s lanes %zu tokens differs",
                  ts->levels[l]->name, nt[4]);
        }
        for (int i = 0; i < NW; i++) free(lp[i]);
    }
    /* a lane weight of a width that is not whole 128-column groups: NaN, not a guess */
    mxfp4_weight bad = mc[0].W;
    bad.cols = 96, bad.lanes = 1;
    for (int l = 0; l < ts->nlevels; l++) {
        matmul_mxfp4(ts->levels[l], &bad, mc[0].x, 1, mc[0].y);
        CHECK(isnan(mc[0].y[0]) && isnan(mc[0].y[bad.rows - 1]), "%s: a lane weight with cols 96 did not give NaN",
              ts->levels[l]->name);
    }
    for (int i = 0; i < NW; i++) mx_case_free(&mc[i]);
}

static void test_check_scales(void) {
    uint8_t packed[5 * 32] = {0}, scales[5 * 2];
    memset(scales, 127, sizeof scales);
    mxfp4_weight W = {5, 64, packed, scales, 0};
    size_t bad = 12345;
    CHECK(mxfp4_check_scales(&W, &bad) == 0, "mxfp4_check_scales: clean weight refused");
    scales[0] = 254;
    scales[1] = 0;
    CHECK(mxfp4_check_scales(&W, &bad) == 0, "mxfp4_check_scales: bytes 0 and 254 are valid");
    scales[7] = 255; /* row 3, second block */
    CHECK(mxfp4_check_scales(&W, &bad) == -1 && bad == 3, "mxfp4_check_scales: 255 in row 3 not found (bad=%zu)",
          bad);
    scales[9] = 255;
    CHECK(mxfp4_check_scales(&W, &bad) == -1 && bad == 3, "mxfp4_check_scales: first bad row must be 3 (%zu)",
          bad);
    scales[7] = 127;
    CHECK(mxfp4_check_scales(&W, &bad) == -1 && bad == 4, "mxfp4_check_scales: 255 in last row (bad=%zu)", bad);
}

/* A weight breaking its invariant (cols % 32, dtype; refused at load) gives NaN, never an abort. */
static void test_broken_weight_is_nan(tstate *ts) {
    uint8_t packed[3 * 24] = {0}, scales[3 * 2];
    memset(scales, 127, sizeof scales);
    float x[2 * 48], y[2 * 3];
    for (size_t i = 0; i < 2 * 48; i++) x[i] = 1.0f;
    mxfp4_weight W = {3, 48, packed, scales, 0};
    matmul_mxfp4(ts->levels[0], &W, x, 2, y);
    int nan = 1;
    for (int i = 0; i < 6; i++) nan &= isnan(y[i]) != 0;
    CHECK(nan, "matmul_mxfp4 with cols 48 must give NaN");
    float wd[3 * 48] = {0};
    dense_weight D = {.dtype = (dense_dtype)7, .rows = 3, .cols = 48, .data = wd};
    matmul_dense(ts->levels[0], &D, x, 2, y);
    nan = 1;
    for (int i = 0; i < 6; i++) nan &= isnan(y[i]) != 0;
    CHECK(nan, "matmul_dense with an unknown dtype must give NaN");
}

static void test_api(tstate *ts) {
    simd_level l = SIMD_SCALAR;
    CHECK(simd_level_parse("auto", &l) == 0 && l == SIMD_AUTO, "parse auto");
    CHECK(simd_level_parse("scalar", &l) == 0 && l == SIMD_SCALAR, "parse scalar");
    CHECK(simd_level_parse("avx2", &l) == 0 && l == SIMD_AVX2, "parse avx2");
    CHECK(simd_level_parse("avx512", &l) == 0 && l == SIMD_AVX512, "parse avx512");
    CHECK(simd_level_parse("AVX2", &l) == -1 && simd_level_parse("", &l) == -1 &&
                  simd_level_parse("avx", &l) == -1 && simd_level_parse(NULL, &l) == -1,
          "parse must refuse anything else");
    const kernels *s = kernels_get(SIMD_SCALAR), *a = kernels_get(SIMD_AUTO);
    CHECK(s && s->level == SIMD_SCALAR && strcmp(s->name, "scalar") == 0, "kernels_get(SCALAR)");
    CHECK(a && a == ts->levels[ts->nlevels - 1], "kernels_get(AUTO) must be the best supported level");
    CHECK(kernels_get((simd_level)42) == NULL, "kernels_get(unknown level) must be NULL");
}

/* SiTU-GLU (common/activations.c: exp and tanh of its own, vectorized by target_clones):
 * the vector clone this CPU runs and the thread split give the bits of the one-element-at-a-
 * time code on random and edge inputs (the tanh series / exp formula boundary at |y| = 1/8,
 * the exp clamps, zeros, tiny and huge values), and every result is within one float ulp of
 * libm's tanh / exp in double (almost all equal). */
static void test_situ(void) {
    enum { N = 100003 };
    float *g = malloc(N * sizeof *g), *u = malloc(N * sizeof *u), *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    if (!g || !u || !a || !b) { CHECK(0, "out of memory"); free(g); free(u); free(a); free(b); return; }
    static const float edge[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-8f, -1e-8f, 0.4999f, 0.5f, 0.5001f, -0.5f, 3.1249f,
                                 3.125f, 3.1251f, -3.125f, 1.0f, -1.0f, 20.0f, -20.0f, 700.0f, -700.0f, 709.0f, -709.0f,
                                 710.0f, -710.0f, 1e30f, -1e30f, 3.4e38f, -3.4e38f, 1e-45f, -1e-45f};
    const size_t ne = sizeof edge / sizeof edge[0];
    uint64_t s = 77;
    for (size_t i = 0; i < N; i++) {
        g[i] = i < ne * ne ? edge[i / ne] : rnd_float(&s);
        u[i] = i < ne * ne ? edge[i % ne] : rnd_float(&s);
    }
    const double beta = 4.0, lbeta = 25.0;
    for (int th = 1; th <= 2; th++) {
        omp_set_num_threads(th);
        for (size_t n = N; n >= 1; n = n > 64 ? n / 3 : n - 1) {
            situ_glu(a, g, u, n, beta, lbeta);
            situ_glu_scalar(b, g, u, n, beta, lbeta);
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) bad += memcmp(&a[i], &b[i], sizeof a[i]) != 0;
            CHECK(bad == 0, "situ_glu n=%zu, %d threads: %zu elements differ from one at a time", n, th, bad);
        }
    }
    size_t off = 0, equal = 0;
    for (size_t i = 0; i < N; i++) {
        double gv = g[i], uv = u[i];
        float ref = (float)(beta * tanh(gv / beta) * (1.0 / (1.0 + exp(-gv))) * (lbeta * tanh(uv / lbeta)));
        equal += memcmp(&ref, &a[i], sizeof ref) == 0;
        double ulp = ldexp(1.0, -23) * fmax(fabs((double)ref), 1e-37);
        if (!(fabs((double)a[i] - (double)ref) <= ulp)) {
            if (off++ < 5) printf("  situ g=%g u=%g: %.9g, libm %.9g\n", gv, uv, a[i], ref);
        }
    }
    CHECK(off == 0, "situ_glu: %zu of %d results more than one float ulp from libm", off, N);
    CHECK(equal >= N - N / 1000, "situ_glu: only %zu of %d results equal libm's", equal, N);
    printf("situ_glu: %zu of %d equal to libm's bits, none more than one ulp off\n", equal, N);
    omp_set_num_threads(omp_get_num_procs());
    free(g); free(u); free(a); free(b);
}

int main(void) {
    tstate ts = {0};
    static const simd_level want[3] = {SIMD_SCALAR, SIMD_AVX2, SIMD_AVX512};
    for (int i = 0; i < 3; i++) {
        const kernels *k = kernels_get(want[i]);
        if (k) {
            ts.levels[ts.nlevels++] = k;
        } else {
            printf("SKIP level %s: not supported by this CPU/build\n", i == 1 ? "avx2" : "avx512");
        }
    }
    if (ts.nlevels == 0 || ts.levels[0]->level != SIMD_SCALAR) {
        printf("FAIL: no scalar kernels\n");
        return 1;
    }
    printf("levels:");
    for (int i = 0; i < ts.nlevels; i++) printf(" %s", ts.levels[i]->name);
    printf("\n");

    test_api(&ts);
    test_e2m1_table();
    test_double_products(&ts);
    test_partition_is_sensitive(&ts);
    test_reduction_order(&ts);
    test_mxfp4_codes(&ts);
    test_mxfp4_nibble_order(&ts);
    test_mxfp4_scale_extremes(&ts);
    test_check_scales();
    test_broken_weight_is_nan(&ts);
    test_dense(&ts, DTYPE_F32);
    test_dense(&ts, DTYPE_BF16);
    test_bf16_extremes(&ts);
    test_bf16_row_variants(&ts);
    test_mxfp4_row_variants(&ts);
    test_mxfp4_sizes(&ts);
    test_threads(&ts);
    test_batches(&ts);
    test_mxfp4_gemm_scales(&ts);
    test_many(&ts);
    test_mxfp4_many(&ts);
    test_mxfp4_list(&ts);
    test_mxfp4_lanes(&ts);
    test_gemm_weights(&ts);
    test_fma_is_exact();
    test_situ();

    if (check_failures) {
        printf("test_kernels: %d of %d checks FAILED\n", check_failures, check_count);
        return 1;
    }
    printf("test_kernels: all %d checks passed (%d levels)\n", check_count, ts.nlevels);
    return 0;
}
