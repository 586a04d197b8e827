/* kernels_avx2.c - AVX2 dot products of the exact kernel contract (kernels.h):
 * the 8 double lanes live in two __m256d (lanes 0-3 and 4-7); products are formed
 * exactly in double and added with FMA (the same bits as multiply-then-add because
 * every product is exact), tails add +0.0 to the empty lanes, and the lanes are
 * reduced in the fixed order of k3_reduce8. Single-row dots plus K3_ROWBLOCK-row kernels (f32, bf16, MXFP4)
 * running the same per-row operations interleaved. Compiled with -mavx2 -mfma. */
#include "common/kernels_impl.h"

#ifdef K3_HAVE_X86_KERNELS
#include <immintrin.h>

static inline float reduce256(__m256d a, __m256d b) {
    double l[8];
    _mm256_storeu_pd(l, a);
    _mm256_storeu_pd(l + 4, b);
    return k3_reduce8(l);
}

/* acc{0,1} += w * x for 8 floats already widened from memory, with FMA: the double product
 * of two floats is exact, so fma rounds once exactly as the add does (the same bits). */
#define K3_ACC8(wf, xf)                                                                                   \
    do {                                                                                                  \
        __m256 w8_ = (wf), x8_ = (xf);                                                                    \
        a0 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(w8_)),                                \
                             _mm256_cvtps_pd(_mm256_castps256_ps128(x8_)), a0);                           \
        a1 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(w8_, 1)),                              \
                             _mm256_cvtps_pd(_mm256_extractf128_ps(x8_, 1)), a1);                         \
    } while (0)

float k3_dot_f32_avx2(const float *w, const float *x, size_t n) {
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) K3_ACC8(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i));
    if (i < n) { /* empty lanes: 0.0f * 0.0f = +0.0 */
        float wt[8] = {0}, xt[8] = {0};
        memcpy(wt, w + i, (n - i) * sizeof *w);
        memcpy(xt, x + i, (n - i) * sizeof *x);
        K3_ACC8(_mm256_loadu_ps(wt), _mm256_loadu_ps(xt));
    }
    return reduce256(a0, a1);
}

static inline __m256 bf16x8_to_ps(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* ---- 4 consecutive rows, dense: the single-row dot's operations,
 * interleaved so that 8 accumulation chains overlap, x converted once for the 4
 * rows, the lanes += w*x done with FMA: the double product of a float or bf16
 * weight and a float is exact, so fma(w, x, acc) rounds once exactly as
 * acc + w*x does (same bits; tests/unit/test_kernels.c). Software prefetch
 * K3_PF_AHEAD bytes ahead in each row (the rows are streamed from memory). */
#define K3_PF_AHEAD 1024
static inline __attribute__((always_inline)) void prefetch_rows4(const void *w, size_t row_bytes, size_t at) {
    uintptr_t p = (uintptr_t)w + at + K3_PF_AHEAD;
    _mm_prefetch((const char *)p, _MM_HINT_T0);
    _mm_prefetch((const char *)(p + row_bytes), _MM_HINT_T0);
    _mm_prefetch((const char *)(p + 2 * row_bytes), _MM_HINT_T0);
    _mm_prefetch((const char *)(p + 3 * row_bytes), _MM_HINT_T0);
}

/* lanes (lo, hi) += w8 * x as doubles; w8 holds 8 floats, x0/x1 the 8 activations */
#define K3_FMA8(lo, hi, w8, x0, x1)                                                                       \
    do {                                                                                                  \
        __m256 w8_ = (w8);                                                                                \
        lo = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(w8_)), x0, lo);                       \
        hi = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(w8_, 1)), x1, hi);                     \
    } while (0)

