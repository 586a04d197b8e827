/* overlap.c - the shared expert's bf16 rows in the routed experts' MXFP4 regions (ninth session,
 * Zen 4), outside the build.
 *   cc -O2 -fopenmp -ffp-contract=off -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx512vbmi -mavx2 -mfma -I. \
 *      bench/decode_zen4/overlap.c build/libk3.a -lm -o /tmp/d4_overlap
 *   OMP_WAIT_POLICY=passive flock /work/bench.lock /tmp/d4_overlap [reps [first thread count: 1, 2]]
 * One decode token of one rw6 MoE layer: the shared experts (2 x 3072 -> gate, up 6144 x 7168,
 * down 7168 x 6144, bf16) and 16 routed experts of 48 (w1, w3 3072 x 3584, w2 3584 x 3072, MXFP4),
 * every call a new rotation of weights (THP buffers, from memory: 4 shared copies, 48 experts).
 *   A  = the library: matmul_dense_many(gate, up), matmul_dense(down) (the engine's mlp_forward)
 *   B  = the library: matmul_mxfp4_list(16 w1 + 16 w3), matmul_mxfp4_list(16 w2) (expert_batch.c)
 *   C* = both in one region per stage (gate+up with w1+w3, down with w2): the same kernels on the
 *        same rows (k3_rows_bf16_xsb16[n]_avx512 16-row jobs, k3_rows_mxfp4_xdw_avx512 8-row jobs),
 *        grouped in "super-jobs" of one bf16 job and its share (~16) of MXFP4 jobs:
 *     Cn: the bf16 job first (no next-job prefetch), then its MXFP4 jobs; dynamic,1
 *     Cp: the MXFP4 jobs first, each preceded by prefetches (L2) of 1/m of the super-job's bf16
 *         rows, then the bf16 job from L2; dynamic,1
 *     Cs: static contiguous ranges of super-jobs, the bf16 job first prefetching the thread's next
 *         super-job's bf16 rows (xsb16n, as the engine's bf16 driver), then the MXFP4 jobs
 *     Cv: as Cp, the prefetches spread inside the MXFP4 kernel's block loop (a copy of the kernel, mxw8_side)
 *     Cq: no super-jobs: thread 0 the bf16 jobs first, the others the MXFP4 jobs first (run_cq)
 * OV_VARIANTS=0156 runs only those (A and B always). Variants alternate call by call (the order rotates); best and median ms per token-layer of each,
 * A+B as the sum of the same round's A and B. Every C output is compared with A's and B's bits.
 * The engine's runtime schedule is set (dynamic,4, as bin/k3 without a NUMA binding). OV_DEBUG=1 prints
 * Cq's per-thread split.
 * Measured (ninth session, 2026-12-02 03:20-03:30 UTC, 2-vCPU EPYC Zen 4 VM, load average 1.0-2.5 from
 * these runs and the host, OMP_WAIT_POLICY=passive; ms per token-layer, best / median; "paired" = the
 * median of each round's C / (A + B)):
 *   2 threads, 61 rounds, x2 holds:    A 5.9-7.8 / 8.7-8.8   B 17.0-17.6 / 20.8-20.9   A+B 25.4-26.2 / 29.5-29.7
 *     Cq 24.0-24.6 / 27.9-28.1 (paired 0.954-0.960)   Cv 23.0-23.4 / 27.4-27.4 (paired 0.930-0.949,
 *     below A+B in 49 and 55 of 61 rounds)
 *   2 threads, 41 rounds, x2: Cn 0.979-0.993, Cp 1.008-1.031, Cs 0.980-0.982, Cq 0.968-0.978, Cv 0.950-0.972
 *   1 thread, 61 rounds, x2: A+B 43.0-45.3 / 46.8-52.2; Cq and Cv paired 1.03-1.06 (slower: one core is
 *     compute-bound on both kernels)
 * Every C output bit-identical to A's and B's. So at 2 threads the overlap saves ~2 ms of ~27 a MoE
 * layer (5-7 %), not the ~5 ms the memory-bound shared expert suggested: a core streaming bf16 while
 * the other runs MXFP4 gets ~22 GB/s, not its 27 alone (Cq, OV_DEBUG), and the best overlap (Cv)
 * needs a prefetching copy of the MXFP4 kernel. */
