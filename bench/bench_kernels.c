/* bench_kernels.c - speed of the exact kernels against this machine's memory:
 * measures the read bandwidth (multithreaded sum over a buffer far larger than
 * the caches), then bf16 matrix-vector at 12288x7168 and MXFP4 matrix-vector at
 * an expert's shapes (w1/w3 3072x3584, w2 3584x3072), for 1 thread and all
 * threads, at the selected SIMD level and at scalar. Prints a markdown table:
 * time per call, GB/s of weight bytes streamed, fraction of the read bandwidth
 * measured with the same thread count.
 * Usage: bench_kernels [--simd auto|avx2|avx512|scalar] [--quick]
 *        bench_kernels --ceilings   (only the ceilings, one line each: first touch of fresh
 *                                    weight memory, read bandwidth, FMA peak)
 *        bench_kernels --gemm [--case N] [--simd L] [--quick] [--lanes]   (the multi-token "prefill"
 *            kernels at prompt-chunk sizes, 1 thread and all: GFLOP/s in wall and in CPU time
 *            against the FMA peak measured the same way just before each case; --lanes: the MXFP4
 *            cases read their codes as the lane layout, mxfp4_weight.lanes) */
#include <emmintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/kernels.h"
#include "common/weight_mem.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void *xmalloc(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64) != 0) {
        fprintf(stderr, "bench_kernels: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* Parallel first touch + random fill, so pages are spread like the runs that use them. */
static void fill_random(uint8_t *p, size_t n, uint64_t seed) {
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < (n + 4095) / 4096; c++) {
        uint64_t s = seed ^ (c * 0x9e3779b97f4a7c15ull);
        size_t end = (c + 1) * 4096 < n ? (c + 1) * 4096 : n;
        for (size_t i = c * 4096; i < end; i += 8) {
            uint64_t r = rng_next(&s);
            memcpy(p + i, &r, end - i < 8 ? end - i : 8);
        }
    }
}

/* Read bandwidth: every thread sums its static share of buf with 4 independent
 * SSE2 accumulators (enough loads in flight to saturate memory). GB/s, best of reps. */
static double read_bandwidth(const uint8_t *buf, size_t n, int reps) {
    double best = 0;
    for (int r = 0; r < reps; r++) {
        uint64_t total = 0;
        double t0 = now_s();
#pragma omp parallel reduction(+ : total)
        {
            __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
#pragma omp for schedule(static)
            for (size_t i = 0; i < n / 64; i++) {
                const __m128i *p = (const __m128i *)(buf + i * 64);
                a0 = _mm_add_epi64(a0, _mm_load_si128(p));
                a1 = _mm_add_epi64(a1, _mm_load_si128(p + 1));
                a2 = _mm_add_epi64(a2, _mm_load_si128(p + 2));
                a3 = _mm_add_epi64(a3, _mm_load_si128(p + 3));
            }
            uint64_t l[2];
            _mm_storeu_si128((__m128i *)l, _mm_add_epi64(_mm_add_epi64(a0, a1), _mm_add_epi64(a2, a3)));
            total += l[0] + l[1];
        }
        double dt = now_s() - t0;
        if (total == 42) fprintf(stderr, " "); /* keep the sum alive */
        if (n / dt / 1e9 > best) best = (double)n / dt / 1e9;
    }
    return best;
}

/* Double-precision FMA peak: every thread runs 12 independent FMA chains held in
 * registers (enough to cover the FMA latency on every x86 core since Haswell), of
 * the widest vectors the CPU has (AVX-512: 8 doubles, else AVX2: 4).
 * GFLOP/s (2 flops per lane per FMA), best of reps. 0 if the CPU has no AVX2+FMA. */