#define K3_ROWS4_BODY(LOADW, W_T)                                                                         \
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;     \
    const W_T *w1 = w + n, *w2 = w + 2 * n, *w3 = w + 3 * n;                                              \
    size_t i = 0;                                                                                         \
    for (; i + 8 <= n; i += 8) {                                                                          \
        if ((i * sizeof(W_T)) % 64 == 0) prefetch_rows4(w, n * sizeof(W_T), i * sizeof(W_T));             \
        __m256d x0 = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), x1 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4)); \
        K3_FMA8(a0, a1, LOADW(w + i), x0, x1);                                                            \
        K3_FMA8(b0, b1, LOADW(w1 + i), x0, x1);                                                           \
        K3_FMA8(c0, c1, LOADW(w2 + i), x0, x1);                                                           \
        K3_FMA8(d0, d1, LOADW(w3 + i), x0, x1);                                                           \
    }                                                                                                     \
    if (i < n) { /* empty lanes: 0 * 0 = +0.0 */                                                          \
        W_T wt[4][8];                                                                                     \
        float xt[8] = {0};                                                                                \
        memset(wt, 0, sizeof wt);                                                                         \
        for (size_t r = 0; r < 4; r++) memcpy(wt[r], w + r * n + i, (n - i) * sizeof(W_T));               \
        memcpy(xt, x + i, (n - i) * sizeof *x);                                                           \
        __m256d x0 = _mm256_cvtps_pd(_mm_loadu_ps(xt)), x1 = _mm256_cvtps_pd(_mm_loadu_ps(xt + 4));       \
        K3_FMA8(a0, a1, LOADW(wt[0]), x0, x1);                                                            \
        K3_FMA8(b0, b1, LOADW(wt[1]), x0, x1);                                                            \
        K3_FMA8(c0, c1, LOADW(wt[2]), x0, x1);                                                            \
        K3_FMA8(d0, d1, LOADW(wt[3]), x0, x1);                                                            \
    }                                                                                                     \
    out[0] = reduce256(a0, a1);                                                                           \
    out[1] = reduce256(b0, b1);                                                                           \
    out[2] = reduce256(c0, c1);                                                                           \
    out[3] = reduce256(d0, d1);

#define K3_LOAD_F32(p) _mm256_loadu_ps(p)
#define K3_LOAD_BF16(p) bf16x8_to_ps(_mm_loadu_si128((const __m128i *)(p)))

static void rows4_f32(const float *w, const float *x, size_t n, float *out) { K3_ROWS4_BODY(K3_LOAD_F32, float) }

static void rows4_bf16(const uint16_t *w, const float *x, size_t n, float *out) { K3_ROWS4_BODY(K3_LOAD_BF16, uint16_t) }

/* K3_ROWBLOCK (8) rows: two 4-row halves (8 rows x 2 half-lane accumulators would need
 * every ymm register for the accumulators alone). */
void k3_rows_f32_avx2(const float *w, const float *x, size_t n, float *out) {
    rows4_f32(w, x, n, out);
    rows4_f32(w + 4 * n, x, n, out + 4);
}

void k3_rows_bf16_avx2(const uint16_t *w, const float *x, size_t n, float *out) {
    rows4_bf16(w, x, n, out);
    rows4_bf16(w + 4 * n, x, n, out + 4);
}

float k3_dot_bf16_avx2(const uint16_t *w, const float *x, size_t n) {
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) K3_ACC8(bf16x8_to_ps(_mm_loadu_si128((const __m128i *)(w + i))), _mm256_loadu_ps(x + i));
    if (i < n) {
        uint16_t wt[8] = {0};
        float xt[8] = {0};
        memcpy(wt, w + i, (n - i) * sizeof *w);
        memcpy(xt, x + i, (n - i) * sizeof *x);
        K3_ACC8(bf16x8_to_ps(_mm_loadu_si128((const __m128i *)wt)), _mm256_loadu_ps(xt));
    }
    return reduce256(a0, a1);
}

/* MXFP4. Element k of a 32-bit little-endian word of packed bytes sits in bits
 * 4k..4k+3 (byte j: element 2j in the low nibble, 2j+1 in the high one), so
 * broadcasting the word and shifting lane k right by 4k puts element k's code in
 * bits 0..3 of lane k. The magnitude comes from an 8-entry table (vpermps reads
 * index bits 0..2), the sign from code bit 3 (codes 8..15 are the negatives, 8 is
 * -0.0); E2M1 * 2^(s-127) is then formed exactly in double. */
typedef struct {
    __m256 mag;
    __m256i sh, signbit;
} mxfp4_consts;

