/* kernels.c - the exact compute kernels (contract in kernels.h): the scalar
 * reference dot products, run-time SIMD level selection (kernels_get), the
 * OpenMP matmul drivers for dense F32/BF16 and packed MXFP4 weights, and the
 * MXFP4 scale-byte check used when a checkpoint is validated. */
#include "common/kernels.h"

#include <math.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kernels_impl.h"

const float E2M1_VALUES[16] = {
    0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

/* ---- scalar reference: lane i % 8, sequential in i, tail lanes get +0.0 ---- */

static float dot_f32_scalar(const float *w, const float *x, size_t n) {
    double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (size_t j = 0; j < 8; j++) l[j] += (double)w[i + j] * (double)x[i + j];
    if (i < n)
        for (size_t j = 0; j < 8; j++) l[j] += i + j < n ? (double)w[i + j] * (double)x[i + j] : 0.0;
    return k3_reduce8(l);
}

static float dot_bf16_scalar(const uint16_t *w, const float *x, size_t n) {
    double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (size_t j = 0; j < 8; j++) l[j] += (double)bf16_to_f32(w[i + j]) * (double)x[i + j];
    if (i < n)
        for (size_t j = 0; j < 8; j++)
            l[j] += i + j < n ? (double)bf16_to_f32(w[i + j]) * (double)x[i + j] : 0.0;
    return k3_reduce8(l);
}

/* n % 32 == 0 (one scale byte per 32 elements); the drivers check it. */
static float dot_mxfp4_scalar(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n) {
    double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t b = 0; b < n / 32; b++) {
        double s = k3_mxfp4_scale(scales[b]);
        const uint8_t *p = packed + b * 16;
        const float *xb = x + b * 32;
        for (size_t i = 0; i < 32; i += 2) {
            uint8_t byte = p[i / 2];
            double w0 = (double)E2M1_VALUES[byte & 15] * s; /* even element: low nibble */
            double w1 = (double)E2M1_VALUES[byte >> 4] * s;
            l[i % 8] += w0 * (double)xb[i];
            l[(i + 1) % 8] += w1 * (double)xb[i + 1];
        }
    }
    return k3_reduce8(l);
}

/* code of column c of a lane-layout row (kernels_impl.h: per 128 columns, byte 8l + j / 2 holds
 * column 8j + l, in its high nibble for odd j) */
static inline unsigned mxfp4_lane_code_at(const uint8_t *row, size_t c) {
    const size_t cc = c % K3_MXFP4_LANE_COLS, j = cc / 8, l = cc % 8;
    const uint8_t b = row[(c / K3_MXFP4_LANE_COLS) * 64 + 8 * l + j / 2];
    return j % 2 ? (unsigned)(b >> 4) : b & 15u;
}

/* dot_mxfp4_scalar's operations on a lane-layout row (n % 128 == 0): its bits. Every level's
 * fallback for lane weights the vector kernels do not take (a partial row block, no buffer for x
 * in double, a level without them). */
static float dot_mxfp4_lanes_scalar(const uint8_t *row, const uint8_t *scales, const float *x, size_t n) {
    double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t b = 0; b < n / 32; b++) {
        double s = k3_mxfp4_scale(scales[b]);
        for (size_t i = 0; i < 32; i++) {
            const size_t c = b * 32 + i;
            l[i % 8] += ((double)E2M1_VALUES[mxfp4_lane_code_at(row, c)] * s) * (double)x[c];
        }
    }
    return k3_reduce8(l);
}

/* ---- level selection ---- */

static const kernels KERNELS_SCALAR = {SIMD_SCALAR, "scalar", dot_f32_scalar, dot_bf16_scalar, dot_mxfp4_scalar};
#ifdef K3_HAVE_X86_KERNELS
static const kernels KERNELS_AVX2 = {SIMD_AVX2, "avx2", k3_dot_f32_avx2, k3_dot_bf16_avx2, k3_dot_mxfp4_avx2};
static const kernels KERNELS_AVX512 = {SIMD_AVX512, "avx512", k3_dot_f32_avx512, k3_dot_bf16_avx512,
                                       k3_dot_mxfp4_avx512};
#endif

static int cpu_has(simd_level l) {
#ifdef K3_HAVE_X86_KERNELS
    __builtin_cpu_init();
    switch (l) {
    case SIMD_SCALAR: return 1;
    case SIMD_AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case SIMD_AVX512:
        return cpu_has(SIMD_AVX2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    default: return 0;
    }
#else
    return l == SIMD_SCALAR;
#endif
}

const kernels *kernels_get(simd_level want) {
    if (want == SIMD_AUTO) {
        if (cpu_has(SIMD_AVX512)) want = SIMD_AVX512;
        else if (cpu_has(SIMD_AVX2)) want = SIMD_AVX2;
        else want = SIMD_SCALAR;
    }
    if (!cpu_has(want)) return NULL;
    switch (want) {
    case SIMD_SCALAR: return &KERNELS_SCALAR;
#ifdef K3_HAVE_X86_KERNELS
    case SIMD_AVX2: return &KERNELS_AVX2;
    case SIMD_AVX512: return &KERNELS_AVX512;
#endif
    default: return NULL;
    }
}

int simd_level_parse(const char *s, simd_level *out) {
    static const struct { const char *name; simd_level level; } names[] = {
        {"auto", SIMD_AUTO}, {"scalar", SIMD_SCALAR}, {"avx2", SIMD_AVX2}, {"avx512", SIMD_AVX512}};
    if (!s) return -1;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0) {
            if (out) *out = names[i].level;
            return 0;
        }
    return -1;
}

