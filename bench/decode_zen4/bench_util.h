/* bench_util.h - what the Zen 4 decode harnesses (harness.c, tiled.c; outside the build) share:
 * the includes, a monotonic clock, a SplitMix64 generator, the contract's 8-lane reduction of a
 * register, and the byte kernel's vpermi2b indices (k3_rows_bf16_xsb16_avx512's). */
#ifndef K3_BENCH_DECODE_ZEN4_UTIL_H
#define K3_BENCH_DECODE_ZEN4_UTIL_H
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/kernels_impl.h"
#include "common/weight_mem.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static uint64_t rng(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline float red8(__m512d a) {
    double l[8];
    _mm512_storeu_pd(l, a);
    return k3_reduce8(l);
}

/* qword l of index j takes byte 5 = T byte 2(8j + l), byte 6 = T byte 2(8j + l) + 1, byte 7 = U
 * byte 2(8j + l) + 1 (vpermi2b: index bit 6 picks U); bytes 0..4 are zeroed by the mask */
static inline __m512i b3_idx(int j) {
    char b[64];
    for (int l = 0; l < 8; l++) {
        int wd = 8 * j + l;
        for (int k = 0; k < 5; k++) b[8 * l + k] = 0;
        b[8 * l + 5] = (char)(2 * wd);
        b[8 * l + 6] = (char)(2 * wd + 1);
        b[8 * l + 7] = (char)(64 + 2 * wd + 1);
    }
    return _mm512_loadu_si512(b);
}

#endif