static inline mxfp4_consts mxfp4_init(void) {
    mxfp4_consts c;
    c.mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    c.sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    c.signbit = _mm256_set1_epi32((int)0x80000000u);
    return c;
}

/* the 8 E2M1 values (as floats) of the elements whose codes are in the word at p */
static inline __m256 mxfp4_e8(const mxfp4_consts *c, const uint8_t *p) {
    uint32_t q;
    memcpy(&q, p, sizeof q);
    __m256i codes = _mm256_srlv_epi32(_mm256_set1_epi32((int)q), c->sh);
    __m256 sgn = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(codes, 28), c->signbit));
    return _mm256_or_ps(_mm256_permutevar8x32_ps(c->mag, codes), sgn);
}

/* a0/a1 += the 8 products of one group: e (E2M1 floats), scale s, x as two __m256d.
 * The weight E2M1 * 2^(s-127) is exact in double and its product with a float too,
 * so the FMA gives the bits of multiply-then-add. */
#define K3_MXFP4_ACC(a0, a1, e, s, x0, x1)                                                                \
    do {                                                                                                  \
        __m256 e_ = (e);                                                                                  \
        a0 = _mm256_fmadd_pd(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(e_)), s), x0, a0);      \
        a1 = _mm256_fmadd_pd(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(e_, 1)), s), x1, a1);    \
    } while (0)

float k3_dot_mxfp4_avx2(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n) {
    const mxfp4_consts c = mxfp4_init();
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    for (size_t b = 0; b < n / 32; b++) {
        const __m256d s = _mm256_set1_pd(k3_mxfp4_scale(scales[b]));
        for (size_t g = 0; g < 4; g++) {
            __m256 x8 = _mm256_loadu_ps(x + b * 32 + g * 8);
            __m256d x0 = _mm256_cvtps_pd(_mm256_castps256_ps128(x8)), x1 = _mm256_cvtps_pd(_mm256_extractf128_ps(x8, 1));
            K3_MXFP4_ACC(a0, a1, mxfp4_e8(&c, packed + b * 16 + g * 4), s, x0, x1);
        }
    }
    return reduce256(a0, a1);
}

/* 4 consecutive rows, interleaved group by group; x converted once. */
static void rows4_mxfp4(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n, float *out) {
    const mxfp4_consts c = mxfp4_init();
    const size_t pr = n / 2, sr = n / 32;
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;
    for (size_t b = 0; b < n / 32; b++) {
        const double sc[4] = {k3_mxfp4_scale(scales[b]), k3_mxfp4_scale(scales[sr + b]),
                              k3_mxfp4_scale(scales[2 * sr + b]), k3_mxfp4_scale(scales[3 * sr + b])};
        for (size_t g = 0; g < 4; g++) {
            const uint8_t *p = packed + b * 16 + g * 4;
            __m256 x8 = _mm256_loadu_ps(x + b * 32 + g * 8);
            __m256d x0 = _mm256_cvtps_pd(_mm256_castps256_ps128(x8)), x1 = _mm256_cvtps_pd(_mm256_extractf128_ps(x8, 1));
            K3_MXFP4_ACC(a0, a1, mxfp4_e8(&c, p), _mm256_broadcast_sd(&sc[0]), x0, x1);
            K3_MXFP4_ACC(b0, b1, mxfp4_e8(&c, p + pr), _mm256_broadcast_sd(&sc[1]), x0, x1);
            K3_MXFP4_ACC(c0, c1, mxfp4_e8(&c, p + 2 * pr), _mm256_broadcast_sd(&sc[2]), x0, x1);
            K3_MXFP4_ACC(d0, d1, mxfp4_e8(&c, p + 3 * pr), _mm256_broadcast_sd(&sc[3]), x0, x1);
        }
    }
    out[0] = reduce256(a0, a1);
    out[1] = reduce256(b0, b1);
    out[2] = reduce256(c0, c1);
    out[3] = reduce256(d0, d1);
}

/* K3_ROWBLOCK (8) rows: two 4-row halves */
void k3_rows_mxfp4_avx2(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n, float *out) {
    rows4_mxfp4(packed, scales, x, n, out);
    rows4_mxfp4(packed + 4 * (n / 2), scales + 4 * (n / 32), x, n, out + 4);
}

#endif
