/* tiled.c - the bf16 byte kernel (k3_rows_bf16_xsb16_avx512's operations) on a row-major matrix
 * against the same kernel on a "tiled" copy (eighth session, Zen 4), outside the build.
 *   cc -O2 -fopenmp -ffp-contract=off -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx512vbmi -mavx2 -mfma -I. \
 *      bench/decode_zen4/tiled.c build/libk3.a -lm -o /tmp/d5_tiled
 *   flock /work/bench.lock /tmp/d5_tiled [reps] [l2]
 * Tiled: each R-row job's R x n block (the same R * n * 2 bytes as row-major) is stored as
 * 64-byte pieces, piece (c * R + j) = row j, columns 32c .. 32c + 31: one sequential stream a
 * job instead of R. 12288 x 7168 from memory (weight_mem_alloc like the engine's trunk), R = 16
 * and 12, variants alternated call by call, schedule(dynamic, 4) as the coordinator; every
 * output compared with the library's xsb16 bits. GB/s of weight bytes, best / median. */
#include "bench/decode_zen4/bench_util.h"
typedef void (*bf_fn)(const uint16_t *w, const double *xs, size_t n, float *o);

/* TILED 0: row r at w + r * n + i; 1: piece (i / 32) * R + r. PF bytes ahead in the stream(s). */
#define XSB(NAME, R, TILED, PF)                                                                              \
    static void NAME(const uint16_t *w, const double *xs, size_t n, float *o) {                             \
        const __m512i i0 = b3_idx(0), i1 = b3_idx(1), i2 = b3_idx(2), i3 = b3_idx(3);                        \
        const __m512i k8f = _mm512_set1_epi16((short)0x8fff);                                                \
        const __mmask64 m = 0xE0E0E0E0E0E0E0E0ull;                                                           \
        __m512d a[R];                                                                                        \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) a[r] = _mm512_setzero_pd();                     \
        for (size_t i = 0; i < n; i += 32) {                                                                 \
            const uint16_t *blk = TILED ? w + i * R : w + i;                                                 \
            if (PF < 0) { /* the next job's R * n * 2 bytes (contiguous), R lines a step: one sequential stream into L2 */ \
                const char *nx_ = (const char *)(w + (size_t)R * n) + (i / 32) * (size_t)R * 64 * (-(PF));         \
                _Pragma("GCC unroll 16") for (int r = 0; r < R * (-(PF)); r++) _mm_prefetch(nx_ + 64 * r, NXHINT); \
            } else if (PF && TILED) {                                                                               \
                _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                         \
                    _mm_prefetch((const char *)(blk + r * 32) + (PF), _MM_HINT_T0);                          \
            } else if (PF) {                                                                                 \
                _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                         \
                    _mm_prefetch((const char *)(blk + (size_t)r * n) + (PF), _MM_HINT_T0);                   \
            }                                                                                                \
            const __m512d x0 = _mm512_loadu_pd(xs + i), x1 = _mm512_loadu_pd(xs + i + 8),                   \
                          x2 = _mm512_loadu_pd(xs + i + 16), x3 = _mm512_loadu_pd(xs + i + 24);              \
            _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {                                           \
                const __m512i W = _mm512_loadu_si512((const void *)(TILED ? blk + r * 32 : blk + (size_t)r * n)); \
                const __m512i T = _mm512_slli_epi16(W, 5), U = _mm512_and_si512(_mm512_srai_epi16(W, 3), k8f); \
                a[r] = _mm512_fmadd_pd(_mm512_castsi512_pd(_mm512_maskz_permutex2var_epi8(m, T, i0, U)), x0, a[r]); \
                a[r] = _mm512_fmadd_pd(_mm512_castsi512_pd(_mm512_maskz_permutex2var_epi8(m, T, i1, U)), x1, a[r]); \
                a[r] = _mm512_fmadd_pd(_mm512_castsi512_pd(_mm512_maskz_permutex2var_epi8(m, T, i2, U)), x2, a[r]); \
                a[r] = _mm512_fmadd_pd(_mm512_castsi512_pd(_mm512_maskz_permutex2var_epi8(m, T, i3, U)), x3, a[r]); \
            }                                                                                                \
        }                                                                                                    \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) o[r] = red8(a[r]);                              \
    }