/* ---- drivers: threads split rows; each (row, token) is one dot of the fixed partition ----
 * From K3_GEMM_MIN_TOK tokens on, at the AVX2 and AVX-512 levels, the multi-token
 * kernels (kernels_gemm_avx2.c, kernels_gemm_avx512.c) do tiles of K3_GEMM_NR rows x
 * all tokens (AVX-512: panels of K3_GEMM_NR_AVX512 rows).
 * Rows go in blocks of K3_ROWBLOCK; for a level with row-block kernels a full block
 * is computed by them (same bits as the single-row dot, checked by the unit test),
 * two tokens at a time where a _x2 kernel exists; otherwise, and for a partial last
 * block, by the level's dot function. A block's weights stay in cache while the
 * tokens are looped over. */

/* The row-block kernels of a level, found by its dot function (a kernels table
 * built elsewhere keeps its own dot functions). NULL where there are none. */
typedef struct {
    k3_rows_f32_fn f32;
    k3_rows_bf16_fn bf16, bf16_x2;
    k3_rows_mxfp4_fn mxfp4, mxfp4_x2;
    k3_rows_mxfp4_xd_fn mxfp4_xd; /* one token, x in double (the driver converts x once per call) */
    k3_rows_mxfp4_xd_fn mxfp4_xdl; /* the same from lane-layout weights (mxfp4_weight.lanes) */
    k3_rows_bf16_xs_fn bf16_xs, bf16_xs16; /* one token, x in double times K3_BF16_XS_SCALE (converted once
                                            * per call); 8 and 16 rows */
    k3_rows_bf16_xsn_fn bf16_xs16n;        /* bf16_xs16 prefetching the thread's next job (NULL: none) */
    int bf16_grab; /* with bf16_xs16n: jobs a grab of a dynamic schedule in its regions (0: the runtime's) */
    int gemm; /* the multi-token kernels may be used (K3_GEMM_MIN_TOK+ tokens): 1 AVX2 + FMA, 2 AVX-512 */
#ifdef K3_HAVE_X86_KERNELS
    k3_gemm_weights gemm_weights; /* gemm 2: this CPU's choice */
#endif
} rowblock_fns;

#ifdef K3_HAVE_X86_KERNELS
int k3_cpu_has_vbmi(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vbmi");
}

/* The one-token kernels of the AVX-512 level for this CPU (each pair gives the same bits;
 * tests/unit/test_kernels.c runs every one against the scalar reference). AMD family 25 (0x19)
 * with AVX-512 is Zen 4 (Zen 3, the family's other cores, has none): there 512-bit shifts,
 * shuffles and FMAs each hold a 256-bit pipe for two cycles, a two-source permute competes with
 * the FMAs, and the one-token kernels are bound by those pipes, not by memory, at 1 thread. So
 * on Zen 4 (seventh session, docs/PERFORMANCE.md): bf16 16-row jobs build the doubles' bytes with
 * vpermi2b (a shift per 32 weights instead of per 8: 1 thread from memory 18.7 -> 24.8 GB/s;
 * needs AVX512-VBMI), MXFP4 looks the weights up with a one-source vpermw (29.5 -> 31.7
 * GFLOP/s). Everywhere else (Intel, Zen 5, where they were measured; on Zen 5 again in the
 * thirteenth session against the byte kernel, the one-source lookup and the lane layout, which
 * were slower there) the shift kernel k3_rows_bf16_xs16_avx512 and vpermi2pd in
 * k3_rows_mxfp4_xd_avx512. Measurement switches:
 * K3_DECODE_BF16=shift|bytes (bytes only with VBMI), K3_DECODE_MXFP4=pd|words. With the byte kernel
 * each 16-row job also prefetches the thread's next job into L2 (k3_rows_bf16_xsb16n_avx512: one
 * sequential stream instead of 16; eighth session: 1 thread from memory 22-24 -> 27.5-28.3 GB/s,
 * the engine's 1-thread decode 14-24 % faster), and a dynamic schedule's grab in those regions is
 * 16 jobs instead of the runtime's 4 (a grab's first job is the one not prefetched; 2 threads);
 * K3_DECODE_BF16_NEXT=0 and K3_DECODE_BF16_CHUNK=N (0: the runtime's) for measurements. */
typedef struct {
    k3_rows_bf16_xs_fn bf16_xs16;
    k3_rows_bf16_xsn_fn bf16_xs16n; /* NULL: no next-job prefetch */
    int bf16_grab;                  /* jobs a grab of a dynamic schedule in those regions (0: the runtime's) */
    k3_rows_mxfp4_xd_fn mxfp4_xd;
    int mxfp4_lanes; /* matmul_mxfp4_lanes_wanted: the lane layout is faster here */
    k3_gemm_weights gemm_weights; /* how the AVX-512 gemm's micro-kernels get their weights */
} cpu_choice;
static cpu_choice choice;
static pthread_once_t choice_once = PTHREAD_ONCE_INIT;
static int cpu_is_amd_family(unsigned family) {
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d) || b != 0x68747541u || d != 0x69746e65u || c != 0x444d4163u) return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0; /* "AuthenticAMD" above */
    unsigned base = (a >> 8) & 0xf, fam = base == 0xf ? base + ((a >> 20) & 0xff) : base;
    return fam == family;
}
static void choice_pick(void) {
    const int vbmi = k3_cpu_has_vbmi(), zen4 = cpu_is_amd_family(0x19);
    const char *e = getenv("K3_DECODE_BF16"), *m = getenv("K3_DECODE_MXFP4");
    int bytes = vbmi && zen4, words = zen4;
    if (e && strcmp(e, "shift") == 0) bytes = 0;
    else if (e && strcmp(e, "bytes") == 0) bytes = vbmi;
    if (m && strcmp(m, "pd") == 0) words = 0;
    else if (m && strcmp(m, "words") == 0) words = 1;
    choice.bf16_xs16 = bytes ? k3_rows_bf16_xsb16_avx512 : k3_rows_bf16_xs16_avx512;
    const char *nx = getenv("K3_DECODE_BF16_NEXT"); /* 0: the byte kernel without the next job's prefetch */
    choice.bf16_xs16n = bytes && !(nx && strcmp(nx, "0") == 0) ? k3_rows_bf16_xsb16n_avx512 : NULL;
    /* with the prefetch a thread's first job of a grab is the one not prefetched: larger grabs
     * (K3_DECODE_BF16_CHUNK, jobs of 16 rows; 0 the runtime schedule's own) */
    const char *ch = getenv("K3_DECODE_BF16_CHUNK");
    choice.bf16_grab = ch ? atoi(ch) : 16;
    if (choice.bf16_grab < 0 || choice.bf16_grab > 1024) choice.bf16_grab = 0;
    choice.mxfp4_xd = words ? k3_rows_mxfp4_xdw_avx512 : k3_rows_mxfp4_xd_avx512;
    /* the lane layout where the one-source lookup runs (Zen 4) and its repack has vpermi2b
     * (K3_MXFP4_LANES overrides it: matmul_mxfp4_lanes_wanted) */
    choice.mxfp4_lanes = words && vbmi;
    /* the gemm widens weights in its micro-kernels on Zen 4 and Zen 5 (AMD family 26, 0x1a), decodes
     * them into doubles once per token block elsewhere (kernels_impl.h; measurement switch
     * K3_GEMM_WEIGHTS=widen|double) */
    const char *gw = getenv("K3_GEMM_WEIGHTS");
    choice.gemm_weights = zen4 || cpu_is_amd_family(0x1a) ? K3_GEMM_WIDEN : K3_GEMM_DOUBLE;
    if (gw && strcmp(gw, "widen") == 0) choice.gemm_weights = K3_GEMM_WIDEN;
    else if (gw && strcmp(gw, "double") == 0) choice.gemm_weights = K3_GEMM_DOUBLE;
}
/* the one-token kernels chosen for this CPU, once */
static const cpu_choice *choice_for_cpu(void) {
    pthread_once(&choice_once, choice_pick);
    return &choice;
}
#endif