#include "bench/decode_zen4/bench_util.h"
#include "common/kernels.h"

enum { E = 7168, ISH = 6144, L = 3584, I = 3072, NE = 48, K = 16, NSH = 4 };

typedef struct { uint16_t *gate, *up, *down; } shared_w;
typedef struct { mxfp4_weight w1, w3, w2; } expert_w;

static void fill_bf16(uint16_t *w, size_t n, uint64_t seed) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        uint64_t s = seed + i * 0x9e3779b97f4a7c15ull;
        uint64_t r = rng(&s);
        /* sign, exponent 118..133, 7 mantissa bits: finite */
        w[i] = (uint16_t)(((r & 1) << 15) | ((118 + ((r >> 1) & 15)) << 7) | ((r >> 8) & 127));
    }
}
static void fill_mx(mxfp4_weight *m, size_t rows, size_t cols, uint64_t seed) {
    const size_t pb = rows * cols / 2, sb = rows * cols / 32;
    uint8_t *p = weight_mem_alloc(pb + sb);
    if (!p) abort();
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < pb + sb; i++) {
        uint64_t s = seed + i * 0x9e3779b97f4a7c15ull;
        uint64_t r = rng(&s);
        p[i] = i < pb ? (uint8_t)r : (uint8_t)(118 + (r & 15));
    }
    *m = (mxfp4_weight){rows, cols, p, p + pb};
}

/* a stage of C: bf16 matrices (one-token, 16-row jobs) and MXFP4 matrices (one-token, 8-row jobs) */
typedef struct {
    size_t nd, nm;
    const uint16_t *dw[2];
    size_t drows[2], dcols;
    const double *xs; /* the bf16 x, scaled by K3_BF16_XS_SCALE */
    float *dy[2];
    const mxfp4_weight *mw[2 * K];
    const double *mxd[2 * K];
    float *my[2 * K];
    size_t dfirst[3], mfirst[2 * K + 1];
    size_t djobs, mjobs;
} stage;

static void stage_init(stage *s) {
    s->dfirst[0] = 0;
    for (size_t i = 0; i < s->nd; i++) s->dfirst[i + 1] = s->dfirst[i] + s->drows[i] / K3_XS_ROWS;
    s->djobs = s->dfirst[s->nd];
    s->mfirst[0] = 0;
    for (size_t i = 0; i < s->nm; i++) s->mfirst[i + 1] = s->mfirst[i] + s->mw[i]->rows / K3_ROWBLOCK;
    s->mjobs = s->mfirst[s->nm];
}
static inline const uint16_t *djob_rows(const stage *s, size_t j, size_t *i) {
    size_t m = 0;
    while (j >= s->dfirst[m + 1]) m++;
    *i = m;
    return s->dw[m] + (j - s->dfirst[m]) * K3_XS_ROWS * s->dcols;
}
static inline void djob(const stage *s, size_t j, const void *next, size_t next_bytes) {
    size_t m;
    const uint16_t *w = djob_rows(s, j, &m);
    float *o = s->dy[m] + (j - s->dfirst[m]) * K3_XS_ROWS;
    if (next) k3_rows_bf16_xsb16n_avx512(w, s->xs, s->dcols, o, next, next_bytes);
    else k3_rows_bf16_xsb16_avx512(w, s->xs, s->dcols, o);
}
static inline void mjob(const stage *s, size_t j) {
    size_t m = 0;
    while (j >= s->mfirst[m + 1]) m++;
    const mxfp4_weight *W = s->mw[m];
    const size_t r0 = (j - s->mfirst[m]) * K3_ROWBLOCK;
    k3_rows_mxfp4_xdw_avx512(W->packed + r0 * (W->cols / 2), W->scales + r0 * (W->cols / 32), s->mxd[m], W->cols,
                             s->my[m] + r0);
}
/* super-job q: bf16 job q and MXFP4 jobs [q mjobs / djobs, (q + 1) mjobs / djobs) */
static inline size_t mlo(const stage *s, size_t q) { return q * s->mjobs / s->djobs; }

