/* micro_shapes.c - the tokens-in-lanes micro-kernel (bench/gemm_parts/tlanes.c)
 * at several register shapes, R broadcast weights x V activation vectors (R x V
 * accumulators of 8 tokens), everything in L1 (sixteenth session in
 * docs/PERFORMANCE.md; outside the build): cc -O2 -std=gnu11 -I. -march=native
 * [-DS=32] bench/gemm_parts/micro_shapes.c -o /tmp/micro_shapes flock
 * /work/bench.lock /tmp/micro_shapes S steps per pass (the accumulators loaded
 * before and stored after each pass); prints GFLOP/s and the ratio to the FMA
 * peak of the same run (bench/fma_chains.h). Timing only: the numbers it adds
 * are not checked. */
#include "bench/fma_chains.h"
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
#ifndef S
#define S 32
#endif
static double wt[S * 16 * 8] __attribute__((aligned(64)));
static double xt[S * 64 * 4] __attribute__((aligned(64)));
static double acc[16 * 8 * 64 * 8] __attribute__((aligned(64)));
#define MICRO(NAME, R, V)                                                                                              \
    static void NAME(const double *w, const double *x, double *a0) {                                                   \
        __m512d a[R][V];                                                                                               \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) _Pragma("GCC unroll 8") for (int v = 0; v < V; v++)       \
            a[r][v] = _mm512_load_pd(a0 + (r * 64 + v) * 8);                                                           \
        for (int s = 0; s < S; s++) {                                                                                  \
            __m512d xv[V];                                                                                             \
            _Pragma("GCC unroll 8") for (int v = 0; v < V; v++) xv[v] = _mm512_load_pd(x + (s * V + v) * 8);           \
            _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {                                                     \
                const __m512d b = _mm512_set1_pd(w[(s * R + r) * 8]);                                                  \
                _Pragma("GCC unroll 8") for (int v = 0; v < V; v++) a[r][v] = _mm512_fmadd_pd(b, xv[v], a[r][v]);      \
            }                                                                                                          \
        }                                                                                                              \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) _Pragma("GCC unroll 8") for (int v = 0; v < V; v++)       \
            _mm512_store_pd(a0 + (r * 64 + v) * 8, a[r][v]);                                                           \
    }
MICRO(m8x3, 8, 3)
MICRO(m6x4, 6, 4)
MICRO(m4x6, 4, 6)
MICRO(m12x2, 12, 2)
MICRO(m7x3, 7, 3)
MICRO(m5x4, 5, 4)
MICRO(m3x7, 3, 7)
MICRO(m4x5, 4, 5)

int main(void) {
    for (size_t i = 0; i < sizeof wt / 8; i++) wt[i] = 1e-9 * (double)i;
    for (size_t i = 0; i < sizeof xt / 8; i++) xt[i] = 1e-9 * (double)i;
    double peak = 0, sink = 0;
    for (int r = 0; r < 3; r++) {
        const double t0 = now_s();
        sink += fma_chains512(20000000);
        const double g = 20000000.0 * 12 * 8 * 2 / (now_s() - t0) / 1e9;
        if (g > peak) peak = g;
    }
    printf("double FMA peak, 1 thread: %.1f GFLOP/s; %d steps a pass\n", peak, S);
    static const struct {
        const char *name;
        void (*run)(const double *, const double *, double *);
        int fmas; /* per step */
    } k[] = {{"8x3", m8x3, 24}, {"6x4", m6x4, 24}, {"4x6", m4x6, 24}, {"12x2", m12x2, 24},
             {"7x3", m7x3, 21}, {"5x4", m5x4, 20}, {"3x7", m3x7, 21}, {"4x5", m4x5, 20}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        const long passes = 300000;
        double best = 1e30;
        for (int q = 0; q < 5; q++) {
            const double t0 = now_s();
            for (long p = 0; p < passes; p++) k[i].run(wt + p % 8, xt, acc + (p % 8) * 16 * 64);
            const double t = now_s() - t0;
            if (t < best) best = t;
        }
        const double g = 2.0 * passes * S * k[i].fmas * 8 / best / 1e9;
        printf("%-5s %6.1f GFLOP/s %3.0f %% of the peak\n", k[i].name, g, 100 * g / peak);
    }
    return sink == 42;
}
