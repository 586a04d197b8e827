/* streams.c - read bandwidth by access pattern (thirteenth session, Zen 5), outside the build:
 *   cc -O2 -mavx512f -fopenmp bench/decode_zen4/streams.c -o /tmp/streams
 *   flock /work/bench.lock /tmp/streams
 * For 1 and 2 threads over 1 GiB (2 MiB aligned, written once): S = 1..32 independent streams
 * per thread (each thread's static share split into S parts read interleaved, 64 bytes of each
 * per step: bench_kernels --ceilings' pattern), and jobs of R = 8 / 16 rows of 14336 bytes (a
 * 7168-column bf16 row), the R rows read interleaved 64 bytes at a time, jobs handed out
 * dynamically 4 at a time: the one-token bf16 kernels' pattern (k3_rows_bf16_xs16_avx512 reads
 * 16 rows a job). Each with and without a software prefetch 512 bytes ahead in every stream.
 * GB/s, best of 3. On the Zen 5 guest: 2 threads 47-50 GB/s with 2-4 streams a thread,
 * 34-36 with 16-row jobs (docs/PERFORMANCE.md "Thirteenth session"). */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* one 64-byte line of the stream at p into a (pf: bytes ahead prefetched, 0: none) */
static inline __m512i read_line(__m512i a, const uint8_t *p, int pf) {
    if (pf) _mm_prefetch((const char *)p + pf, _MM_HINT_T0);
    return _mm512_add_epi64(a, _mm512_load_si512((const void *)p));
}
static inline uint64_t lane0(__m512i a) {
    uint64_t l[8];
    _mm512_storeu_si512((void *)l, a);
    return l[0];
}
/* GB/s of one timed pass of `bytes` started at t0, the better of it and best (total: the sum,
 * kept so that the reads are not optimised away) */
static double better(double best, size_t bytes, double t0, uint64_t total) {
    const double dt = now_s() - t0;
    if (total == 42) fprintf(stderr, " ");
    return (double)bytes / dt / 1e9 > best ? (double)bytes / dt / 1e9 : best;
}

/* S streams per thread; pf: bytes ahead prefetched in each (0: none) */
static double streams_bw(const uint8_t *buf, size_t n, int S, int pf) {
    double best = 0;
    for (int r = 0; r < 3; r++) {
        uint64_t total = 0;
        const double t0 = now_s();
#pragma omp parallel reduction(+ : total)
        {
            const size_t nt = (size_t)omp_get_num_threads(), me = (size_t)omp_get_thread_num();
            const size_t share = n / 64 / nt, part = share / (size_t)S;
            const uint8_t *b0 = buf + me * share * 64;
            __m512i a = _mm512_setzero_si512();
            for (size_t i = 0; i < part; i++)
                for (int s = 0; s < S; s++) a = read_line(a, b0 + ((size_t)s * part + i) * 64, pf);
            total += lane0(a);
        }
        best = better(best, n, t0, total);
    }
    return best;
}

/* jobs of R rows x C bytes (rows contiguous), schedule(dynamic, 4) */
static double rows_bw(const uint8_t *buf, size_t n, int R, size_t C, int pf) {
    const size_t job = (size_t)R * C, nj = n / job;
    double best = 0;
    for (int r = 0; r < 3; r++) {
        uint64_t total = 0;
        const double t0 = now_s();
#pragma omp parallel for schedule(dynamic, 4) reduction(+ : total)
        for (size_t j = 0; j < nj; j++) {
            const uint8_t *b = buf + j * job;
            __m512i a = _mm512_setzero_si512();
            for (size_t c = 0; c < C; c += 64)
                for (int q = 0; q < R; q++) a = read_line(a, b + (size_t)q * C + c, pf);
            total += lane0(a);
        }
        best = better(best, nj * job, t0, total);
    }
    return best;
}

int main(void) {
    const size_t n = (size_t)1 << 30;
    uint8_t *buf = aligned_alloc((size_t)2 << 20, n);
    if (!buf) {
        fprintf(stderr, "streams: out of memory\n");
        return 1;
    }
    memset(buf, 1, n);
    for (int th = 1; th <= 2; th++) {
        omp_set_num_threads(th);
        for (int S = 1; S <= 32; S *= 2)
            printf("%d thread(s), %2d streams a thread: %5.1f GB/s (prefetch 512 B ahead: %5.1f)\n", th, S,
                   streams_bw(buf, n, S, 0), streams_bw(buf, n, S, 512));
        for (int R = 8; R <= 16; R *= 2)
            printf("%d thread(s), jobs of %2d rows x 14336 B: %5.1f GB/s (prefetch 512 B ahead: %5.1f)\n", th, R,
                   rows_bw(buf, n, R, 14336, 0), rows_bw(buf, n, R, 14336, 512));
    }
    free(buf);
    return 0;
}