static rowblock_fns rowblock_for(const kernels *k) {
    rowblock_fns b;
    memset(&b, 0, sizeof b);
#ifdef K3_HAVE_X86_KERNELS
    /* every CPU with the AVX2 or AVX-512 level has AVX2 + FMA (cpu_has) */
    b.gemm = k->dot_bf16 == k3_dot_bf16_avx512 ? 2 : k->dot_bf16 == k3_dot_bf16_avx2 ? 1 : 0;
    if (b.gemm == 2) b.gemm_weights = choice_for_cpu()->gemm_weights;
    if (k->dot_f32 == k3_dot_f32_avx512) b.f32 = k3_rows_f32_avx512;
    if (k->dot_bf16 == k3_dot_bf16_avx512) {
        b.bf16 = k3_rows_bf16_avx512;
        b.bf16_x2 = k3_rows_bf16_x2_avx512;
        b.bf16_xs = k3_rows_bf16_xs_avx512;
        const cpu_choice *ch = choice_for_cpu();
        b.bf16_xs16 = ch->bf16_xs16;
        b.bf16_xs16n = ch->bf16_xs16n;
        b.bf16_grab = ch->bf16_grab;
    }
    if (k->dot_mxfp4 == k3_dot_mxfp4_avx512) {
        b.mxfp4 = k3_rows_mxfp4_avx512;
        b.mxfp4_x2 = k3_rows_mxfp4_x2_avx512;
        b.mxfp4_xd = choice_for_cpu()->mxfp4_xd;
        b.mxfp4_xdl = k3_rows_mxfp4_xdl_avx512;
    }
    if (k->dot_mxfp4 == k3_dot_mxfp4_avx2) b.mxfp4 = k3_rows_mxfp4_avx2;
    if (k->dot_f32 == k3_dot_f32_avx2) b.f32 = k3_rows_f32_avx2;
    if (k->dot_bf16 == k3_dot_bf16_avx2) b.bf16 = k3_rows_bf16_avx2;
#else
    (void)k;
#endif
    return b;
}

/* o[j] (j < nr) is token t of row r0 + j */
static inline void put_rows(float *y, size_t rows, size_t r0, size_t nr, size_t t, const float *o) {
    memcpy(y + t * rows + r0, o, nr * sizeof *o);
}

/* A weight that breaks its invariant (refused at load, so only a programming error gets here):
 * the output is NaN, which the sampler refuses ("non-finite logit"): no abort, no wrong number. */
static void poison(const char *what, float *y, size_t n) {
    fprintf(stderr, "k3: %s: the output is NaN\n", what);
    for (size_t i = 0; i < n; i++) y[i] = NAN;
}

/* ---- the AVX-512 multi-token kernels' workspace, one per thread ----
 * k3_gemm_*_avx512 work in k3_gemm_ws_doubles_avx512() doubles (a panel's accumulators,
 * activations and weights: 600 KiB, on the stack before 2026-12-01). Each thread keeps one,
 * allocated on its first need (matmul_reserve_gemm makes that engine start, in every thread of
 * the team) and freed at the thread's exit. Without one (out of memory) a panel is computed by
 * row blocks one token at a time: the same bits. */
#ifdef K3_HAVE_X86_KERNELS
static pthread_key_t gws_key;
static int gws_key_ok;
static pthread_once_t gws_once = PTHREAD_ONCE_INIT;
static void gws_key_init(void) { gws_key_ok = pthread_key_create(&gws_key, free) == 0; }

static double *gemm_ws(void) {
    pthread_once(&gws_once, gws_key_init);
    if (!gws_key_ok) return NULL;
    double *p = pthread_getspecific(gws_key);
    if (p) return p;
    const size_t bytes = (k3_gemm_ws_doubles_avx512() * sizeof *p + 63) & ~(size_t)63;
    p = aligned_alloc(64, bytes);
    if (p) memset(p, 0, bytes); /* its pages in now (matmul_reserve_gemm), not in the first prefill */
    if (p && pthread_setspecific(gws_key, p)) {
        free(p);
        p = NULL;
    }
    return p;
}
#if K3_GEMM_NR_AVX512 % K3_ROWBLOCK != 0
#error "an AVX-512 panel must be whole row blocks (the fallback without a workspace)"
#endif
#endif