#if defined(__x86_64__)
#include "bench/fma_chains.h"
/* The peak of the widest FMA the CPU has: 4-wide AVX2, or 8-wide AVX-512 when present. */
static double fma_peak(int reps) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0;
    const int wide = __builtin_cpu_supports("avx512f");
    const long iters = 20000000;
    double best = 0, sink = 0;
    for (int r = 0; r < reps; r++) {
        int nthr = 1;
        double t0 = now_s();
#pragma omp parallel reduction(+ : sink)
        {
#pragma omp single
            nthr = omp_get_num_threads();
            sink += wide ? fma_chains512(iters) : fma_chains(iters);
        }
        double g = (double)nthr * (double)iters * 12 * (wide ? 8 : 4) * 2 / (now_s() - t0) / 1e9;
        if (g > best) best = g;
    }
    if (sink == 42) fprintf(stderr, " ");
    return best;
}
#else
static double fma_peak(int reps) { (void)reps; return 0; }
#endif

/* Read bandwidth with S independent streams per thread: every thread splits its
 * static share into S equal parts and reads them interleaved, 64 bytes of each per
 * step (more misses in flight than one stream's prefetcher gives). GB/s, best of reps. */
static double read_bandwidth_streams(const uint8_t *buf, size_t n, int S, int reps) {
    double best = 0;
    for (int r = 0; r < reps; r++) {
        uint64_t total = 0;
        double t0 = now_s();
#pragma omp parallel reduction(+ : total)
        {
            int nt = omp_get_num_threads(), me = omp_get_thread_num();
            size_t share = n / 64 / (size_t)nt, part = share / (size_t)S;
            const uint8_t *b0 = buf + (size_t)me * share * 64;
            __m128i a0 = _mm_setzero_si128(), a1 = a0;
            for (size_t i = 0; i < part; i++)
                for (int s2 = 0; s2 < S; s2++) {
                    const __m128i *p = (const __m128i *)(b0 + ((size_t)s2 * part + i) * 64);
                    a0 = _mm_add_epi64(a0, _mm_add_epi64(_mm_load_si128(p), _mm_load_si128(p + 1)));
                    a1 = _mm_add_epi64(a1, _mm_add_epi64(_mm_load_si128(p + 2), _mm_load_si128(p + 3)));
                }
            uint64_t l[2];
            _mm_storeu_si128((__m128i *)l, _mm_add_epi64(a0, a1));
            total += l[0] + l[1];
        }
        double dt = now_s() - t0;
        if (total == 42) fprintf(stderr, " ");
        size_t nt_bytes = n / 64 * 64;
        if ((double)nt_bytes / dt / 1e9 > best) best = (double)nt_bytes / dt / 1e9;
    }
    return best;
}

/* First touch of fresh weight memory: GB/s at which the kernel hands out new pages of a
 * weight_mem_alloc buffer (the engine's weight memory: 2 MiB aligned, transparent huge
 * pages) when nthr threads write one byte per 4 KiB page, i.e. the page faults and the
 * clearing of the pages that every load into fresh memory pays, whatever reads into it.
 * On a bare machine this is the memory clear rate; in a VM whose guest memory the
 * hypervisor takes back when it is freed (balloon, free page reporting) it also counts
 * the hypervisor backing each page again. The buffer is returned to the caller to keep
 * mapped, so a second measurement does not reuse its pages. */
static double first_touch(int nthr, size_t n, uint8_t **keep) {
    uint8_t *p = weight_mem_alloc(n);
    *keep = p;
    if (!p) return 0;
    double t0 = now_s();
#pragma omp parallel for schedule(static, 64) num_threads(nthr)
    for (size_t i = 0; i < n / 4096; i++) p[i * 4096] = 1;
    return (double)n / (now_s() - t0) / 1e9;
}

/* The read bandwidth (best of 1 stream and 2, 4, 8 independent streams per thread) and the
 * double FMA peak at `threads` threads over buf[0..n), printed as print_ceilings' lines; leaves
 * the OpenMP thread count at `threads`. */
static void print_bw_fma(const uint8_t *buf, size_t n, int threads) {
    omp_set_num_threads(threads);
    double bw = read_bandwidth(buf, n, 3);
    int best_s = 1;
    for (int S = 2; S <= 8; S *= 2) {
        double b = read_bandwidth_streams(buf, n, S, 3);
        if (b > bw) { bw = b; best_s = S; }
    }
    printf("read_bw_gbs threads=%d %.2f streams_per_thread=%d\n", threads, bw, best_s);
    printf("fma_peak_gflops threads=%d %.2f\n", threads, fma_peak(3));
}

