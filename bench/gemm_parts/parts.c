/* parts.c - the AVX-512 prefill gemm (common/kernels_gemm_avx512.c, included as source) taken
 * apart, outside the build (twelfth session, Intel Xeon VM):
 *   cc -O2 -std=gnu11 -ffp-contract=off -I. -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx2 -mfma \
 *      bench/gemm_parts/parts.c build/libk3.a -lm -fopenmp -o /tmp/parts
 *   flock /work/bench.lock /tmp/parts [ROWS COLS TOKENS]
 * Prints GFLOP/s of one thread for
 *   micro 4x6       the 4-row x 6-token micro-kernel alone, the same 32 steps of one KC block
 *                   again and again (its weights, activations and accumulators in L1);
 *   sub-tile nt=6   token_groups_f64 over a 12-row double sub-tile and 6 tokens (all in L1);
 *   sub-tile nt=66  the same over 66 tokens (the activations and accumulators in L2);
 *   gemm widen / double  k3_gemm_bf16_avx512 and k3_gemm_mxfp4_avx512 over ROWS x COLS (default
 *                   3072 x 7168: 44 MB of bf16, from memory) and TOKENS (128) in 96-row panels,
 *                   both k3_gemm_weights.
 * -DK3_PARTS_SRC='"FILE"' includes a timing variant of the kernel source instead
 * (bench/gemm_parts/variants.py: the decode or the activations' conversion skipped, or rdtsc
 * around the parts, printed with -DK3_PARTS_TSC).
 * Compile-time knobs of the kernel source (-DKC=, -DTB=, -DNS=, -DPF_HINT=, -DK3_GEMM_NR_AVX512=)
 * change the blocking for a sweep; the results of the twelfth session's sweep are in
 * docs/PERFORMANCE.md ("Twelfth session"). Compare only runs alternated in one hold. */
#ifndef K3_PARTS_SRC
#define K3_PARTS_SRC "common/kernels_gemm_avx512.c" /* or a variant of it: bench/gemm_parts/variants.py */
#endif
#include K3_PARTS_SRC
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <x86intrin.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *xalloc(size_t bytes) {
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!p) {
        fprintf(stderr, "parts: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

int main(int argc, char **argv) {
    const size_t rows = argc > 1 ? (size_t)atol(argv[1]) : 3072, cols = argc > 2 ? (size_t)atol(argv[2]) : 7168;
    const size_t ntok = argc > 3 ? (size_t)atol(argv[3]) : 128;
    if (!rows || !cols || cols % 32 || !ntok) {
        fprintf(stderr, "usage: parts [ROWS COLS(%% 32 == 0) TOKENS]\n");
        return 2;
    }
    double *ws = xalloc(k3_gemm_ws_doubles_avx512() * sizeof(double));
    double *acc = ws, *xd = acc + WS_ACC, *wd = xd + WS_XD;
    for (size_t i = 0; i < WS_ACC; i++) acc[i] = 0;
    for (size_t i = 0; i < WS_XD; i++) xd[i] = 1e-3 * (double)(i % 7);
    for (size_t i = 0; i < WS_WD; i++) wd[i] = 1e-3 * (double)(i % 5);
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        const size_t n = 200000;
        const double t0 = now_s();
        for (size_t r = 0; r < n; r++) micro(0, 4, 6, KC, wd, KC, xd, KC / 8, acc);
        const double t = now_s() - t0;
        if (t < best) best = t;
    }
    printf("micro 4x6: %.1f GFLOP/s\n", 2.0 * 200000 * 4 * 6 * KC / best / 1e9);
    static const size_t subt[] = {6, 66};
    for (int i = 0; i < 2; i++) {
        best = 1e30;
        const size_t n = 1200000 / subt[i];
        for (int rep = 0; rep < 5; rep++) {
            const double t0 = now_s();
            for (size_t r = 0; r < n; r++) token_groups_f64(subt[i], NS, wd, xd, KC / 8, acc, NULL);
            const double t = now_s() - t0;
            if (t < best) best = t;
        }
        printf("sub-tile nt=%zu: %.1f GFLOP/s\n", subt[i], 2.0 * (double)n * (double)subt[i] * NS * KC / best / 1e9);
    }
    const size_t nw = rows * cols;
    uint16_t *w = xalloc(nw * 2);
    uint8_t *pk = xalloc(nw / 2), *sc = xalloc(nw / 32);
    float *x = xalloc(ntok * cols * sizeof(float)), *y = xalloc(ntok * rows * sizeof(float));
    for (size_t i = 0; i < nw; i++) w[i] = (uint16_t)(0x3c00 + (i * 7919) % 255);
    for (size_t i = 0; i < nw / 2; i++) pk[i] = (uint8_t)(i * 13);
    for (size_t i = 0; i < nw / 32; i++) sc[i] = (uint8_t)(120 + i % 10);
    for (size_t i = 0; i < ntok * cols; i++) x[i] = (float)(i % 17) * 0.01f;
    const size_t reps = (size_t)(3e9 / (2.0 * (double)nw * (double)ntok)) + 1;
    for (int mx = 0; mx < 2; mx++)
        for (int how = 0; how < 2; how++) {
#ifdef K3_PARTS_TSC
            extern unsigned long long k3_parts_tsc_pw, k3_parts_tsc_s0, k3_parts_tsc_sn, k3_parts_fma_s0, k3_parts_fma_sn;
            k3_parts_tsc_pw = k3_parts_tsc_s0 = k3_parts_tsc_sn = k3_parts_fma_s0 = k3_parts_fma_sn = 0;
            const unsigned long long tsc0 = __rdtsc();
#endif
            best = 1e30;
            for (int rep = 0; rep < 3; rep++) {
                const double t0 = now_s();
                for (size_t q = 0; q < reps; q++)
                    for (size_t r0 = 0; r0 < rows; r0 += NP) {
                        const size_t nr = rows - r0 < NP ? rows - r0 : NP;
                        const k3_gemm_weights hw = how ? K3_GEMM_DOUBLE : K3_GEMM_WIDEN;
                        if (mx) k3_gemm_mxfp4_avx512(pk, sc, rows, cols, r0, nr, x, ntok, y, ws, hw);
                        else k3_gemm_bf16_avx512(w, rows, cols, r0, nr, x, ntok, y, ws, hw);
                    }
                const double t = now_s() - t0;
                if (t < best) best = t;
            }
            printf("gemm %s %s %zu x %zu, %zu tokens: %.1f GFLOP/s\n", mx ? "mxfp4" : "bf16", how ? "double" : "widen",
                   rows, cols, ntok, 2.0 * (double)reps * (double)nw * (double)ntok / best / 1e9);
#ifdef K3_PARTS_TSC
            if (how) { /* the variant's counters cover the double path only */
                const double all = (double)(__rdtsc() - tsc0);
                printf("  TSC share: decode %.1f %%, first sub-tile %.1f %% at %.2f FMAs a TSC cycle, the others %.1f %% at %.2f\n",
                       100.0 * (double)k3_parts_tsc_pw / all, 100.0 * (double)k3_parts_tsc_s0 / all,
                       k3_parts_tsc_s0 ? (double)k3_parts_fma_s0 / (double)k3_parts_tsc_s0 : 0.0,
                       100.0 * (double)k3_parts_tsc_sn / all,
                       k3_parts_tsc_sn ? (double)k3_parts_fma_sn / (double)k3_parts_tsc_sn : 0.0);
            }
#endif
        }
    free(ws), free(w), free(pk), free(sc), free(x), free(y);
    return 0;
}
