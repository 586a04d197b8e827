/* fma_chains.h - the double FMA peak's loops (bench_kernels --ceilings, bench/gemm_parts/loop_limits.c):
 * 12 independent FMA chains held in registers (enough to cover the FMA latency on every x86 core
 * since Haswell), iters FMAs each; fma_chains on 4-wide AVX2 vectors, fma_chains512 on 8-wide
 * AVX-512 ones (call it only where the CPU has AVX-512F). Returns a sum of the chains (a sink for
 * the caller, so the loop is not optimised away). GFLOP/s = 12 x lanes x 2 x iters / seconds. */
#ifndef K3_BENCH_FMA_CHAINS_H
#define K3_BENCH_FMA_CHAINS_H
#include <immintrin.h>

__attribute__((target("avx2,fma"), unused)) static double fma_chains(long iters) {
    __m256d a[12], m = _mm256_set1_pd(0.999999), c = _mm256_set1_pd(1e-7);
    for (int j = 0; j < 12; j++) a[j] = _mm256_set1_pd(1.0 + j);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int j = 0; j < 12; j++) a[j] = _mm256_fmadd_pd(a[j], m, c);
    }
    __m256d s = a[0];
    for (int j = 1; j < 12; j++) s = _mm256_add_pd(s, a[j]);
    double l[4];
    _mm256_storeu_pd(l, s);
    return l[0] + l[1] + l[2] + l[3];
}
/* the same with 512-bit registers (8 lanes per FMA), for CPUs with AVX-512F */
__attribute__((target("avx512f"), unused)) static double fma_chains512(long iters) {
    __m512d a[12], m = _mm512_set1_pd(0.999999), c = _mm512_set1_pd(1e-7);
    for (int j = 0; j < 12; j++) a[j] = _mm512_set1_pd(1.0 + j);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int j = 0; j < 12; j++) a[j] = _mm512_fmadd_pd(a[j], m, c);
    }
    __m512d s = a[0];
    for (int j = 1; j < 12; j++) s = _mm512_add_pd(s, a[j]);
    return _mm512_reduce_add_pd(s);
}

#endif
