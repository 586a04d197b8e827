/* loop_limits.c - how close the prefill gemm's 4-row x 6-token micro-kernel loop
 * (common/kernels_gemm_avx512.c: 24 FMA chains, 4 weight + 6 activation loads of 64 bytes
 * per 8-column step) can come to the double FMA peak on this CPU, by where its loads point
 * (sixteenth session, Intel Xeon VM; outside the build):
 *   cc -O2 -std=gnu11 -I. -mavx512f -mfma bench/gemm_parts/loop_limits.c -o /tmp/loop_limits
 *   flock /work/bench.lock /tmp/loop_limits
 * Prints, for one thread, GFLOP/s and the ratio to the peak measured in the same run (12
 * independent FMA chains in registers, as bench_kernels --ceilings-at):
 *   same line        every load of a step reads one cache line (the loads cost nothing)
 *   w same / x same  one side's 4 (6) loads read one line, the other's distinct lines
 *   rows 2 KiB apart each row / token its own 2 KiB run (the kernel's wd and xd: KC = 256
 *                    doubles per row), a step's 10 lines in two L1 sets
 *   consecutive      a step's 10 lines consecutive (a step-major layout)
 *   + acc in/out     rows 2 KiB apart, the 24 accumulators loaded before and stored after
 *                    each 32 steps (what the kernel's micro() does per column block), the
 *                    same 24 lines every time (each load waits for the store before it)
 *   + acc, 8 tiles   the same, the accumulators of 8 tiles in turn (as the kernel's calls:
 *                    each call's loads independent of the last call's stores; 72 KiB, in L2)
 * All else stays in L1 (30 KiB). Compare only numbers of one run: the host is shared. */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#include "bench/fma_chains.h"

#define KCX 256 /* doubles per row or token run, as the kernel's KC */
#define STEPS (KCX / 8)
static double buf[16 * KCX] __attribute__((aligned(64)));
static double accbuf[8 * 4 * 72 * 8] __attribute__((aligned(64))); /* 8 tiles' accumulators */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}


/* 4 x 6 chains; weights row r at buf + r * WS, activations token t at buf + 8 * KCX + t * XS
 * (XB: x's base; step c CS doubles further on); ACC: the chains go through accbuf every STEPS steps */
#define LOOP(NAME, WS, XB, XS, CS, ACC)                                                                       \
    static double NAME(long reps) {                                                                       \
        __m512d a[4][6];                                                                                  \
        for (int r = 0; r < 4; r++)                                                                       \
            for (int t = 0; t < 6; t++) a[r][t] = _mm512_set1_pd(1e-3 * (r + t));                        \
        for (long q = 0; q < reps; q++) {                                                                 \
            if (ACC)                                                                                      \
                for (int r = 0; r < 4; r++)                                                               \
                    for (int t = 0; t < 6; t++) a[r][t] = _mm512_load_pd(accbuf + ((ACC - 1) * (q % 8) * 4 * 72 + r * 72 + t) * 8);     \
            for (size_t c = 0; c < STEPS; c++) {                                                          \
                __m512d w[4];                                                                             \
                _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) w[r] = _mm512_load_pd(buf + r * (WS) + c * (CS)); \
                _Pragma("GCC unroll 6") for (int t = 0; t < 6; t++) {                                     \
                    __m512d xv = _mm512_load_pd(buf + (XB) + t * (XS) + c * (CS));                     \
                    __asm__("" : "+v"(xv));                                                               \
                    _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) a[r][t] = _mm512_fmadd_pd(w[r], xv, a[r][t]); \
                }                                                                                         \
            }                                                                                             \
            if (ACC)                                                                                      \
                for (int r = 0; r < 4; r++)                                                               \
                    for (int t = 0; t < 6; t++) _mm512_store_pd(accbuf + ((ACC - 1) * (q % 8) * 4 * 72 + r * 72 + t) * 8, a[r][t]);     \
        }                                                                                                 \
        __m512d s = _mm512_setzero_pd();                                                                  \
        for (int r = 0; r < 4; r++)                                                                       \
            for (int t = 0; t < 6; t++) s = _mm512_add_pd(s, a[r][t]);                                    \
        return _mm512_reduce_add_pd(s);                                                                   \
    }
LOOP(same_line, 0, 8 * KCX, 0, 0, 0)
LOOP(w_same, 0, 8 * KCX, KCX, 8, 0)
LOOP(x_same, KCX, 8 * KCX, 0, 8, 0)
LOOP(rows_apart, KCX, 8 * KCX, KCX, 8, 0)
LOOP(consecutive, 8, 32, 8, 80, 0) /* step c: lines 10c .. 10c + 9 */
LOOP(rows_apart_acc, KCX, 8 * KCX, KCX, 8, 1)
LOOP(rows_apart_acc8, KCX, 8 * KCX, KCX, 8, 2)

int main(void) {
    for (int i = 0; i < 16 * KCX; i++) buf[i] = 1e-9 * i;
    for (int i = 0; i < 8 * 4 * 72 * 8; i++) accbuf[i] = 0;
    double sink = 0, peak = 0;
    const long piters = 20000000, reps = 1000000;
    for (int r = 0; r < 3; r++) {
        const double t0 = now_s();
        sink += fma_chains512(piters);
        const double g = (double)piters * 12 * 8 * 2 / (now_s() - t0) / 1e9;
        if (g > peak) peak = g;
    }
    printf("double FMA peak, 1 thread: %.1f GFLOP/s\n", peak);
    static const struct {
        const char *name;
        double (*run)(long);
    } loops[] = {{"same line", same_line},     {"w same", w_same},           {"x same", x_same},
                 {"rows 2 KiB apart", rows_apart}, {"consecutive", consecutive}, {"+ acc in/out", rows_apart_acc},
                 {"+ acc, 8 tiles", rows_apart_acc8}};
    for (size_t k = 0; k < sizeof loops / sizeof loops[0]; k++) {
        double best = 1e30;
        for (int r = 0; r < 5; r++) {
            const double t0 = now_s();
            sink += loops[k].run(reps);
            const double t = now_s() - t0;
            if (t < best) best = t;
        }
        const double g = 2.0 * (double)reps * STEPS * 24 * 8 / best / 1e9;
        printf("%-18s %6.1f GFLOP/s  %3.0f %% of the peak\n", loops[k].name, g, 100.0 * g / peak);
    }
    if (sink == 42) puts("");
    return 0;
}