size_t matmul_gemm_ws_bytes(void) {
#ifdef K3_HAVE_X86_KERNELS
    return (k3_gemm_ws_doubles_avx512() * sizeof(double) + 63) & ~(size_t)63;
#else
    return 0;
#endif
}

/* Job bi of a dense matmul: tile bi (K3_GEMM_NR rows, AVX-512 K3_GEMM_NR_AVX512, x all tokens) when gemm, else row
 * block bi (K3_ROWBLOCK rows, token by token or two at a time). next / next_bytes: the weights of
 * the job this thread computes after this one (NULL: none known), prefetched by a kernel that can. */
static void dense_job(const kernels *k, const rowblock_fns *rb, int gemm, const dense_weight *W, const float *x,
                      const double *xs, size_t ntok, float *y, size_t bi, const void *next, size_t next_bytes) {
    const size_t rows = W->rows, cols = W->cols;
#ifdef K3_HAVE_X86_KERNELS
    if (gemm) {
        const size_t per = rb->gemm == 2 ? K3_GEMM_NR_AVX512 : K3_GEMM_NR;
        const size_t r0 = bi * per, nr = rows - r0 < per ? rows - r0 : per;
        if (rb->gemm == 2) {
            double *ws = gemm_ws();
            if (!ws) { /* no workspace: the panel's row blocks, one token at a time (the same bits) */
                for (size_t b = r0 / K3_ROWBLOCK; b * K3_ROWBLOCK < r0 + nr; b++) dense_job(k, rb, 0, W, x, NULL, ntok, y, b, NULL, 0);
                return;
            }
            if (W->dtype == DTYPE_F32) k3_gemm_f32_avx512(W->data, rows, cols, r0, nr, x, ntok, y, ws, rb->gemm_weights);
            else k3_gemm_bf16_avx512(W->data, rows, cols, r0, nr, x, ntok, y, ws, rb->gemm_weights);
            return;
        }
        if (W->dtype == DTYPE_F32) k3_gemm_f32_avx2(W->data, rows, cols, r0, nr, x, ntok, y);
        else k3_gemm_bf16_avx2(W->data, rows, cols, r0, nr, x, ntok, y);
        return;
    }
#else
    (void)gemm;
#endif
    if (xs) { /* one bf16 token, x scaled in double: jobs of two row blocks (K3_XS_ROWS) */
        const size_t r0 = bi * K3_XS_ROWS, nr = rows - r0 < K3_XS_ROWS ? rows - r0 : K3_XS_ROWS;
        const uint16_t *w = (const uint16_t *)W->data + r0 * cols;
        float o[K3_XS_ROWS];
        size_t j = 0;
        if (nr == K3_XS_ROWS && rb->bf16_xs16n) j = nr, rb->bf16_xs16n(w, xs, cols, o, next, next_bytes);
        else if (nr == K3_XS_ROWS) j = nr, rb->bf16_xs16(w, xs, cols, o);
        else if (nr >= K3_ROWBLOCK) j = K3_ROWBLOCK, rb->bf16_xs(w, xs, cols, o);
        for (; j < nr; j++) o[j] = k->dot_bf16(w + j * cols, x, cols);
        put_rows(y, rows, r0, nr, 0, o);
        return;
    }
    const size_t r0 = bi * K3_ROWBLOCK, nr = rows - r0 < K3_ROWBLOCK ? rows - r0 : K3_ROWBLOCK;
    if (W->dtype == DTYPE_F32) {
        const float *w = (const float *)W->data + r0 * cols;
        for (size_t t = 0; t < ntok; t++) {
            float o[K3_ROWBLOCK];
            if (rb->f32 && nr == K3_ROWBLOCK) rb->f32(w, x + t * cols, cols, o);
            else
                for (size_t j = 0; j < nr; j++) o[j] = k->dot_f32(w + j * cols, x + t * cols, cols);
            put_rows(y, rows, r0, nr, t, o);
        }
    } else {
        const uint16_t *w = (const uint16_t *)W->data + r0 * cols;
        size_t t = 0;
        float o[2 * K3_ROWBLOCK];
        if (rb->bf16_x2 && nr == K3_ROWBLOCK)
            for (; t + 2 <= ntok; t += 2) {
                rb->bf16_x2(w, x + t * cols, cols, o);
                put_rows(y, rows, r0, nr, t, o);
                put_rows(y, rows, r0, nr, t + 1, o + K3_ROWBLOCK);
            }
        for (; t < ntok; t++) {
            if (rb->bf16 && nr == K3_ROWBLOCK) rb->bf16(w, x + t * cols, cols, o);
            else
                for (size_t j = 0; j < nr; j++) o[j] = k->dot_bf16(w + j * cols, x + t * cols, cols);
            put_rows(y, rows, r0, nr, t, o);
        }
    }
}

/* the multi-token kernels take this matmul */
static int dense_gemm(const rowblock_fns *rb, const dense_weight *W, size_t ntok) {
    return rb->gemm && ntok >= K3_GEMM_MIN_TOK && (W->dtype == DTYPE_F32 || W->dtype == DTYPE_BF16);
}

static size_t dense_jobs(const rowblock_fns *rb, const dense_weight *W, int gemm) {
    const size_t per = !gemm ? K3_ROWBLOCK : rb->gemm == 2 ? K3_GEMM_NR_AVX512 : K3_GEMM_NR;
    return (W->rows + per - 1) / per;
}

void matmul_dense(const kernels *k, const dense_weight *W, const float *x, size_t ntok, float *y) {
    matmul_dense_many(k, W, &x, ntok, &y, 1);
}

static double *xd_get(size_t n);

