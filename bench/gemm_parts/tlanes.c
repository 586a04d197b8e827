/* tlanes.c - a prefill gemm prototype with the TOKENS in the register lanes
 * (measured and dropped, docs/PERFORMANCE.md "Sixteenth session"; Intel Xeon
 * VM; outside the build):
 *   cc -O2 -std=gnu11 -ffp-contract=off -I. -march=native -fopenmp -DKC=256
 * -DTBT=72 -DPFS -DWITH_K3 \ bench/gemm_parts/tlanes.c build/libk3.a -lm -o
 * /tmp/tlk OMP_NUM_THREADS=1 flock /work/bench.lock /tmp/tlk [rows cols tokens
 * reps]    (tokens % TBT == 0) The contract's partition (kernels.h: element i
 * into lane i % 8 of eight double accumulators, sequentially in i) does not say
 * the eight lanes of one dot share a register. Here lane l of the dots of 8
 * rows x 24 tokens is 24 registers, each holding 8 TOKENS (acc[r][v] = lane l
 * of row r, tokens 8v..8v+7): per column i = 8s + l, three vector loads of the
 * activations (xt: double, token-contiguous, built once per call for all
 * panels) and eight broadcast weights (a row group's tile wt: double, decoded
 * without a transpose, [step][row][lane], 16 KiB at KC 256, in L1 for the 8
 * lanes x 3 token groups of passes), 24 FMAs. A pass runs one lane over the KC
 * / 8 steps of a column block. The lanes of a dot are reduced at the end as the
 * contract says. Prints: the bits against the scalar partition (sampled); the
 * micro-kernel alone in L1; with WITH_K3 the engine's k3_gemm_bf16_avx512
 * (K3_GEMM_DOUBLE) on the same data (bits compared) and both alternated,
 * weights cycled through 768 MiB; then this gemm whole, without its weight
 * decode (timing only) and with the passes ordered so the activations stay in
 * L1 (timing only). Options: -DPFS spreads the next column block's weight lines
 * over the passes as prefetches, -DPFA prefetches the next pass's accumulators,
 * -DPFX=n the activations n steps ahead. */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/fma_chains.h"
#ifdef WITH_K3
#include "common/kernels_impl.h" /* the engine's gemm, linked from build/libk3.a, for an A/B in one run */
#endif

#ifndef KC
#define KC 512 /* columns per column block */
#endif
#define S (KC / 8) /* steps of a lane pass */
#ifndef NPR
#define NPR 48 /* rows per panel (6 row groups of 8) */
#endif
#ifndef TBT
#define TBT 72 /* tokens per token block (3 sub-blocks of 24) */
#endif
#define NG (NPR / 8)
#define NJ (TBT / 24)

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static float bf16f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float ref_dot(const uint16_t *w, const float *x, size_t n) {
    double l[8] = {0};
    for (size_t i = 0; i < n; i++) l[i % 8] += (double)bf16f(w[i]) * (double)x[i];
    return (float)(((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])));
}

/* in-place 8 x 8 transpose of doubles: r[i][j] -> r[j][i] */
static inline void tr8(__m512d r[8]) {
    __m512d a[8], b[8];
    for (int i = 0; i < 8; i += 2) {
        a[i] = _mm512_unpacklo_pd(r[i], r[i + 1]);
        a[i + 1] = _mm512_unpackhi_pd(r[i], r[i + 1]);
    }
    const __m512i lo2 = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13),
                  hi2 = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    /* b0: col 0|4 rows 0-3, b1: col 1|5, b2: col 2|6, b3: col 3|7 (rows 0-3);
     * b4..b7 rows 4-7 */
    b[0] = _mm512_permutex2var_pd(a[0], lo2, a[2]);
    b[1] = _mm512_permutex2var_pd(a[1], lo2, a[3]);
    b[2] = _mm512_permutex2var_pd(a[0], hi2, a[2]);
    b[3] = _mm512_permutex2var_pd(a[1], hi2, a[3]);
    b[4] = _mm512_permutex2var_pd(a[4], lo2, a[6]);
    b[5] = _mm512_permutex2var_pd(a[5], lo2, a[7]);
    b[6] = _mm512_permutex2var_pd(a[4], hi2, a[6]);
    b[7] = _mm512_permutex2var_pd(a[5], hi2, a[7]);
    for (int c = 0; c < 4; c++) {
        r[c] = _mm512_shuffle_f64x2(b[c], b[c + 4], 0x44);
        r[c + 4] = _mm512_shuffle_f64x2(b[c], b[c + 4], 0xEE);
    }
}