#define NXHINT _MM_HINT_T1
XSB(rm16, 16, 0, 0)
XSB(rm16_nx, 16, 0, -1)
XSB(rm12_nx, 12, 0, -1)
XSB(ti16_nx, 16, 1, -1)
#undef NXHINT
#define NXHINT _MM_HINT_T0
XSB(rm16_nx0, 16, 0, -1)
#undef NXHINT
#define NXHINT _MM_HINT_T2
XSB(rm16_nx2, 16, 0, -1)
XSB(rm12_nx2, 12, 0, -1)
XSB(rm12, 12, 0, 0)
XSB(ti16, 16, 1, 0)
XSB(ti12, 12, 1, 0)
XSB(ti16_pf2k, 16, 1, 2048)
XSB(ti16_pf4k, 16, 1, 4096)
XSB(ti12_pf2k, 12, 1, 2048)

static void lib16(const uint16_t *w, const double *xs, size_t n, float *o) { k3_rows_bf16_xsb16_avx512(w, xs, n, o); }

typedef struct {
    const char *name;
    bf_fn fn;
    int rows, tiled;
    int libn;   /* k3_rows_bf16_xsb16n_avx512 with the next job when it is this thread's (chunks of CH) */
    int ch;     /* schedule(dynamic, ch) (0: 4) */
    bf_fn last; /* the kernel for a job whose next job is not this thread's (the last of a chunk of 4), NULL: fn */
} var;
static const var V[] = {
    {"lib xsb16 row-major", lib16, 16, 0, 0, 0, NULL}, {"tiled16", ti16, 16, 1, 0, 0, NULL}, {"tiled12", ti12, 12, 1, 0, 0, NULL},
    {"rm16 next-job T1", rm16_nx, 16, 0, 0, 0, NULL}, {"rm16 next-job T2", rm16_nx2, 16, 0, 0, 0, NULL},
    {"rm12 next-job T1", rm12_nx, 12, 0, 0, 0, NULL}, {"rm12 next-job T2", rm12_nx2, 12, 0, 0, 0, NULL},
    {"rm16 next-job T1 mine", rm16_nx, 16, 0, 0, 0, rm16}, {"rm16 next-job T2 mine", rm16_nx2, 16, 0, 0, 0, rm16},
    {"rm12", rm12, 12, 0, 0, 0, NULL}, {"lib xsb16n next mine", lib16, 16, 0, 1, 0, NULL},
    {"lib xsb16 chunks 8", lib16, 16, 0, 0, 8, NULL}, {"lib xsb16n next chunks 8", lib16, 16, 0, 1, 8, NULL},
    {"lib xsb16n next chunks 16", lib16, 16, 0, 1, 16, NULL}, {"lib xsb16n guess chunks 16", lib16, 16, 0, 2, 16, NULL},
    {"lib xsb16n guess chunks 4", lib16, 16, 0, 2, 4, NULL}, {"lib xsb16n guess chunks 8", lib16, 16, 0, 2, 8, NULL}, {"lib xsb16n next chunks 2", lib16, 16, 0, 1, 2, NULL},
};
#define NV (sizeof V / sizeof V[0])