/* The first matrix j < i taking its x in double (one[j]) with the same x and length as i, or i. */
static size_t first_same_x(const float *const *x, const size_t *len, const int *one, size_t i) {
    for (size_t j = 0; j < i; j++)
        if (one[j] && x[j] == x[i] && len[j] == len[i]) return j;
    return i;
}

/* xd[i] = x[i] (len[i] values: the width, times the tokens for a lane-layout MXFP4 matrix of
 * two or three) in double times scale (a power of two: exact) for each i < n
 * with one[i], each distinct (x, length) converted once, in the calling thread's buffer
 * (matmul_reserve_x); NULL elsewhere, and everywhere when there is no buffer (then the float
 * kernels run: the same bits). */
static void x_in_double(size_t n, const float *const *x, const size_t *len, const int *one, double scale,
                        const double **xd) {
    size_t need = 0;
    for (size_t i = 0; i < n; i++) {
        xd[i] = NULL;
        if (one[i] && first_same_x(x, len, one, i) == i) need += len[i];
    }
    double *buf = need ? xd_get(need) : NULL;
    for (size_t i = 0, used = 0; buf && i < n; i++) {
        if (!one[i]) continue;
        size_t j = first_same_x(x, len, one, i);
        if (j < i) { xd[i] = xd[j]; continue; }
        double *d = buf + used;
        for (size_t c = 0; c < len[i]; c++) d[c] = (double)x[i][c] * scale;
        xd[i] = d;
        used += len[i];
    }
}

/* The runtime schedule of a region (kind without the monotonic modifier, chunk). */
typedef struct {
    omp_sched_t kind;
    int chunk;
} job_order;
/* Whether job j + 1 (< total) is the one the calling thread computes after job j: alone in the
 * team, or inside the same chunk (dynamic, or static with a chunk: chunks of `chunk` jobs from
 * job 0), or inside its own range (static without a chunk: libgomp's ranges, the first
 * total % nth threads one job more). Only a prefetch hint depends on it: a wrong guess costs a
 * useless prefetch, never a result. */
static int next_is_mine(const job_order *o, size_t j, size_t total) {
    if (j + 1 >= total) return 0;
    const size_t nth = (size_t)omp_get_num_threads();
    if (nth == 1) return 1;
    if ((o->kind == omp_sched_dynamic || o->kind == omp_sched_static) && o->chunk > 0)
        return (j + 1) % (size_t)o->chunk != 0;
    if (o->kind == omp_sched_static) {
        const size_t tid = (size_t)omp_get_thread_num(), q = total / nth, r = total % nth;
        return j + 1 < (tid < r ? (q + 1) * (tid + 1) : q * (tid + 1) + r);
    }
    return 0;
}

void matmul_dense_many(const kernels *k, const dense_weight *W, const float *const *x, size_t ntok, float *const *y,
                       size_t n) {
    if (n > K3_MATMUL_MANY_MAX) {
        matmul_dense_many(k, W, x, ntok, y, K3_MATMUL_MANY_MAX);
        matmul_dense_many(k, W + K3_MATMUL_MANY_MAX, x + K3_MATMUL_MANY_MAX, ntok, y + K3_MATMUL_MANY_MAX,
                          n - K3_MATMUL_MANY_MAX);
        return;
    }
    const rowblock_fns rb = rowblock_for(k);
    size_t first[K3_MATMUL_MANY_MAX + 1];
    int gemm[K3_MATMUL_MANY_MAX] = {0};
    int ok[K3_MATMUL_MANY_MAX] = {0};  /* a dtype the kernels know (else its output is poisoned) */
    int one[K3_MATMUL_MANY_MAX] = {0}; /* a one-token bf16 matrix: x in double, scaled */
    size_t cols[K3_MATMUL_MANY_MAX] = {0};
    for (size_t i = 0; i < n; i++) {
        ok[i] = W[i].dtype == DTYPE_F32 || W[i].dtype == DTYPE_BF16;
        if (!ok[i]) {
            char what[64];
            snprintf(what, sizeof what, "matmul_dense: unknown weight dtype %d", (int)W[i].dtype);
            poison(what, y[i], W[i].rows * ntok);
            continue;
        }
        gemm[i] = dense_gemm(&rb, &W[i], ntok);
        one[i] = rb.bf16_xs && ntok == 1 && !gemm[i] && W[i].dtype == DTYPE_BF16 && W[i].rows >= K3_ROWBLOCK;
        cols[i] = W[i].cols;
    }
    /* one-token bf16 matrices: x in double times K3_BF16_XS_SCALE, converted once here for all
     * their row blocks (each distinct x once, in the thread's matmul_reserve_x buffer; without
     * one the float kernels run: the same bits), in jobs of K3_XS_ROWS rows */
    const double *xs[K3_MATMUL_MANY_MAX];
    x_in_double(n, x, cols, one, K3_BF16_XS_SCALE, xs);
    first[0] = 0;
    for (size_t i = 0; i < n; i++)
        first[i + 1] = first[i] + (xs[i] ? (W[i].rows + K3_XS_ROWS - 1) / K3_XS_ROWS : ok[i] ? dense_jobs(&rb, &W[i], gemm[i]) : 0);
    const size_t total = first[n];
    /* the one-token bf16 kernel may prefetch the job this thread computes next: with it, a dynamic
     * schedule's grab is made larger for this region (restored after it) */
    omp_sched_t kind0;
    int chunk0;
    omp_get_schedule(&kind0, &chunk0);
    job_order ord = {(omp_sched_t)((unsigned)kind0 & 0x7fffffffu), chunk0}; /* without the monotonic modifier */
    int grab = 0;
    if (rb.bf16_xs16n && ord.kind == omp_sched_dynamic && rb.bf16_grab > ord.chunk)
        for (size_t i = 0; i < n && !grab; i++)
            if (xs[i]) grab = 1, ord.chunk = rb.bf16_grab;
    if (grab) omp_set_schedule(kind0, ord.chunk);
    /* one region for all n matmuls: each job finds its matrix (n is a handful) */
#pragma omp parallel for schedule(runtime)
    for (size_t j = 0; j < total; j++) {
        size_t i = 0;
        while (j >= first[i + 1]) i++;
        const void *next = NULL;
        size_t next_bytes = 0;
        if (rb.bf16_xs16n && xs[i] && next_is_mine(&ord, j, total)) {
            size_t i2 = i;
            while (j + 1 >= first[i2 + 1]) i2++;
            if (xs[i2]) { /* the next job's 16 rows (or fewer at the matrix's end), contiguous */
                const size_t r0 = (j + 1 - first[i2]) * K3_XS_ROWS, c2 = W[i2].cols;
                const size_t nr = W[i2].rows - r0 < K3_XS_ROWS ? W[i2].rows - r0 : K3_XS_ROWS;
                next = (const uint16_t *)W[i2].data + r0 * c2;
                next_bytes = nr * c2 * sizeof(uint16_t);
            }
        }
        dense_job(k, &rb, gemm[i], &W[i], x[i], xs[i], ntok, y[i], j - first[i], next, next_bytes);
    }
    if (grab) omp_set_schedule(kind0, chunk0);
}