static inline __m512d bf16x8d(const uint16_t *p) {
    return _mm512_cvtps_pd(
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16)));
}

/* one row group's tile: wt[(s * 8 + r) * 8 + l] = W[r0 + r][k0 + 8s + l] */
static void decode_w(const uint16_t *w, size_t cols, size_t r0, size_t k0, double *wt) {
    for (int s = 0; s < S; s++)
        for (int r = 0; r < 8; r++)
            _mm512_store_pd(wt + ((size_t)s * 8 + r) * 8, bf16x8d(w + (r0 + r) * cols + k0 + 8 * (size_t)s));
}

/* all token blocks and column blocks: block (tb, kb) at xt + (tb * nkb + kb) *
 * TBT * KC, inside it
 * [(j * 8 + l) * S + s][24 tokens] = x[tb * TBT + 24j + t][kb * KC + 8s + l] */
static void build_xt(const float *x, size_t cols, size_t ntok, double *xt) {
    const size_t nkb = cols / KC;
#pragma omp parallel for collapse(2) schedule(static)
    for (size_t tb = 0; tb < ntok / TBT; tb++)
        for (size_t kb = 0; kb < nkb; kb++)
            for (int tg = 0; tg < TBT; tg += 8)
                for (int s = 0; s < S; s++) {
                    __m512d v[8];
                    for (int t = 0; t < 8; t++)
                        v[t] =
                            _mm512_cvtps_pd(_mm256_loadu_ps(x + (tb * TBT + tg + t) * cols + kb * KC + 8 * (size_t)s));
                    tr8(v);
                    double *o = xt + (tb * nkb + kb) * TBT * KC + (size_t)(tg / 24) * 8 * S * 24 + tg % 24;
                    for (int l = 0; l < 8; l++) _mm512_store_pd(o + ((size_t)l * S + s) * 24, v[l]);
                }
}

/* acc[((row) * 8 + l) * TBT + t]: lane l of rows 8g..8g+7, tokens 24j..24j+23,
 * over one pass */
static inline void micro(const double *wt, const double *xt, double *acc, const double *nacc) {
    __m512d a[8][3];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++)
#pragma GCC unroll 3
        for (int v = 0; v < 3; v++) a[r][v] = _mm512_load_pd(acc + (size_t)r * 8 * TBT + 8 * v);
#ifdef PFA
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++)
#pragma GCC unroll 3
        for (int v = 0; v < 3; v++) _mm_prefetch((const char *)(nacc + (size_t)r * 8 * TBT + 8 * v), _MM_HINT_T0);
#else
    (void)nacc;
#endif
    for (int s = 0; s < S; s++) {
#ifdef PFX
        _mm_prefetch((const char *)(xt + (size_t)(s + PFX) * 24), _MM_HINT_T0);
        _mm_prefetch((const char *)(xt + (size_t)(s + PFX) * 24 + 8), _MM_HINT_T0);
        _mm_prefetch((const char *)(xt + (size_t)(s + PFX) * 24 + 16), _MM_HINT_T0);
#endif
        const __m512d x0 = _mm512_load_pd(xt + (size_t)s * 24), x1 = _mm512_load_pd(xt + (size_t)s * 24 + 8),
                      x2 = _mm512_load_pd(xt + (size_t)s * 24 + 16);
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            const __m512d b = _mm512_set1_pd(wt[(s * 8 + r) * 8]);
            a[r][0] = _mm512_fmadd_pd(b, x0, a[r][0]);
            a[r][1] = _mm512_fmadd_pd(b, x1, a[r][1]);
            a[r][2] = _mm512_fmadd_pd(b, x2, a[r][2]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++)
#pragma GCC unroll 3
        for (int v = 0; v < 3; v++) _mm512_store_pd(acc + (size_t)r * 8 * TBT + 8 * v, a[r][v]);
}