static void run(const var *v, const uint16_t *w, size_t rows, size_t n, const double *xs, float *y) {
    const size_t R = (size_t)v->rows, jobs = rows / R, ch = v->ch ? (size_t)v->ch : 4;
    omp_set_schedule(omp_sched_dynamic, (int)ch);
#pragma omp parallel for schedule(runtime)
    for (size_t j = 0; j < jobs; j++)
        if (v->libn) {
            const size_t nth = (size_t)omp_get_num_threads();
            const int mine = j + 1 < jobs && (nth == 1 || (j + 1) % ch != 0);
            size_t nj = j + 1; /* libn 2: at a grab's end, guess the grab after the other threads' next ones */
            if (!mine && v->libn == 2) nj = j + 1 + ch * (nth - 1);
            k3_rows_bf16_xsb16n_avx512(w + j * R * n, xs, n, y + j * R,
                                       mine || (v->libn == 2 && nj < jobs) ? w + nj * R * n : NULL, R * n * 2);
        } else
        (v->last && omp_get_num_threads() > 1 && (j % 4 == 3 || j + 1 == jobs) ? v->last : v->fn)(w + j * R * n, xs, n, y + j * R);
}
static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, z = *(const double *)b;
    return x < z ? -1 : x > z;
}
static void tile(const uint16_t *src, uint16_t *dst, size_t rows, size_t n, size_t R) {
#pragma omp parallel for schedule(static)
    for (size_t j = 0; j < rows / R; j++)
        for (size_t c = 0; c < n / 32; c++)
            for (size_t r = 0; r < R; r++)
                memcpy(dst + j * R * n + (c * R + r) * 32, src + (j * R + r) * n + c * 32, 64);
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 15, l2 = argc > 2 && atoi(argv[2]);
    const size_t rows = l2 ? 96 : 12288, n = 7168;
    uint16_t *w = weight_mem_alloc(rows * n * 2), *t16 = weight_mem_alloc(rows * n * 2),
             *t12 = weight_mem_alloc(rows * n * 2);
    double *xs = aligned_alloc(64, n * 8);
    float *y = aligned_alloc(64, rows * 4), *ref = aligned_alloc(64, rows * 4);
    uint64_t s = 1;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < rows * n; i++) {
        uint64_t t = i * 0x9e3779b97f4a7c15ull;
        uint64_t r = rng(&t);
        w[i] = (uint16_t)(((r >> 16) & 0x8000) | (0x3c00 + (r & 0x07ff)));
    }
    for (size_t i = 0; i < n; i++) xs[i] = (double)(float)((double)(rng(&s) >> 11) * 0x1p-53 - 0.5) * K3_BF16_XS_SCALE;
    tile(w, t16, rows, n, 16);
    tile(w, t12, rows, n, 12);
    double *t = malloc(sizeof(double) * NV * (size_t)reps);
    const int inner = l2 ? 200 : 1;
    for (int th = 1; th <= 2; th++) {
        omp_set_num_threads(th);
        run(&V[0], w, rows, n, xs, ref);
        for (size_t v = 0; v < NV; v++) {
            const uint16_t *m = !V[v].tiled ? w : V[v].rows == 16 ? t16 : t12;
            memset(y, 0, rows * 4);
            run(&V[v], m, rows, n, xs, y);
            if (memcmp(y, ref, rows * 4)) printf("MISMATCH %s\n", V[v].name);
        }
        for (int r = 0; r < reps; r++)
            for (size_t v = 0; v < NV; v++) {
                const uint16_t *m = !V[v].tiled ? w : V[v].rows == 16 ? t16 : t12;
                double t0 = now_s();
                for (int k = 0; k < inner; k++) run(&V[v], m, rows, n, xs, y);
                t[v * reps + r] = (now_s() - t0) / inner;
            }
        printf("bf16 bytes kernel %zu x %zu%s, %d thread(s), %d alternated calls: GB/s best / median\n", rows, n,
               l2 ? " (L2)" : "", th, reps);
        for (size_t v = 0; v < NV; v++) {
            qsort(t + v * reps, (size_t)reps, sizeof *t, cmpd);
            double gb = (double)rows * n * 2 / 1e9;
            printf("  %-22s %6.1f / %6.1f\n", V[v].name, gb / t[v * reps], gb / t[v * reps + reps / 2]);
        }
    }
    return 0;
}