static void run_cn(const stage *s) {
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t q = 0; q < s->djobs; q++) {
        djob(s, q, NULL, 0);
        for (size_t j = mlo(s, q); j < mlo(s, q + 1); j++) mjob(s, j);
    }
}
static void run_cp(const stage *s) {
    const size_t bytes = K3_XS_ROWS * s->dcols * sizeof(uint16_t);
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t q = 0; q < s->djobs; q++) {
        size_t m;
        const char *w = (const char *)djob_rows(s, q, &m);
        const size_t a = mlo(s, q), b = mlo(s, q + 1), n = b - a ? b - a : 1;
        const size_t step = ((bytes + n - 1) / n + 63) & ~(size_t)63;
        size_t done = 0;
        for (size_t j = a; j < b; j++) {
            for (size_t o = 0; o < step && done < bytes; o += 64, done += 64) _mm_prefetch(w + done, _MM_HINT_T1);
            mjob(s, j);
        }
        djob(s, q, NULL, 0);
    }
}
static void run_cs(const stage *s) {
    const size_t bytes = K3_XS_ROWS * s->dcols * sizeof(uint16_t);
#pragma omp parallel
    {
        const size_t nth = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
        const size_t q0 = t * s->djobs / nth, q1 = (t + 1) * s->djobs / nth;
        for (size_t q = q0; q < q1; q++) {
            size_t m;
            const void *next = q + 1 < q1 ? djob_rows(s, q + 1, &m) : NULL;
            djob(s, q, next, bytes);
            for (size_t j = mlo(s, q); j < mlo(s, q + 1); j++) mjob(s, j);
        }
    }
}

/* Cq: shared counters; thread 0 takes bf16 jobs (8 a grab, each prefetching the next of its grab) while
 * any are left, then MXFP4 jobs; the other threads MXFP4 jobs (8 a grab) first, then bf16 leftovers */
/* k3_rows_mxfp4_xdw_avx512 as in the library (the same operations, the K3_MX_NEXT = 1 prefetch of the
 * next 8 rows) plus prefetches (L2) of side_bytes at side, spread over the 32-column blocks: a memory
 * stream for a later bf16 job issued while the MXFP4 FMAs run (only prefetches: the same bits) */