/* one panel of NPR rows, all tokens, from the call's xt (build_xt). mode 1:
 * decode each row group's tile only the first time (timing only) */
static void gemm_panel(const uint16_t *w, size_t cols, size_t r0, const double *xt, size_t ntok, float *y, size_t rows,
                       double *ws, int mode) {
    double *acc = ws, *wt = acc + (size_t)NPR * 8 * TBT;
    const size_t nkb = cols / KC;
    int first = 1;
    for (size_t tb = 0; tb < ntok / TBT; tb++) {
        memset(acc, 0, sizeof(double) * NPR * 8 * TBT);
        for (size_t kb = 0; kb < nkb; kb++) {
            const double *xb = xt + (tb * nkb + kb) * TBT * KC;
            if (mode == 2) { /* timing only: one tile, passes (l, j) outer, row groups
                                inner: xt from L1 */
                if (first) decode_w(w, cols, r0, kb * KC, wt);
                first = 0;
                for (int l = 0; l < 8; l++)
                    for (int j = 0; j < NJ; j++)
                        for (int g = 0; g < NG; g++)
                            micro(wt + l, xb + ((size_t)j * 8 + l) * S * 24, acc + ((size_t)g * 64 + l) * TBT + 24 * j,
                                  acc + ((size_t)((g + 1) % NG) * 64 + l) * TBT + 24 * j);
                continue;
            }
            for (int g = 0; g < NG; g++) {
                if (first || !(mode & 1)) decode_w(w, cols, r0 + 8 * (size_t)g, kb * KC, wt);
                first = 0;
#ifdef PFS
                /* the next column block of this row group (or the next token block's
                 * first) */
                const size_t kn = kb + 1 < nkb ? (kb + 1) * KC : (tb + 1 < ntok / TBT ? 0 : cols);
                size_t pl = 0;
                const size_t lpr = KC * 2 / 64, nl = kn < cols ? 8 * lpr : 0, per = (nl + 8 * NJ - 1) / (8 * NJ);
#endif
                for (int l = 0; l < 8; l++)
                    for (int j = 0; j < NJ; j++) {
#ifdef PFS
                        for (size_t q = 0; q < per && pl < nl; q++, pl++)
                            _mm_prefetch(
                                (const char *)(w + (r0 + 8 * (size_t)g + pl / lpr) * cols + kn + (pl % lpr) * 32),
                                _MM_HINT_T0);
#endif
                        const int j2 = (j + 1) % NJ, l2 = j2 ? l : (l + 1) % 8, g2 = (j2 || l2) ? g : (g + 1) % NG;
                        micro(wt + l, xb + ((size_t)j * 8 + l) * S * 24, acc + ((size_t)g * 64 + l) * TBT + 24 * j,
                              acc + ((size_t)g2 * 64 + l2) * TBT + 24 * j2);
                    }
            }
        }
        for (int r = 0; r < NPR; r++)
            for (int t = 0; t < TBT; t++) {
                const double *p = acc + (size_t)r * 8 * TBT + t;
                const double v = ((p[0] + p[TBT]) + (p[2 * TBT] + p[3 * TBT])) +
                                 ((p[4 * TBT] + p[5 * TBT]) + (p[6 * TBT] + p[7 * TBT]));
                y[(tb * TBT + t) * rows + r0 + r] = (float)v;
            }
    }
}