/* Job bi of an MXFP4 matmul: tile bi (K3_GEMM_NR rows, AVX-512 K3_GEMM_NR_AVX512, x all tokens) when gemm, else row
 * block bi (K3_ROWBLOCK rows, two tokens at a time where a _x2 kernel exists; one token
 * from xd, x in double, when the driver converted it). A lane-layout weight (W->lanes, cols %
 * 128 == 0) gets gemm only at the AVX-512 level (its lane panels), its row blocks the lane kernel
 * token by token from xd (ntok tokens of cols doubles), or the scalar lane dot without xd. */
static void mxfp4_job(const kernels *k, const rowblock_fns *rb, int gemm, const mxfp4_weight *W, const float *x,
                      const double *xd, size_t ntok, float *y, size_t bi) {
    const size_t rows = W->rows, cols = W->cols;
#ifdef K3_HAVE_X86_KERNELS
    if (gemm) {
        const size_t per = rb->gemm == 2 ? K3_GEMM_NR_AVX512 : K3_GEMM_NR;
        const size_t r0 = bi * per, nr = rows - r0 < per ? rows - r0 : per;
        if (rb->gemm == 2) {
            double *ws = gemm_ws();
            if (!ws) { /* no workspace: the panel's row blocks (the same bits) */
                for (size_t b = r0 / K3_ROWBLOCK; b * K3_ROWBLOCK < r0 + nr; b++) mxfp4_job(k, rb, 0, W, x, NULL, ntok, y, b);
                return;
            }
            (W->lanes ? k3_gemm_mxfp4l_avx512 : k3_gemm_mxfp4_avx512)(W->packed, W->scales, rows, cols, r0, nr, x, ntok,
                                                                      y, ws, rb->gemm_weights);
            return;
        }
        k3_gemm_mxfp4_avx2(W->packed, W->scales, rows, cols, r0, nr, x, ntok, y); /* never lanes: the list says */
        return;
    }
#else
    (void)gemm;
#endif
    const size_t r0 = bi * K3_ROWBLOCK, nr = rows - r0 < K3_ROWBLOCK ? rows - r0 : K3_ROWBLOCK;
    const uint8_t *p = W->packed + r0 * (cols / 2), *s = W->scales + r0 * (cols / 32);
    size_t t = 0;
    float o[2 * K3_ROWBLOCK];
    if (W->lanes) { /* 1-3 tokens from xd by the lane kernel, token by token; else the scalar lane dot */
        for (; t < ntok; t++) {
            if (xd && rb->mxfp4_xdl && nr == K3_ROWBLOCK) rb->mxfp4_xdl(p, s, xd + t * cols, cols, o);
            else
                for (size_t j = 0; j < nr; j++)
                    o[j] = dot_mxfp4_lanes_scalar(p + j * (cols / 2), s + j * (cols / 32), x + t * cols, cols);
            put_rows(y, rows, r0, nr, t, o);
        }
        return;
    }
    if (xd && nr == K3_ROWBLOCK) { /* ntok == 1 */
        rb->mxfp4_xd(p, s, xd, cols, o);
        put_rows(y, rows, r0, nr, 0, o);
        return;
    }
    if (rb->mxfp4_x2 && nr == K3_ROWBLOCK)
        for (; t + 2 <= ntok; t += 2) {
            rb->mxfp4_x2(p, s, x + t * cols, cols, o);
            put_rows(y, rows, r0, nr, t, o);
            put_rows(y, rows, r0, nr, t + 1, o + K3_ROWBLOCK);
        }
    for (; t < ntok; t++) {
        if (rb->mxfp4 && nr == K3_ROWBLOCK) rb->mxfp4(p, s, x + t * cols, cols, o);
        else
            for (size_t j = 0; j < nr; j++) o[j] = k->dot_mxfp4(p + j * (cols / 2), s + j * (cols / 32), x + t * cols, cols);
        put_rows(y, rows, r0, nr, t, o);
    }
}

/* The calling thread's buffer for the one-token inputs of an MXFP4 call converted to
 * double (matmul_reserve_x). Kept for the thread's life; freed at its exit. */
static pthread_key_t xd_key;
static int xd_key_ok;
static pthread_once_t xd_once = PTHREAD_ONCE_INIT;
typedef struct { double *p; size_t cap; } xd_buf;
static void xd_free(void *v) {
    xd_buf *b = v;
    if (b) free(b->p);
    free(b);
}
static void xd_key_init(void) {
    xd_key_ok = pthread_key_create(&xd_key, xd_free) == 0;
}

/* The calling thread's buffer of at least n doubles, or NULL (then the float kernels run:
 * the same bits). Allocates only when it grows. */