static uint16_t topw[256][32] __attribute__((aligned(64)));
static void topw_init(void) {
    for (unsigned sc = 0; sc < 256; sc++)
        for (unsigned c = 0; c < 32; c++) {
            double v = (double)E2M1_VALUES[c & 15] * k3_mxfp4_scale((uint8_t)sc);
            uint64_t u;
            memcpy(&u, &v, 8);
            topw[sc][c] = (uint16_t)(u >> 48);
        }
}
static void mxw8_side(const uint8_t *packed, const uint8_t *scales, const double *xd, size_t n, float *out,
                      const char *side, size_t side_bytes) {
    const size_t pr = n / 2, sr = n / 32, nb = n / 32;
    const size_t sstep = ((side_bytes + nb - 1) / nb + 63) & ~(size_t)63;
    const char *se = side + side_bytes;
    const __m512i sl = _mm512_setr_epi64(48, 44, 40, 36, 32, 28, 24, 20);
    __m512d a[8];
    for (int r = 0; r < 8; r++) a[r] = _mm512_setzero_pd();
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *p = packed + b * 16;
        {
            const char *q = (const char *)packed + 8 * pr + b * (8 * pr / nb);
            _mm_prefetch(q, _MM_HINT_T1);
            _mm_prefetch(q + 64, _MM_HINT_T1);
            if (b == 0)
                for (size_t o = 0; o < 8 * sr; o += 64) _mm_prefetch((const char *)scales + 8 * sr + o, _MM_HINT_T1);
        }
        for (size_t o = 0; o < sstep && side < se; o += 64, side += 64) _mm_prefetch(side, _MM_HINT_T1);
        const double *xb = xd + b * 32;
        const __m512d x0 = _mm512_loadu_pd(xb), x1 = _mm512_loadu_pd(xb + 8), x2 = _mm512_loadu_pd(xb + 16),
                      x3 = _mm512_loadu_pd(xb + 24);
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            const uint8_t *q_ = p + r * pr;
            const __m512i tw = _mm512_load_si512((const void *)topw[scales[r * sr + b]]);
            uint64_t w0, w1;
            uint32_t h0, h1;
            memcpy(&w0, q_, 8), memcpy(&h0, q_ + 4, 4), memcpy(&w1, q_ + 8, 8), memcpy(&h1, q_ + 12, 4);
#define W16(v) _mm512_castsi512_pd(_mm512_maskz_permutexvar_epi16((__mmask32)0x88888888u, _mm512_sllv_epi64(v, sl), tw))
            a[r] = _mm512_fmadd_pd(W16(_mm512_set1_epi64((long long)w0)), x0, a[r]);
            a[r] = _mm512_fmadd_pd(W16(_mm512_set1_epi32((int)h0)), x1, a[r]);
            a[r] = _mm512_fmadd_pd(W16(_mm512_set1_epi64((long long)w1)), x2, a[r]);
            a[r] = _mm512_fmadd_pd(W16(_mm512_set1_epi32((int)h1)), x3, a[r]);
#undef W16
        }
    }
    for (int r = 0; r < 8; r++) out[r] = red8(a[r]);
}
static inline void mjob_side(const stage *s, size_t j, const char *side, size_t side_bytes) {
    size_t m = 0;
    while (j >= s->mfirst[m + 1]) m++;
    const mxfp4_weight *W = s->mw[m];
    const size_t r0 = (j - s->mfirst[m]) * K3_ROWBLOCK;
    mxw8_side(W->packed + r0 * (W->cols / 2), W->scales + r0 * (W->cols / 32), s->mxd[m], W->cols, s->my[m] + r0,
              side, side_bytes);
}
/* Cv: super-jobs, dynamic,1: the MXFP4 jobs first, each prefetching its 1/m of the super-job's bf16 rows
 * inside its block loop (mxw8_side), then the bf16 job from L2 */
static void run_cv(const stage *s) {
    const size_t bytes = K3_XS_ROWS * s->dcols * sizeof(uint16_t);
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t q = 0; q < s->djobs; q++) {
        size_t m;
        const char *w = (const char *)djob_rows(s, q, &m);
        const size_t a = mlo(s, q), b = mlo(s, q + 1), n = b - a ? b - a : 1;
        const size_t step = ((bytes + n - 1) / n + 63) & ~(size_t)63;
        for (size_t j = a; j < b; j++) {
            const size_t off = (j - a) * step;
            mjob_side(s, j, w + off, off < bytes ? (bytes - off < step ? bytes - off : step) : 0);
        }
        djob(s, q, NULL, 0);
    }
}