static void gemm(const uint16_t *w, size_t rows, size_t cols, const float *x, size_t ntok, float *y, double *xt,
                 double **ws, int mode) {
    build_xt(x, cols, ntok, xt);
#pragma omp parallel for schedule(dynamic)
    for (size_t p = 0; p < rows / NPR; p++)
        gemm_panel(w, cols, p * NPR, xt, ntok, y, rows, ws[omp_get_thread_num()], mode);
}

int main(int argc, char **argv) {
    const size_t rows = argc > 1 ? strtoul(argv[1], 0, 10) : 3072, cols = argc > 2 ? strtoul(argv[2], 0, 10) : 7168,
                 ntok = argc > 3 ? strtoul(argv[3], 0, 10) : 144;
    const int reps = argc > 4 ? atoi(argv[4]) : 3;
    if (rows % NPR || cols % KC || ntok % TBT) {
        fprintf(stderr, "rows %% %d, cols %% %d, tokens %% %d must be 0\n", NPR, KC, TBT);
        return 2;
    }
    const size_t ncopy = (768u << 20) / (rows * cols * 2) + 1;
    uint16_t *w = aligned_alloc(64, ncopy * rows * cols * 2);
    float *x = aligned_alloc(64, ntok * cols * 4), *y = aligned_alloc(64, ntok * rows * 4);
    srand(1);
    for (size_t i = 0; i < rows * cols; i++) {
        const float f = (float)((rand() / (double)RAND_MAX - 0.5) * 0.1);
        uint32_t u;
        memcpy(&u, &f, 4);
        w[i] = (uint16_t)(u >> 16);
    }
    for (size_t c = 1; c < ncopy; c++) memcpy(w + c * rows * cols, w, rows * cols * 2);
    for (size_t i = 0; i < ntok * cols; i++) x[i] = (float)((rand() / (double)RAND_MAX - 0.5) * 4);
    const size_t wsd = (size_t)NPR * 8 * TBT + (size_t)8 * KC;
    double *xt = aligned_alloc(64, ntok * cols * 8);
    const int nth = omp_get_max_threads();
    double **ws = malloc(sizeof(double *) * nth);
    for (int i = 0; i < nth; i++) ws[i] = aligned_alloc(64, wsd * 8);
    /* bits */
    gemm(w, rows, cols, x, ntok, y, xt, ws, 0);
    size_t bad = 0;
    for (size_t t = 0; t < ntok; t += 7)
        for (size_t r = 0; r < rows; r += 3) {
            const float e = ref_dot(w + r * cols, x + t * cols, cols);
            if (memcmp(&e, &y[t * rows + r], 4)) bad++;
        }
    printf("bits: %zu mismatches (sampled)\n", bad);
    double sink = 0, peak = 0;
    for (int r = 0; r < 3; r++) {
        const double t0 = now_s();
        double s1 = 0;
#pragma omp parallel reduction(+ : s1)
        s1 += fma_chains512(20000000);
        sink += s1;
        const double g = (double)nth * 20000000 * 12 * 8 * 2 / (now_s() - t0) / 1e9;
        if (g > peak) peak = g;
    }
    printf("threads %d, %zu x %zu x %zu tokens, KC %d NPR %d TBT %d; FMA peak "
           "%.1f GFLOP/s\n",
           nth, rows, cols, ntok, KC, NPR, TBT, peak);
    {
        double *a0 = ws[0], *wt0 = a0 + (size_t)NPR * 8 * TBT, *xt0 = xt;
        const long passes = 200000;
        double best = 1e30;
        for (int k = 0; k < 3; k++) {
            const double t0 = now_s();
            for (long q = 0; q < passes; q++) micro(wt0 + q % 8, xt0 + (q % 4 / 2) * S * 24, a0 + (q % 8) * 24, a0);
            const double t = now_s() - t0;
            if (t < best) best = t;
        }
        const double g = 2.0 * passes * S * 24 * 8 / best / 1e9;
        printf("%-12s %7.1f GFLOP/s  %3.0f %% of the peak (one thread, L1)\n", "micro alone", g, 100 * g / peak);
    }
    {
        double *wt0 = ws[0] + (size_t)NPR * 8 * TBT;
        double best = 1e30;
        for (int k = 0; k < 3; k++) {
            const double t0 = now_s();
            for (int q = 0; q < 2000; q++) decode_w(w, cols, 0, 0, wt0);
            const double t = now_s() - t0;
            if (t < best) best = t;
        }
        printf("decode_w hot: %.2f ns per weight\n", best / 2000 / (8 * KC) * 1e9);
    }
    {
        double best = 1e30;
        for (int k = 0; k < 3; k++) {
            const double t0 = now_s();
            build_xt(x, cols, ntok, xt);
            const double t = now_s() - t0;
            if (t < best) best = t;
        }
        printf("build_xt: %.2f ms (%.1f %% of the whole gemm at the peak)\n", best * 1e3,
               100 * best / (2.0 * rows * cols * ntok / (peak * 1e9)));
    }
#ifdef WITH_K3
    {
        double **ws2 = malloc(sizeof(double *) * nth);
        for (int i = 0; i < nth; i++) ws2[i] = aligned_alloc(64, k3_gemm_ws_doubles_avx512() * 8);
        float *y2 = aligned_alloc(64, ntok * rows * 4);
        const size_t np = (rows + K3_GEMM_NR_AVX512 - 1) / K3_GEMM_NR_AVX512;
#pragma omp parallel for schedule(dynamic)
        for (size_t p = 0; p < np; p++)
            k3_gemm_bf16_avx512(w, rows, cols, p * K3_GEMM_NR_AVX512, K3_GEMM_NR_AVX512, x, ntok, y2,
                                ws2[omp_get_thread_num()], K3_GEMM_DOUBLE);
        printf("engine gemm vs this one: %s\n", memcmp(y, y2, ntok * rows * 4) ? "DIFFERENT BITS" : "same bits");
        double bk = 1e30, bt = 1e30;
        for (int k = 0; k < reps; k++) {
            const uint16_t *wk = w + (size_t)(k % ncopy) * rows * cols;
            double t0 = now_s();
#pragma omp parallel for schedule(dynamic)
            for (size_t p = 0; p < np; p++)
                k3_gemm_bf16_avx512(wk, rows, cols, p * K3_GEMM_NR_AVX512, K3_GEMM_NR_AVX512, x, ntok, y2,
                                    ws2[omp_get_thread_num()], K3_GEMM_DOUBLE);
            double t = now_s() - t0;
            if (t < bk) bk = t;
            wk = w + (size_t)((k + reps) % ncopy) * rows * cols;
            t0 = now_s();
            gemm((const uint16_t *)wk, rows, cols, x, ntok, y, xt, ws, 0);
            t = now_s() - t0;
            if (t < bt) bt = t;
        }
        const double fl = 2.0 * rows * cols * ntok / 1e9;
        printf("alternated %d times: engine (double) %.1f GFLOP/s %3.0f %%, token "
               "lanes %.1f GFLOP/s %3.0f %% (%.2fx)\n",
               reps, fl / bk, 100 * fl / bk / peak, fl / bt, 100 * fl / bt / peak, bk / bt);
    }
#endif
    static const char *names[] = {"whole gemm", "no w decode", "xt from L1"};
    for (int mode = 0; mode < 3; mode++) {
        double best = 1e30;
        for (int k = 0; k < reps; k++) {
            const double t0 = now_s();
            gemm(w + (size_t)(k % ncopy) * rows * cols, rows, cols, x, ntok, y, xt, ws, mode);
            const double t = now_s() - t0;
            if (t < best) best = t;
        }
        const double g = 2.0 * rows * cols * ntok / best / 1e9;
        printf("%-12s %7.1f GFLOP/s  %3.0f %% of the peak\n", names[mode], g, 100 * g / peak);
    }
    if (sink == 42) puts("");
    return 0;
}