static double *xd_get(size_t n) {
    pthread_once(&xd_once, xd_key_init);
    if (!xd_key_ok) return NULL;
    xd_buf *b = pthread_getspecific(xd_key);
    if (b && b->cap >= n) return b->p;
    if (!b) {
        if (!(b = calloc(1, sizeof *b))) return NULL;
        if (pthread_setspecific(xd_key, b)) { free(b); return NULL; }
    }
    double *q = aligned_alloc(64, (n * sizeof *q + 63) & ~(size_t)63);
    if (!q) return NULL;
    free(b->p);
    b->p = q;
    b->cap = n;
    return q;
}

int matmul_reserve_x(size_t n) { return n == 0 || xd_get(n) ? 0 : -1; }

int matmul_reserve_gemm(const kernels *k, int nthreads) {
    int bad = 0;
#ifdef K3_HAVE_X86_KERNELS
    if (rowblock_for(k).gemm != 2) return 0;
    if (nthreads < 1) nthreads = 1;
#pragma omp parallel num_threads(nthreads) reduction(| : bad)
    bad |= gemm_ws() == NULL;
#else
    (void)k;
    (void)nthreads;
#endif
    return bad ? -1 : 0;
}

void matmul_mxfp4(const kernels *k, const mxfp4_weight *W, const float *x, size_t ntok, float *y) {
    matmul_mxfp4_list(k, W, &x, &ntok, &y, 1);
}

void matmul_mxfp4_many(const kernels *k, const mxfp4_weight *W, const float *const *x, size_t ntok, float *const *y,
                       size_t n) {
    size_t nt[K3_MATMUL_LIST_MAX];
    while (n > 0) {
        size_t m = n < K3_MATMUL_LIST_MAX ? n : K3_MATMUL_LIST_MAX;
        for (size_t i = 0; i < m; i++) nt[i] = ntok;
        matmul_mxfp4_list(k, W, x, nt, y, m);
        W += m, x += m, y += m, n -= m;
    }
}

/* job j of a list: the matrix it falls in, then its row block or tile there */
static inline void mxfp4_list_job(const kernels *k, const rowblock_fns *rb, const mxfp4_weight *W,
                                  const float *const *x, const double *const *xd, const size_t *ntok, float *const *y,
                                  const size_t *first, const int *gemm, size_t j) {
    size_t i = 0;
    while (j >= first[i + 1]) i++;
    mxfp4_job(k, rb, gemm[i], &W[i], x[i], xd[i], ntok[i], y[i], j - first[i]);
}

/* The first one-token matrix (one[j]) before i with the same x and width, or i. */
void matmul_mxfp4_list(const kernels *k, const mxfp4_weight *W, const float *const *x, const size_t *ntok,
                       float *const *y, size_t n) {
    if (n > K3_MATMUL_LIST_MAX) {
        matmul_mxfp4_list(k, W, x, ntok, y, K3_MATMUL_LIST_MAX);
        matmul_mxfp4_list(k, W + K3_MATMUL_LIST_MAX, x + K3_MATMUL_LIST_MAX, ntok + K3_MATMUL_LIST_MAX,
                          y + K3_MATMUL_LIST_MAX, n - K3_MATMUL_LIST_MAX);
        return;
    }
    const rowblock_fns rb = rowblock_for(k);
    size_t first[K3_MATMUL_LIST_MAX + 1];
    int gemm[K3_MATMUL_LIST_MAX];
    const double *xd[K3_MATMUL_LIST_MAX];
    int one[K3_MATMUL_LIST_MAX] = {0}; /* matrix i takes its x in double */
    first[0] = 0;
    for (size_t i = 0; i < n; i++) {
#ifdef K3_HAVE_X86_KERNELS
        gemm[i] = rb.gemm && ntok[i] >= K3_GEMM_MIN_TOK;
#else
        gemm[i] = 0;
#endif
        one[i] = 0;
        const size_t need = W[i].lanes ? K3_MXFP4_LANE_COLS : 32;
        if (W[i].cols % need != 0) { /* refused at load time (config_parse: expert widths % 32); lanes: never made */
            char what[96];
            snprintf(what, sizeof what, "matmul_mxfp4: cols %zu is not a multiple of %zu%s", W[i].cols, need,
                     W[i].lanes ? " (lane layout)" : "");
            poison(what, y[i], W[i].rows * ntok[i]);
            first[i + 1] = first[i];
            continue;
        }
        if (W[i].lanes && rb.gemm != 2) gemm[i] = 0; /* only the AVX-512 panels read the lane layout */
        const size_t per = !gemm[i] ? K3_ROWBLOCK : rb.gemm == 2 ? K3_GEMM_NR_AVX512 : K3_GEMM_NR;
        first[i + 1] = first[i] + (W[i].rows + per - 1) / per;
        /* lane layout: two or three tokens too, one at a time by the lane kernel (release: the
         * float _x2 kernel, each weight decoded once for two, which measured as fast as two
         * one-token passes on Zen 4: docs/PERFORMANCE.md "Eleventh session") */
        one[i] = rb.mxfp4_xd && W[i].rows >= K3_ROWBLOCK && (ntok[i] == 1 || (W[i].lanes && !gemm[i]));
    }
    /* x of the one-token matrices in double, converted once here instead of once per row block
     * (each distinct x once: what matmul_reserve_x reserves for a decode step) */
    size_t len[K3_MATMUL_LIST_MAX] = {0};
    for (size_t i = 0; i < n; i++) len[i] = W[i].cols * ntok[i];
    x_in_double(n, x, len, one, 1.0, xd);
    const size_t total = first[n];
    /* one region for all n matmuls: each job finds its matrix. A dynamic schedule runs as guided
     * (the same smallest chunk): a thread's first chunks are long runs of consecutive row blocks,
     * whose next block the one-token kernels prefetch (16 rw6 experts, 2 threads, best of 20
     * calls in four rounds: dynamic,4 38.8-43.1 GFLOP/s, guided,4 43.7-45.4). With a multi-token
     * (gemm) job in the list, plain dynamic one panel at a time instead: a prefill's experts have
     * unequal token counts, so equal runs of jobs are unequal work, and guided's first chunk (half
     * the jobs) left the other thread idle at the end (rw6, 264 ids, chunk 64, 2 threads: the
     * experts' phase at 74-76 % of two threads' CPU time, the other phases 85-97 %) */
    omp_sched_t kind;
    int chunk;
    omp_get_schedule(&kind, &chunk);
    if (chunk < 1) chunk = 1;
    int any_gemm = 0;
    for (size_t i = 0; i < n; i++) any_gemm |= gemm[i];
    if (((unsigned)kind & ~(unsigned)omp_sched_monotonic) == (unsigned)omp_sched_dynamic && any_gemm) {
#pragma omp parallel for schedule(dynamic, 1)
        for (size_t j = 0; j < total; j++) mxfp4_list_job(k, &rb, W, x, xd, ntok, y, first, gemm, j);
    } else if (((unsigned)kind & ~(unsigned)omp_sched_monotonic) == (unsigned)omp_sched_dynamic) {
#pragma omp parallel for schedule(guided, chunk)
        for (size_t j = 0; j < total; j++) mxfp4_list_job(k, &rb, W, x, xd, ntok, y, first, gemm, j);
    } else {
#pragma omp parallel for schedule(runtime)
        for (size_t j = 0; j < total; j++) mxfp4_list_job(k, &rb, W, x, xd, ntok, y, first, gemm, j);
    }
}

