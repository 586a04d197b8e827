/* tiled_shift.c - the one-token bf16 shift kernel (k3_rows_bf16_xs16_avx512's operations, the
 * kernel Intel and Zen 5 get) on row-major rows against the same operations on a tiled copy
 * (thirteenth session, Zen 5), outside the build:
 *   cc -O2 -fopenmp -ffp-contract=off -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx2 -mfma -I. \
 *      bench/decode_zen4/tiled_shift.c build/libk3.a -lm -o /tmp/tiled_shift
 *   flock /work/bench.lock /tmp/tiled_shift [reps]
 * Tiled as in tiled.c: each 16-row job's 16 x n block stored as 64-byte pieces, piece (c * 16 + r)
 * = row r, columns 32c .. 32c + 31: one sequential stream a job instead of 16. 12288 x 7168 from
 * memory (weight_mem_alloc, like the engine's trunk), jobs of 16 rows, schedule(dynamic, 4);
 * variants alternated call by call, every output compared with the library kernel's bits.
 * GB/s of weight bytes, best / median, at 1 and 2 threads. */
#include "bench/decode_zen4/bench_util.h"

typedef void (*bf_fn)(const uint16_t *w, const double *xs, size_t n, float *o);

static inline __m512d xs8(__m512i v, __m512i perm) { /* kernels_avx512.c bf16_xs8 */
    const __m512i keep = _mm512_set1_epi64((long long)0x8fffffffffffffffull);
    const __m512i q = _mm512_maskz_permutexvar_epi16((__mmask32)0x88888888u, perm, v);
    return _mm512_castsi512_pd(_mm512_and_si512(_mm512_srai_epi64(q, 3), keep));
}

/* the 16 rows of a tiled job: piece (c * 16 + r); PF bytes ahead in the one stream (0: none) */
#define TILED16(NAME, PF)                                                                                   \
    static void NAME(const uint16_t *w, const double *xs, size_t n, float *o) {                             \
        const __m512i p0 = _mm512_set_epi16(7, 0, 0, 0, 6, 0, 0, 0, 5, 0, 0, 0, 4, 0, 0, 0, 3, 0, 0, 0, 2, 0,  \
                                            0, 0, 1, 0, 0, 0, 0, 0, 0, 0);                                   \
        const __m512i p1 = _mm512_set_epi16(15, 0, 0, 0, 14, 0, 0, 0, 13, 0, 0, 0, 12, 0, 0, 0, 11, 0, 0, 0,  \
                                            10, 0, 0, 0, 9, 0, 0, 0, 8, 0, 0, 0);                            \
        __m512d a[16];                                                                                      \
        _Pragma("GCC unroll 16") for (int r = 0; r < 16; r++) a[r] = _mm512_setzero_pd();                   \
        for (size_t i = 0; i < n; i += 32) {                                                                \
            const uint16_t *blk = w + i * 16;                                                               \
            if (PF) {                                                                                       \
                _Pragma("GCC unroll 16") for (int r = 0; r < 16; r++)                                       \
                    _mm_prefetch((const char *)(blk + r * 32) + (PF), _MM_HINT_T0);                         \
            }                                                                                               \
            const __m512d x0 = _mm512_loadu_pd(xs + i), x1 = _mm512_loadu_pd(xs + i + 8),                  \
                          x2 = _mm512_loadu_pd(xs + i + 16), x3 = _mm512_loadu_pd(xs + i + 24);             \
            _Pragma("GCC unroll 16") for (int r = 0; r < 16; r++) {                                         \
                const __m512i lo = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + r * 32))); \
                const __m512i hi = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + r * 32 + 16))); \
                a[r] = _mm512_fmadd_pd(xs8(lo, p0), x0, a[r]);                                              \
                a[r] = _mm512_fmadd_pd(xs8(lo, p1), x1, a[r]);                                              \
                a[r] = _mm512_fmadd_pd(xs8(hi, p0), x2, a[r]);                                              \
                a[r] = _mm512_fmadd_pd(xs8(hi, p1), x3, a[r]);                                              \
            }                                                                                               \
        }                                                                                                   \
        _Pragma("GCC unroll 16") for (int r = 0; r < 16; r++) o[r] = red8(a[r]);                            \
    }