static double cq_dbg[2][4];
static void run_cq(const stage *s) {
    const size_t bytes = K3_XS_ROWS * s->dcols * sizeof(uint16_t);
    size_t dn = 0, mn = 0;
#pragma omp parallel shared(dn, mn)
    {
        const int t = omp_get_thread_num();
        double tq0 = now_s();
        size_t nd_ = 0, nm_ = 0;
        for (int pass = 0; pass < 2; pass++) {
            const int dense = (t == 0) == (pass == 0);
            if (pass == 1) cq_dbg[t][0] = now_s() - tq0;
            if (dense)
                for (;;) {
                    size_t a = __atomic_fetch_add(&dn, 8, __ATOMIC_RELAXED);
                    if (a >= s->djobs) break;
                    size_t b = a + 8 < s->djobs ? a + 8 : s->djobs, m;
                    for (size_t j = a; j < b; j++) djob(s, j, j + 1 < b ? djob_rows(s, j + 1, &m) : NULL, bytes);
                    nd_ += b - a;
                }
            else
                for (;;) {
                    size_t a = __atomic_fetch_add(&mn, 8, __ATOMIC_RELAXED);
                    if (a >= s->mjobs) break;
                    size_t b = a + 8 < s->mjobs ? a + 8 : s->mjobs;
                    for (size_t j = a; j < b; j++) mjob(s, j);
                    nm_ += b - a;
                }
        }
        cq_dbg[t][1] = now_s() - tq0, cq_dbg[t][2] = (double)nd_, cq_dbg[t][3] = (double)nm_;
    }
    if (getenv("OV_DEBUG") && omp_get_max_threads() == 2)
        printf("cq: t0 first %.2f end %.2f (%g bf16, %g mx) | t1 first %.2f end %.2f (%g bf16 %g mx)\n", 1e3 * cq_dbg[0][0],
               1e3 * cq_dbg[0][1], cq_dbg[0][2], cq_dbg[0][3], 1e3 * cq_dbg[1][0], 1e3 * cq_dbg[1][1], cq_dbg[1][2],
               cq_dbg[1][3]);
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 11;
    if (reps < 1 || reps > 64) reps = 11;
    const kernels *k = kernels_get(SIMD_AUTO);
    if (!k || k->level != SIMD_AVX512 || !k3_cpu_has_vbmi()) {
        fprintf(stderr, "needs AVX-512 + VBMI\n");
        return 1;
    }
    omp_set_schedule(omp_sched_dynamic, 4);
    topw_init();
    shared_w sh[NSH];
    for (int c = 0; c < NSH; c++) {
        sh[c].gate = weight_mem_alloc((size_t)ISH * E * 2);
        sh[c].up = weight_mem_alloc((size_t)ISH * E * 2);
        sh[c].down = weight_mem_alloc((size_t)E * ISH * 2);
        if (!sh[c].gate || !sh[c].up || !sh[c].down) abort();
        fill_bf16(sh[c].gate, (size_t)ISH * E, 11 + c), fill_bf16(sh[c].up, (size_t)ISH * E, 22 + c);
        fill_bf16(sh[c].down, (size_t)E * ISH, 33 + c);
    }
    expert_w *ex = malloc(sizeof *ex * NE);
    for (int e = 0; e < NE; e++) {
        fill_mx(&ex[e].w1, I, L, 1000 + e), fill_mx(&ex[e].w3, I, L, 2000 + e);
        fill_mx(&ex[e].w2, L, I, 3000 + e);
    }
    /* inputs: x (hidden), z (latent), h (shared down input), g (routed w2 inputs, one per expert) */
    float *x = malloc(E * 4), *z = malloc(L * 4), *h = malloc(ISH * 4), *g = malloc((size_t)K * I * 4);
    uint64_t sd = 7;
    for (size_t i = 0; i < E; i++) x[i] = (float)((double)(rng(&sd) >> 11) * 0x1p-53 * 2 - 1);
    for (size_t i = 0; i < L; i++) z[i] = (float)((double)(rng(&sd) >> 11) * 0x1p-53 * 2 - 1);
    for (size_t i = 0; i < ISH; i++) h[i] = (float)((double)(rng(&sd) >> 11) * 0x1p-53 * 2 - 1);
    for (size_t i = 0; i < (size_t)K * I; i++) g[i] = (float)((double)(rng(&sd) >> 11) * 0x1p-53 * 2 - 1);
    double *xs = malloc(E * 8), *hs = malloc(ISH * 8), *zd = malloc(L * 8), *gd = malloc((size_t)K * I * 8);
    matmul_reserve_x(E + ISH + L + (size_t)K * I);
    /* outputs: A (sg, su, sdn), B (y1, y3, y2), C the same shapes */
    float *sg[2], *su[2], *sdn[2], *y13[2], *y2[2];
    for (int v = 0; v < 2; v++) {
        sg[v] = malloc(ISH * 4), su[v] = malloc(ISH * 4), sdn[v] = malloc(E * 4);
        y13[v] = malloc((size_t)2 * K * I * 4), y2[v] = malloc((size_t)K * L * 4);
    }
    const char *names[] = {"A shared (gate+up, down)", "B routed 16 (w1+w3, w2)", "Cn bf16 first, dyn1",
                           "Cp mx first + pf, dyn1", "Cs static, bf16 next-pf", "Cq thread 0 bf16 first", "Cv mx first + in-kernel pf"};
    enum { NV = 7 };
    double *tm = malloc(sizeof(double) * NV * reps), *ts1 = malloc(sizeof(double) * NV * reps);
    int rot = 0;
    /* OV_VARIANTS: the variants to run, as digits (A = 0 and B = 1 always) */
    const char *vsel = getenv("OV_VARIANTS") ? getenv("OV_VARIANTS") : "0123456";
    int use[NV], nuse = 0;
    for (int v = 0; v < NV; v++)
        if (v < 2 || strchr(vsel, '0' + v)) use[nuse++] = v;
    const int th0 = argc > 2 ? atoi(argv[2]) : 1;
    for (int th = th0 < 1 || th0 > 2 ? 1 : th0; th <= 2; th++) {
        omp_set_num_threads(th);
        int bad = 0;
        for (int r = -1; r < reps; r++) { /* r == -1: warm-up, not counted */
            for (int vi = 0; vi < nuse; vi++) {
                int v = use[(vi + (r < 0 ? 0 : r)) % nuse];
                const shared_w *S = &sh[rot % NSH];
                const expert_w *X[K];
                for (int e = 0; e < K; e++) X[e] = &ex[(rot * K + e) % NE];
                rot++;
                /* the weights as the library sees them */
                dense_weight Wg = {DTYPE_BF16, ISH, E, S->gate, -1, 0}, Wu = {DTYPE_BF16, ISH, E, S->up, -1, 0},
                             Wd = {DTYPE_BF16, E, ISH, S->down, -1, 0};
                mxfp4_weight W13[2 * K], W2[K];
                const float *x13[2 * K], *x2[K];
                float *o13[2 * K], *o2[K];
                size_t n13[2 * K], n2[K];
                const int c = v >= 2; /* output set: 0 for A/B, 1 for C */
                for (int e = 0; e < K; e++) {
                    W13[2 * e] = X[e]->w1, W13[2 * e + 1] = X[e]->w3, W2[e] = X[e]->w2;
                    x13[2 * e] = x13[2 * e + 1] = z, x2[e] = g + (size_t)e * I;
                    o13[2 * e] = y13[c] + (size_t)2 * e * I, o13[2 * e + 1] = y13[c] + (size_t)(2 * e + 1) * I;
                    o2[e] = y2[c] + (size_t)e * L;
                    n13[2 * e] = n13[2 * e + 1] = n2[e] = 1;
                }
                double t0 = now_s(), t1 = 0;
                if (v == 0) {
                    const dense_weight w2[2] = {Wg, Wu};
                    const float *xx[2] = {x, x};
                    float *yy[2] = {sg[0], su[0]};
                    matmul_dense_many(k, w2, xx, 1, yy, 2);
                    t1 = now_s();
                    matmul_dense(k, &Wd, h, 1, sdn[0]);
                } else if (v == 1) {
                    matmul_mxfp4_list(k, W13, x13, n13, o13, 2 * K);
                    t1 = now_s();
                    matmul_mxfp4_list(k, W2, x2, n2, o2, K);
                } else {
                    /* the conversions a combined driver would do: once per call */
                    for (size_t i = 0; i < E; i++) xs[i] = (double)x[i] * K3_BF16_XS_SCALE;
                    for (size_t i = 0; i < L; i++) zd[i] = (double)z[i];
                    stage s1 = {.nd = 2, .nm = 2 * K, .dw = {S->gate, S->up}, .drows = {ISH, ISH}, .dcols = E,
                                .xs = xs, .dy = {sg[1], su[1]}};
                    for (int i = 0; i < 2 * K; i++) s1.mw[i] = &W13[i], s1.mxd[i] = zd, s1.my[i] = o13[i];
                    stage_init(&s1);
                    void (*run)(const stage *) = v == 2 ? run_cn : v == 3 ? run_cp : v == 4 ? run_cs : v == 5 ? run_cq : run_cv;
                    run(&s1);
                    t1 = now_s();
                    for (size_t i = 0; i < ISH; i++) hs[i] = (double)h[i] * K3_BF16_XS_SCALE;
                    for (size_t i = 0; i < (size_t)K * I; i++) gd[i] = (double)g[i];
                    stage s2 = {.nd = 1, .nm = K, .dw = {S->down}, .drows = {E}, .dcols = ISH, .xs = hs,
                                .dy = {sdn[1]}};
                    for (int i = 0; i < K; i++) s2.mw[i] = &W2[i], s2.mxd[i] = gd + (size_t)i * I, s2.my[i] = o2[i];
                    stage_init(&s2);
                    run(&s2);
                }
                double t2 = now_s();
                if (r >= 0) tm[v * reps + r] = t2 - t0, ts1[v * reps + r] = t1 - t0;
            }
        }
        /* bits: one more A, B and each C on the same weights */
        for (int v = 2; v < NV; v++) {
            if (!strchr(vsel, '0' + v)) continue;
            const shared_w *S = &sh[0];
            dense_weight Wg = {DTYPE_BF16, ISH, E, S->gate, -1, 0}, Wu = {DTYPE_BF16, ISH, E, S->up, -1, 0},
                         Wd = {DTYPE_BF16, E, ISH, S->down, -1, 0};
            mxfp4_weight W13[2 * K], W2[K];
            const float *x13[2 * K], *x2[K];
            float *o13[2][2 * K], *o2[2][K];
            size_t n13[2 * K], n2[K];
            for (int e = 0; e < K; e++) {
                W13[2 * e] = ex[e].w1, W13[2 * e + 1] = ex[e].w3, W2[e] = ex[e].w2;
                x13[2 * e] = x13[2 * e + 1] = z, x2[e] = g + (size_t)e * I;
                n13[2 * e] = n13[2 * e + 1] = n2[e] = 1;
                for (int cc = 0; cc < 2; cc++) {
                    o13[cc][2 * e] = y13[cc] + (size_t)2 * e * I, o13[cc][2 * e + 1] = y13[cc] + (size_t)(2 * e + 1) * I;
                    o2[cc][e] = y2[cc] + (size_t)e * L;
                }
            }
            for (int cc = 0; cc < 2; cc++) {
                memset(sg[cc], 0xff, ISH * 4), memset(su[cc], 0xff, ISH * 4), memset(sdn[cc], 0xff, E * 4);
                memset(y13[cc], 0xff, (size_t)2 * K * I * 4), memset(y2[cc], 0xff, (size_t)K * L * 4);
            }
            const dense_weight w2[2] = {Wg, Wu};
            const float *xx[2] = {x, x};
            float *yy[2] = {sg[0], su[0]};
            matmul_dense_many(k, w2, xx, 1, yy, 2);
            matmul_dense(k, &Wd, h, 1, sdn[0]);
            matmul_mxfp4_list(k, W13, x13, n13, o13[0], 2 * K);
            matmul_mxfp4_list(k, W2, x2, n2, o2[0], K);
            for (size_t i = 0; i < E; i++) xs[i] = (double)x[i] * K3_BF16_XS_SCALE;
            for (size_t i = 0; i < L; i++) zd[i] = (double)z[i];
            for (size_t i = 0; i < ISH; i++) hs[i] = (double)h[i] * K3_BF16_XS_SCALE;
            for (size_t i = 0; i < (size_t)K * I; i++) gd[i] = (double)g[i];
            stage s1 = {.nd = 2, .nm = 2 * K, .dw = {S->gate, S->up}, .drows = {ISH, ISH}, .dcols = E, .xs = xs,
                        .dy = {sg[1], su[1]}};
            for (int i = 0; i < 2 * K; i++) s1.mw[i] = &W13[i], s1.mxd[i] = zd, s1.my[i] = o13[1][i];
            stage_init(&s1);
            stage s2 = {.nd = 1, .nm = K, .dw = {S->down}, .drows = {E}, .dcols = ISH, .xs = hs, .dy = {sdn[1]}};
            for (int i = 0; i < K; i++) s2.mw[i] = &W2[i], s2.mxd[i] = gd + (size_t)i * I, s2.my[i] = o2[1][i];
            stage_init(&s2);
            void (*run)(const stage *) = v == 2 ? run_cn : v == 3 ? run_cp : v == 4 ? run_cs : v == 5 ? run_cq : run_cv;
            run(&s1);
            run(&s2);
            bad |= memcmp(sg[0], sg[1], ISH * 4) || memcmp(su[0], su[1], ISH * 4) || memcmp(sdn[0], sdn[1], E * 4) ||
                   memcmp(y13[0], y13[1], (size_t)2 * K * I * 4) || memcmp(y2[0], y2[1], (size_t)K * L * 4);
        }
        printf("%d thread(s), %d alternated rounds, one rw6 MoE layer's token (shared 2x3072 bf16, 16 of %d experts): "
               "ms best / median (stage 1 = gate+up / w1+w3 median)\n",
               th, reps, NE);
        double ab[64];
        for (int r = 0; r < reps; r++) ab[r] = tm[0 * reps + r] + tm[1 * reps + r];
        for (int v = 0; v <= NV; v++) {
            if (v < NV && !strchr(vsel, '0' + v)) continue;
            double *a = v == NV ? ab : tm + v * reps, s[64], s1[64];
            for (int r = 0; r < reps; r++) s[r] = a[r], s1[r] = v < NV ? ts1[v * reps + r] : 0;
            for (int i = 1; i < reps; i++)
                for (int j = i; j > 0 && s[j] < s[j - 1]; j--) { double q = s[j]; s[j] = s[j - 1]; s[j - 1] = q; }
            for (int i = 1; i < reps; i++)
                for (int j = i; j > 0 && s1[j] < s1[j - 1]; j--) { double q = s1[j]; s1[j] = s1[j - 1]; s1[j - 1] = q; }
            printf("  %-28s %7.2f / %7.2f ms", v == NV ? "A+B (same round)" : names[v], 1e3 * s[0], 1e3 * s[reps / 2]);
            if (v < NV) printf("   (stage 1 %6.2f)", 1e3 * s1[reps / 2]);
            if (v >= 2 && v < NV) { /* the round's C / (A + B): median, and the rounds it is below 1 */
                double q[64];
                int below = 0;
                for (int r = 0; r < reps; r++) q[r] = a[r] / ab[r], below += q[r] < 1;
                for (int i = 1; i < reps; i++)
                    for (int j = i; j > 0 && q[j] < q[j - 1]; j--) { double t = q[j]; q[j] = q[j - 1]; q[j - 1] = t; }
                printf("   C/(A+B) median %.3f, below 1 in %d of %d", q[reps / 2], below, reps);
            }
            printf("\n");
        }
        printf("  C outputs bit-identical to A and B: %s\n", bad ? "NO" : "yes");
    }
    return 0;
}