/* The machine's ceilings for this run: first touch of fresh weight memory, read
 * bandwidth (best of 1 stream and 2, 4, 8 independent streams per thread) and the
 * double FMA peak, for 1 thread and all. */
static int print_ceilings(void) {
    const size_t n = (size_t)512 << 20;
    int nthr_max = omp_get_max_threads();
    {
        uint8_t *keep[2] = {NULL, NULL};
        int th[2] = {nthr_max, 1};
        double r[2] = {0, 0};
        for (int ti = 0; ti < (nthr_max > 1 ? 2 : 1); ti++) r[ti] = first_touch(th[ti], n, &keep[ti]);
        for (int ti = (nthr_max > 1 ? 1 : 0); ti >= 0; ti--) printf("first_touch_gbs threads=%d %.3f\n", th[ti], r[ti]);
        weight_mem_free(keep[0]);
        weight_mem_free(keep[1]);
    }
    uint8_t *buf = xmalloc(n);
    fill_random(buf, n, 7);
    int nthr_all = omp_get_max_threads();
    int th[2] = {1, nthr_all};
    for (int ti = 0; ti < (nthr_all > 1 ? 2 : 1); ti++) print_bw_fma(buf, n, th[ti]);
    omp_set_num_threads(nthr_all);
    free(buf);
    return 0;
}

/* The read bandwidth and FMA peak at `threads` threads alone, without the first touch (about a
 * second): the ceilings taken just before and just after one engine run, so that its ratio is
 * also stated against the machine of that moment (a shared host's bandwidth moves by 1.5x
 * within minutes). print_ceilings' measurement (print_bw_fma) at one thread count. */
static int print_ceilings_at(int threads) {
    const size_t n = (size_t)512 << 20;
    uint8_t *buf = xmalloc(n);
    fill_random(buf, n, 7);
    int nthr_all = omp_get_max_threads();
    print_bw_fma(buf, n, threads);
    omp_set_num_threads(nthr_all);
    free(buf);
    return 0;
}

typedef struct {
    const char *what;
    int is_mxfp4;
    dense_weight d; /* is_mxfp4 == 0 */
    mxfp4_weight *m; /* is_mxfp4: ncopies weights, cycled so no call finds the last in cache */
    size_t ncopies;
    size_t bytes; /* weight bytes streamed by one call */
    size_t ntok;  /* tokens per call */
} bench_case;

static size_t case_rows(const bench_case *c) { return c->is_mxfp4 ? c->m[0].rows : c->d.rows; }
static size_t case_cols(const bench_case *c) { return c->is_mxfp4 ? c->m[0].cols : c->d.cols; }

/* Every call is timed on its own, for at least min_s in all (and 5 calls): the best
 * call is the kernel's own speed on a machine that may be shared, the median shows
 * what the run met. */
