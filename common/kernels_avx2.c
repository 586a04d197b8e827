/* kernels_avx2.c - AVX2 dot products of the exact kernel contract (kernels.h):
 * the 8 double lanes live in two __m256d (lanes 0-3 and 4-7); products are formed
 * exactly in double (multiply, then add: never FMA), tails add +0.0 to the empty
 * lanes, and the lanes are reduced in the fixed order of k3_reduce8.
 * Compiled with -mavx2 -mfma. */
#include "common/kernels_impl.h"

#ifdef K3_HAVE_X86_KERNELS
#include <immintrin.h>

static inline float reduce256(__m256d a, __m256d b) {
    double l[8];
    _mm256_storeu_pd(l, a);
    _mm256_storeu_pd(l + 4, b);
    return k3_reduce8(l);
}

/* acc{0,1} += w * x for 8 floats already widened from memory. */
#define K3_ACC8(wf, xf)                                                                                   \
    do {                                                                                                  \
        __m256 w8_ = (wf), x8_ = (xf);                                                                    \
        a0 = _mm256_add_pd(a0, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(w8_)),                \
                                             _mm256_cvtps_pd(_mm256_castps256_ps128(x8_))));              \
        a1 = _mm256_add_pd(a1, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(w8_, 1)),              \
                                             _mm256_cvtps_pd(_mm256_extractf128_ps(x8_, 1))));            \
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

/* One group of 8 elements, codes in the low 8 bytes of c (bits 4..7 of each byte
 * are ignored): magnitude from an 8-entry table (vpermps reads index bits 0..2),
 * sign from code bit 3, so codes 8..15 are the negatives (8 is -0.0). */
#define K3_MXFP4_GROUP(c, xp)                                                                             \
    do {                                                                                                  \
        __m256i ci_ = _mm256_cvtepu8_epi32(c);                                                            \
        __m256 sgn_ = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(ci_, 28), signbit));         \
        __m256 e_ = _mm256_or_ps(_mm256_permutevar8x32_ps(mag, ci_), sgn_);                               \
        __m256 x8_ = _mm256_loadu_ps(xp);                                                                 \
        __m256d w0_ = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(e_)), scale);                  \
        __m256d w1_ = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(e_, 1)), scale);                \
        a0 = _mm256_add_pd(a0, _mm256_mul_pd(w0_, _mm256_cvtps_pd(_mm256_castps256_ps128(x8_))));         \
        a1 = _mm256_add_pd(a1, _mm256_mul_pd(w1_, _mm256_cvtps_pd(_mm256_extractf128_ps(x8_, 1))));       \
    } while (0)

float k3_dot_mxfp4_avx2(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n) {
    const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256i signbit = _mm256_set1_epi32((int)0x80000000u);
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    for (size_t b = 0; b < n / 32; b++) {
        const __m256d scale = _mm256_set1_pd(k3_mxfp4_scale(scales[b]));
        __m128i p = _mm_loadu_si128((const __m128i *)(packed + b * 16));
        __m128i hi = _mm_srli_epi16(p, 4);
        __m128i c0 = _mm_unpacklo_epi8(p, hi); /* elements 0..15: low nibble first */
        __m128i c1 = _mm_unpackhi_epi8(p, hi); /* elements 16..31 */
        const float *xb = x + b * 32;
        K3_MXFP4_GROUP(c0, xb);
        K3_MXFP4_GROUP(_mm_unpackhi_epi64(c0, c0), xb + 8);
        K3_MXFP4_GROUP(c1, xb + 16);
        K3_MXFP4_GROUP(_mm_unpackhi_epi64(c1, c1), xb + 24);
    }
    return reduce256(a0, a1);
}

#endif