TILED16(ti16, 0)
TILED16(ti16_pf1k, 1024)
TILED16(ti16_pf2k, 2048)
TILED16(ti16_pf4k, 4096)
TILED16(ti16_pf8k, 8192)

static void lib16(const uint16_t *w, const double *xs, size_t n, float *o) { k3_rows_bf16_xs16_avx512(w, xs, n, o); }

typedef struct {
    const char *name;
    bf_fn fn;
    int tiled;
} var;
static const var V[] = {{"lib xs16 rows", lib16, 0}, {"tiled16", ti16, 1}, {"tiled16 1 KiB ahead", ti16_pf1k, 1},
                        {"tiled16 2 KiB ahead", ti16_pf2k, 1}, {"tiled16 4 KiB ahead", ti16_pf4k, 1},
                        {"tiled16 8 KiB ahead", ti16_pf8k, 1}};
#define NV (sizeof V / sizeof V[0])

static void run(const var *v, const uint16_t *w, size_t rows, size_t n, const double *xs, float *y) {
#pragma omp parallel for schedule(dynamic, 4)
    for (size_t j = 0; j < rows / 16; j++) v->fn(w + j * 16 * n, xs, n, y + j * 16);
}
static int cmpd(const void *a, const void *b) {
    const double x = *(const double *)a, z = *(const double *)b;
    return x < z ? -1 : x > z;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 15;
    const size_t rows = 12288, n = 7168;
    uint16_t *w = weight_mem_alloc(rows * n * 2), *t16 = weight_mem_alloc(rows * n * 2);
    double *xs = aligned_alloc(64, n * 8), *t = malloc(sizeof(double) * NV * (size_t)(reps > 0 ? reps : 1));
    float *y = aligned_alloc(64, rows * 4), *ref = aligned_alloc(64, rows * 4);
    if (!w || !t16 || !xs || !t || !y || !ref || reps < 1) {
        fprintf(stderr, "tiled_shift: out of memory or bad reps\n");
        return 1;
    }
    uint64_t s = 1;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < rows * n; i++) {
        uint64_t q = i * 0x9e3779b97f4a7c15ull;
        const uint64_t r = rng(&q);
        w[i] = (uint16_t)(((r >> 16) & 0x8000) | (0x3c00 + (r & 0x07ff)));
    }
    for (size_t i = 0; i < n; i++) xs[i] = (double)(float)((double)(rng(&s) >> 11) * 0x1p-53 - 0.5) * K3_BF16_XS_SCALE;
#pragma omp parallel for schedule(static)
    for (size_t j = 0; j < rows / 16; j++)
        for (size_t c = 0; c < n / 32; c++)
            for (size_t r = 0; r < 16; r++) memcpy(t16 + j * 16 * n + (c * 16 + r) * 32, w + (j * 16 + r) * n + c * 32, 64);
    for (int th = 1; th <= 2; th++) {
        omp_set_num_threads(th);
        run(&V[0], w, rows, n, xs, ref);
        for (size_t v = 0; v < NV; v++) {
            memset(y, 0, rows * 4);
            run(&V[v], V[v].tiled ? t16 : w, rows, n, xs, y);
            if (memcmp(y, ref, rows * 4)) printf("MISMATCH %s\n", V[v].name);
        }
        for (int r = 0; r < reps; r++)
            for (size_t v = 0; v < NV; v++) {
                const double t0 = now_s();
                run(&V[v], V[v].tiled ? t16 : w, rows, n, xs, y);
                t[v * (size_t)reps + (size_t)r] = now_s() - t0;
            }
        printf("bf16 shift kernel %zu x %zu, %d thread(s), %d alternated calls: GB/s best / median\n", rows, n, th, reps);
        for (size_t v = 0; v < NV; v++) {
            qsort(t + v * (size_t)reps, (size_t)reps, sizeof *t, cmpd);
            const double gb = (double)rows * (double)n * 2 / 1e9;
            printf("  %-22s %6.1f / %6.1f\n", V[v].name, gb / t[v * (size_t)reps], gb / t[v * (size_t)reps + (size_t)reps / 2]);
        }
    }
    return 0;
}