typedef struct {
    double ms, median_ms, gbs, gflops;
} bench_result;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static bench_result run_case(const kernels *k, const bench_case *c, const float *x, float *y, double min_s) {
    enum { MAXCALLS = 4096 };
    double *t = xmalloc(MAXCALLS * sizeof *t), total = 0;
    size_t calls = 0;
    while (calls < MAXCALLS && (total < min_s || calls < 5)) {
        double t0 = now_s();
        if (c->is_mxfp4) matmul_mxfp4(k, &c->m[calls % c->ncopies], x, c->ntok, y);
        else matmul_dense(k, &c->d, x, c->ntok, y);
        t[calls] = now_s() - t0;
        total += t[calls++];
    }
    qsort(t, calls, sizeof *t, cmp_double);
    bench_result r = {1e3 * t[0], 1e3 * t[calls / 2], (double)c->bytes / t[0] / 1e9,
                      2.0 * (double)(case_rows(c) * case_cols(c) * c->ntok) / t[0] / 1e9};
    free(t);
    return r;
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* FMA peak in wall time and in CPU time (of all the threads, over their number): on a
 * shared host the CPU-time figure is what the threads got while they ran. */
static void fma_peak_both(int reps, double *wall, double *cpu) {
    *wall = *cpu = 0;
    for (int r = 0; r < reps; r++) {
        double c0 = cpu_s(), g = fma_peak(1), dc = cpu_s() - c0;
        int nthr = omp_get_max_threads();
        /* fma_peak's work: nthr * 20e6 iterations * 12 chains * lanes * 2 */
        __builtin_cpu_init();
        double lanes = __builtin_cpu_supports("avx512f") ? 8 : 4;
        double gc = dc > 0 ? (double)nthr * 20e6 * 12 * lanes * 2 / (dc / nthr) / 1e9 : 0;
        if (g > *wall) *wall = g;
        if (gc > *cpu) *cpu = gc;
    }
}

/* --gemm: the prefill kernels (matmul_dense / matmul_mxfp4 from 4 tokens on) at the
 * trunk's and the experts' shapes and 16-512 tokens. Weights are random, finite; the
 * result is checked against one token at a time (the contract) once per case. */
static int gemm_bench(const kernels *k, int quick, int only, int lanes) {
    typedef struct { const char *what; int mx; size_t rows, cols, ntok; } gcase;
    const gcase cs[] = {
        {"bf16", 0, 3072, 7168, 64},   {"bf16", 0, 3072, 7168, 128},  {"bf16", 0, 3072, 7168, 256},
        {"bf16", 0, 3072, 7168, 512},  {"bf16 (MLA q_b)", 0, 18432, 1536, 64},
        {"bf16 (KDA o)", 0, 7168, 12288, 64},
        {"mxfp4 w1/w3", 1, 3072, 3584, 16}, {"mxfp4 w1/w3", 1, 3072, 3584, 32},
        {"mxfp4 w1/w3", 1, 3072, 3584, 64}, {"mxfp4 w2", 1, 3584, 3072, 32},
        /* an expert's share of a 64-token chunk is about 32 tokens, rarely a multiple of 6 */
        {"mxfp4 w1/w3", 1, 3072, 3584, 25}, {"mxfp4 w1/w3", 1, 3072, 3584, 27}, {"mxfp4 w1/w3", 1, 3072, 3584, 31},
    };
    const size_t ncs = sizeof cs / sizeof cs[0];
    size_t maxw = 0, maxx = 0, maxy = 0;
    for (size_t i = 0; i < ncs; i++) {
        if (cs[i].rows * cs[i].cols > maxw) maxw = cs[i].rows * cs[i].cols;
        if (cs[i].ntok * cs[i].cols > maxx) maxx = cs[i].ntok * cs[i].cols;
        if (cs[i].ntok * cs[i].rows > maxy) maxy = cs[i].ntok * cs[i].rows;
    }
    /* 768 MiB of weights, cycled through call by call (copy i at i * the matrix size): far
     * beyond the caches (this VM's L3 is 260 MiB), so the weights come from memory as the
     * engine's trunk and experts do */
    const size_t wbytes = (size_t)768 << 20;
    if (maxw * 2 > wbytes) return 2;
    uint16_t *wb = xmalloc(wbytes);
    fill_random((uint8_t *)wb, wbytes, 11);
    for (size_t i = 0; i < wbytes / 2; i++) wb[i] = (uint16_t)((wb[i] & 0x807f) | (uint16_t)((120 + (wb[i] >> 7) % 8) << 7));
    uint8_t *packed = xmalloc(wbytes), *scales = xmalloc(wbytes / 16);
    fill_random(packed, wbytes, 100);
    for (size_t i = 0; i < wbytes / 16; i++) scales[i] = (uint8_t)(120 + (i * 7) % 12);
    float *x = xmalloc(maxx * sizeof *x), *y = xmalloc(maxy * sizeof *y), *y1 = xmalloc(maxy * sizeof *y1);
    uint64_t s = 1;
    for (size_t i = 0; i < maxx; i++) x[i] = (float)((double)(rng_next(&s) >> 11) / 9007199254740992.0 - 0.5);
    const int nthr_all = omp_get_max_threads();
    const double min_s = quick ? 0.3 : 1.5;
    printf("multi-token kernels, level %s; best call of >= %.1f s; weights cycled through %zu MiB (from memory); FMA peak\n"
           "measured the same way just before each row\n",
           k->name, min_s, wbytes >> 20);
    printf("| kernel | rows x cols | tokens | threads | ms/call best | GFLOP/s wall | %% of FMA peak (wall) | GFLOP/s CPU time | %% of FMA peak (CPU time) |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < ncs; i++) {
        if (only >= 0 && (size_t)only != i) continue;
        const gcase *c = &cs[i];
        dense_weight dw = {DTYPE_BF16, c->rows, c->cols, wb, -1, 0};
        /* --lanes: the random codes read as the lane layout (mxfp4_weight.lanes), where the width allows */
        const int ml = lanes && c->cols % 128 == 0;
        mxfp4_weight mw = {c->rows, c->cols, packed, scales, ml};
        /* the contract: == one token at a time */
        omp_set_num_threads(nthr_all);
        if (c->mx) matmul_mxfp4(k, &mw, x, c->ntok, y);
        else matmul_dense(k, &dw, x, c->ntok, y);
        for (size_t t = 0; t < c->ntok; t++) {
            if (c->mx) matmul_mxfp4(k, &mw, x + t * c->cols, 1, y1 + t * c->rows);
            else matmul_dense(k, &dw, x + t * c->cols, 1, y1 + t * c->rows);
        }
        if (memcmp(y, y1, c->ntok * c->rows * sizeof *y) != 0) {
            fprintf(stderr, "bench_kernels: %s %zu tokens: not the bits of one token at a time!\n", c->what, c->ntok);
            return 1;
        }
        for (int th = 1; th <= nthr_all; th = th == nthr_all ? th + 1 : nthr_all) {
            omp_set_num_threads(th);
            double pw, pc;
            fma_peak_both(quick ? 2 : 3, &pw, &pc);
            double bw = 1e30, bc = 1e30, total = 0;
            const size_t ncopy = c->mx ? wbytes / (c->rows * c->cols / 2) : wbytes / (c->rows * c->cols * 2);
            for (int calls = 0; total < min_s || calls < 3; calls++) {
                const size_t cp = (size_t)calls % ncopy;
                dense_weight dwc = {DTYPE_BF16, c->rows, c->cols, wb + cp * c->rows * c->cols, -1, 0};
                mxfp4_weight mwc = {c->rows, c->cols, packed + cp * c->rows * c->cols / 2,
                                    scales + cp * c->rows * c->cols / 32, ml};
                double t0 = now_s(), c0 = cpu_s();
                if (c->mx) matmul_mxfp4(k, &mwc, x, c->ntok, y);
                else matmul_dense(k, &dwc, x, c->ntok, y);
                double dt = now_s() - t0, dc = (cpu_s() - c0) / th;
                total += dt;
                if (dt < bw) bw = dt;
                if (dc < bc) bc = dc;
            }
            double flop = 2.0 * (double)c->rows * (double)c->cols * (double)c->ntok;
            printf("| %s%s | %zu x %zu | %zu | %d | %.2f | %.1f | %.0f %% | %.1f | %.0f %% |\n", c->what, ml ? " (lanes)" : "", c->rows, c->cols,
                   c->ntok, th, 1e3 * bw, flop / bw / 1e9, 100 * flop / bw / 1e9 / pw, flop / bc / 1e9,
                   100 * flop / bc / 1e9 / pc);
            fflush(stdout);
        }
    }
    omp_set_num_threads(nthr_all);
    free(wb); free(packed); free(scales); free(x); free(y); free(y1);
    return 0;
}

int main(int argc, char **argv) {
    simd_level want = SIMD_AUTO;
    int quick = 0, gemm = 0, only = -1, lanes = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--simd") == 0 && i + 1 < argc) {
            if (simd_level_parse(argv[++i], &want) != 0) {
                fprintf(stderr, "bench_kernels: bad --simd %s\n", argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--gemm") == 0) {
            gemm = 1;
        } else if (strcmp(argv[i], "--lanes") == 0) {
            lanes = 1;
        } else if (strcmp(argv[i], "--case") == 0 && i + 1 < argc) {
            only = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--ceilings") == 0) {
            return print_ceilings();
        } else if (strcmp(argv[i], "--ceilings-at") == 0 && i + 1 < argc) {
            int t = atoi(argv[++i]);
            if (t < 1 || t > 4096) {
                fprintf(stderr, "bench_kernels: bad --ceilings-at %s (a thread count)\n", argv[i]);
                return 2;
            }
            return print_ceilings_at(t);
        } else {
            fprintf(stderr, "usage: bench_kernels [--simd auto|scalar|avx2|avx512] [--quick] [--gemm [--case N] [--lanes]] | --ceilings | --ceilings-at THREADS\n");
            return 2;
        }
    }
    const kernels *best = kernels_get(want), *scalar = kernels_get(SIMD_SCALAR);
    if (!best) {
        fprintf(stderr, "bench_kernels: SIMD level not supported by this CPU\n");
        return 2;
    }
    if (gemm) return gemm_bench(best, quick, only, lanes);
    const int nthr_all = omp_get_max_threads();
    const double min_s = quick ? 0.1 : 1.0;

    /* Memory read bandwidth, 1 thread and all threads: sampled at the start and again
     * before every case; the best sample counts (the machine may be shared). */
    const size_t bw_bytes = (size_t)256 << 20;
    uint8_t *bwbuf = xmalloc(bw_bytes);
    fill_random(bwbuf, bw_bytes, 7);
    const int nthr[2] = {1, nthr_all};
    const int nthr_cases = nthr_all > 1 ? 2 : 1;
    double bw[2] = {0, 0}, peak[2] = {0, 0};
    for (int ti = 0; ti < nthr_cases; ti++) {
        omp_set_num_threads(nthr[ti]);
        bw[ti] = read_bandwidth(bwbuf, bw_bytes, quick ? 4 : 10);
        peak[ti] = fma_peak(quick ? 2 : 5);
    }

    /* weights */
    const size_t brows = 12288, bcols = 7168;
    uint16_t *wb = xmalloc(brows * bcols * 2);
    fill_random((uint8_t *)wb, brows * bcols * 2, 11);
    for (size_t i = 0; i < brows * bcols; i++) /* finite bf16 around 2^-7..2^0 */
        wb[i] = (uint16_t)((wb[i] & 0x807f) | (uint16_t)((120 + (wb[i] >> 7) % 8) << 7));

    const size_t ncopies = 16; /* 16 x 5.85 MB: well beyond the caches, like distinct experts */
    enum { NCASES = 11, MAXTOK = 64 };
    bench_case cases[NCASES] = {
        {"bf16 matvec", 0, {DTYPE_BF16, brows, bcols, wb, -1, 0}, NULL, 0, brows * bcols * 2, 1},
        {"mxfp4 w1/w3", 1, {0, 0, 0, NULL, -1, 0}, NULL, ncopies, 0, 1},
        {"mxfp4 w2", 1, {0, 0, 0, NULL, -1, 0}, NULL, ncopies, 0, 1},
        {"mxfp4 w1/w3, 8 tokens", 1, {0, 0, 0, NULL, -1, 0}, NULL, ncopies, 0, 8},
        {"mxfp4 w1/w3, 32 tokens", 1, {0, 0, 0, NULL, -1, 0}, NULL, ncopies, 0, 32},
        {"bf16, 8 tokens", 0, {DTYPE_BF16, brows, bcols, wb, -1, 0}, NULL, 0, brows * bcols * 2, 8},
        {"bf16, 64 tokens", 0, {DTYPE_BF16, brows, bcols, wb, -1, 0}, NULL, 0, brows * bcols * 2, 64},
        /* the same codes in the lane layout (mxfp4_weight.lanes: what the expert cache holds for a
         * resident run where matmul_mxfp4_lanes_wanted), and two tokens in both layouts */
        {"mxfp4 w1/w3, lanes", 1, {0, 0, 0, NULL, -1, 0}, NULL, ncopies, 0, 1},
        {"mxfp4 w2, lanes", 1, {0, 0, 0, NULL, -1, 0}, NULL, ncopies, 0, 1},
        {"mxfp4 w1/w3, 2 tokens", 1, {0, 0, 0, NULL, -1, 0}, NULL, ncopies, 0, 2},
        {"mxfp4 w1/w3, lanes, 2 tokens", 1, {0, 0, 0, NULL, -1, 0}, NULL, ncopies, 0, 2},
    };
    const size_t mshape[2][2] = {{3072, 3584}, {3584, 3072}};
    size_t maxcols = bcols, maxrows = brows;
    for (int ci = 1; ci < 3; ci++) {
        size_t rows = mshape[ci - 1][0], cols = mshape[ci - 1][1];
        cases[ci].m = xmalloc(ncopies * sizeof(mxfp4_weight));
        for (size_t e = 0; e < ncopies; e++) {
            uint8_t *packed = xmalloc(rows * cols / 2), *scales = xmalloc(rows * cols / 32);
            fill_random(packed, rows * cols / 2, 100 + e);
            for (size_t i = 0; i < rows * cols / 32; i++) scales[i] = (uint8_t)(120 + (i * 7 + e) % 12);
            cases[ci].m[e] = (mxfp4_weight){rows, cols, packed, scales, 0};
        }
        cases[ci].bytes = rows * cols / 2 + rows * cols / 32;
        /* the lane copies (cases 7 and 8): the same codes repacked, the same scales */
        cases[ci + 6].m = xmalloc(ncopies * sizeof(mxfp4_weight));
        for (size_t e = 0; e < ncopies; e++) {
            uint8_t *lp = xmalloc(rows * cols / 2);
            memcpy(lp, cases[ci].m[e].packed, rows * cols / 2);
            mxfp4_repack_lanes(lp, rows, cols);
            cases[ci + 6].m[e] = (mxfp4_weight){rows, cols, lp, cases[ci].m[e].scales, 1};
        }
        cases[ci + 6].bytes = cases[ci].bytes;
    }
    static const int same_as[][2] = {{3, 1}, {4, 1}, {9, 1}, {10, 7}}; /* case, the case whose weights it uses */
    for (size_t i = 0; i < sizeof same_as / sizeof same_as[0]; i++) {
        cases[same_as[i][0]].m = cases[same_as[i][1]].m;
        cases[same_as[i][0]].bytes = cases[same_as[i][1]].bytes;
    }

    float *x = xmalloc(MAXTOK * maxcols * sizeof *x), *y = xmalloc(MAXTOK * maxrows * sizeof *y),
          *y2 = xmalloc(MAXTOK * maxrows * sizeof *y2);
    uint64_t s = 1;
    for (size_t i = 0; i < MAXTOK * maxcols; i++) x[i] = (float)((double)(rng_next(&s) >> 11) / 9007199254740992.0 - 0.5);

    /* sanity: the selected level gives the scalar bits on every bench matrix (for more
     * than 8 tokens: the bits of its own single-token calls, which the unit test ties
     * to scalar) */
    for (int ci = 0; ci < NCASES; ci++) {
        const bench_case *c = &cases[ci];
        const size_t rows = case_rows(c), cols = case_cols(c);
        if (c->is_mxfp4) matmul_mxfp4(best, &c->m[0], x, c->ntok, y);
        else matmul_dense(best, &c->d, x, c->ntok, y);
        for (size_t t = 0; t < c->ntok; t += c->ntok > 8 ? 1 : c->ntok) {
            const kernels *ref = c->ntok > 8 ? best : scalar;
            const size_t nt = c->ntok > 8 ? 1 : c->ntok;
            if (c->is_mxfp4) matmul_mxfp4(ref, &c->m[0], x + t * cols, nt, y2 + t * rows);
            else matmul_dense(ref, &c->d, x + t * cols, nt, y2 + t * rows);
        }
        if (memcmp(y, y2, c->ntok * rows * sizeof *y) != 0) {
            fprintf(stderr, "bench_kernels: %s: %s differs from scalar!\n", cases[ci].what, best->name);
            return 1;
        }
    }

    const kernels *lv[2] = {best, scalar};
    const int nlv = best == scalar ? 1 : 2;
    bench_result res[NCASES][2][2];
    for (int ci = 0; ci < NCASES; ci++)
        for (int li = 0; li < nlv; li++)
            for (int ti = 0; ti < nthr_cases; ti++) {
                omp_set_num_threads(nthr[ti]);
                if (lv[li] == scalar && cases[ci].ntok > 8) { /* the reference path is not tuned: skip */
                    res[ci][li][ti] = (bench_result){0, 0, 0, 0};
                    continue;
                }
                double b = read_bandwidth(bwbuf, bw_bytes, 2);
                if (b > bw[ti]) bw[ti] = b;
                run_case(lv[li], &cases[ci], x, y, 0.02); /* warm-up: threads, page tables */
                res[ci][li][ti] = run_case(lv[li], &cases[ci], x, y, min_s);
            }

    printf("read bandwidth (multithreaded SSE2 sum over %zu MiB, best sample): 1 thread %.1f GB/s", bw_bytes >> 20,
           bw[0]);
    if (nthr_cases > 1) printf(", %d threads %.1f GB/s", nthr_all, bw[1]);
    printf("\ndouble FMA peak (12 independent FMA chains of the widest vectors per thread, best sample): 1 thread %.1f GFLOP/s", peak[0]);
    if (nthr_cases > 1) printf(", %d threads %.1f GFLOP/s", nthr_all, peak[1]);
    printf("\n1 token per call unless noted; every call timed, best and median shown; MXFP4 cycles through %zu distinct copies (%.0f MB)\n"
           "so the weights come from memory as for distinct experts; GB/s = weight bytes per call / best time;\n"
           "%% of read BW is against the bandwidth measured with the same thread count.\n\n",
           ncopies, (double)(ncopies * cases[1].bytes) / 1e6);
    printf("| kernel | shape (rows x cols) | weight MB | level | threads | ms/call best | ms/call median | GB/s "
           "| %% of read BW | GFLOP/s | %% of FMA peak |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int ci = 0; ci < NCASES; ci++)
        for (int li = 0; li < nlv; li++)
            for (int ti = 0; ti < nthr_cases; ti++) {
                const bench_case *c = &cases[ci];
                const bench_result *r = &res[ci][li][ti];
                if (r->ms == 0) continue;
                size_t rows = c->is_mxfp4 ? c->m[0].rows : c->d.rows, cols = c->is_mxfp4 ? c->m[0].cols : c->d.cols;
                printf("| %s | %zu x %zu | %.2f | %s | %d | %.3f | %.3f | %.1f | %.0f %% | %.1f | %.0f %% |\n", c->what,
                       rows, cols, (double)c->bytes / 1e6, lv[li]->name, nthr[ti], r->ms, r->median_ms, r->gbs,
                       100.0 * r->gbs / bw[ti], r->gflops, peak[ti] > 0 ? 100.0 * r->gflops / peak[ti] : 0.0);
            }
    omp_set_num_threads(nthr_all);

    for (int ci = 1; ci < 3; ci++) {
        for (size_t e = 0; e < ncopies; e++) {
            free((void *)cases[ci].m[e].packed);
            free((void *)cases[ci].m[e].scales);
            free((void *)cases[ci + 6].m[e].packed);
        }
        free(cases[ci].m);
        free(cases[ci + 6].m);
    }
    free(wb);
    free(bwbuf);
    free(x);
    free(y);
    free(y2);
    return 0;
}