/* code of column c of a release-layout row (byte c / 2, low nibble for even c) */
static inline unsigned mxfp4_code_at(const uint8_t *row, size_t c) { return c % 2 ? row[c / 2] >> 4 : row[c / 2] & 15u; }

void k3_mxfp4_to_lanes(const uint8_t *src, uint8_t *dst, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *row = src + r * (cols / 2);
        for (size_t q = 0; q < cols / K3_MXFP4_LANE_COLS; q++) {
            uint64_t w[8] = {0};
            for (size_t l = 0; l < 8; l++)
                for (size_t j = 0; j < 16; j++) w[l] |= (uint64_t)mxfp4_code_at(row, q * K3_MXFP4_LANE_COLS + 8 * j + l) << (4 * j);
            memcpy(dst + r * (cols / 2) + q * 64, w, sizeof w);
        }
    }
}

void k3_mxfp4_from_lanes(const uint8_t *src, uint8_t *dst, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; r++) {
        uint8_t *row = dst + r * (cols / 2);
        for (size_t q = 0; q < cols / K3_MXFP4_LANE_COLS; q++) {
            uint64_t w[8];
            memcpy(w, src + r * (cols / 2) + q * 64, sizeof w);
            for (size_t l = 0; l < 8; l++)
                for (size_t j = 0; j < 16; j++) {
                    const size_t c = q * K3_MXFP4_LANE_COLS + 8 * j + l;
                    const unsigned code = (unsigned)(w[l] >> (4 * j)) & 15u;
                    row[c / 2] = (uint8_t)(c % 2 ? (row[c / 2] & 0x0f) | (code << 4) : (row[c / 2] & 0xf0) | code);
                }
        }
    }
}

int matmul_mxfp4_lanes_wanted(const kernels *k, size_t cols) {
    if (!k || cols % K3_MXFP4_LANE_COLS != 0) return 0;
    /* K3_MXFP4_LANES=0: never; =1: at every level (tests: other levels run the scalar lane dot) */
    const char *ln = getenv("K3_MXFP4_LANES");
    if (ln && strcmp(ln, "0") == 0) return 0;
    if (ln && strcmp(ln, "1") == 0) return 1;
#ifdef K3_HAVE_X86_KERNELS
    return k->dot_mxfp4 == k3_dot_mxfp4_avx512 && choice_for_cpu()->mxfp4_lanes;
#else
    return 0;
#endif
}

const char *kernels_choice_text(const kernels *k, char *buf, size_t n) {
    if (!buf || n == 0) return buf;
    snprintf(buf, n, "none");
#ifdef K3_HAVE_X86_KERNELS
    if (k && k->dot_bf16 == k3_dot_bf16_avx512) {
        const cpu_choice *c = choice_for_cpu();
        snprintf(buf, n, "bf16=%s mxfp4=%s lanes=%d gemm=%s", c->bf16_xs16 == k3_rows_bf16_xsb16_avx512 ? "bytes" : "shift",
                 c->mxfp4_xd == k3_rows_mxfp4_xdw_avx512 ? "words" : "pd",
                 matmul_mxfp4_lanes_wanted(k, K3_MXFP4_LANE_COLS), /* for widths of whole lane groups */
                 c->gemm_weights == K3_GEMM_WIDEN ? "widen" : "double");
    }
#else
    (void)k;
#endif
    return buf;
}

void mxfp4_repack_lanes(uint8_t *packed, size_t rows, size_t cols) {
    const size_t n64 = rows * (cols / K3_MXFP4_LANE_COLS); /* a row is cols / 128 groups of 64 bytes */
#ifdef K3_HAVE_X86_KERNELS
    if (cpu_has(SIMD_AVX512) && k3_cpu_has_vbmi()) {
        k3_mxfp4_to_lanes_vbmi(packed, n64);
        return;
    }
#endif
    for (size_t g = 0; g < n64; g++) {
        uint8_t t[64];
        k3_mxfp4_to_lanes(packed + 64 * g, t, 1, K3_MXFP4_LANE_COLS);
        memcpy(packed + 64 * g, t, sizeof t);
    }
}

int mxfp4_check_scales(const mxfp4_weight *W, size_t *bad_row) {
    const size_t per_row = W->cols / 32;
    for (size_t r = 0; r < W->rows; r++) {
        const uint8_t *s = W->scales + r * per_row;
        if (memchr(s, 255, per_row)) {
            if (bad_row) *bad_row = r;
            return -1;
        }
    }
    return 0;
}
