/* kernels_avx512.c - AVX-512 dot products of the exact kernel contract (kernels.h):
 * the 8 double lanes live in one __m512d; products are formed exactly in double
 * (multiply, then add: never FMA), tails add +0.0 to the empty lanes, and the
 * lanes are reduced in the fixed order of k3_reduce8. Compiled with -mavx512*. */
#include "common/kernels_impl.h"

#ifdef K3_HAVE_X86_KERNELS
#include <immintrin.h>

static inline float reduce512(__m512d acc) {
    double l[8];
    _mm512_storeu_pd(l, acc);
    return k3_reduce8(l);
}

float k3_dot_f32_avx512(const float *w, const float *x, size_t n) {
    __m512d acc = _mm512_setzero_pd();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m512d wd = _mm512_cvtps_pd(_mm256_loadu_ps(w + i));
        __m512d xd = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
        acc = _mm512_add_pd(acc, _mm512_mul_pd(wd, xd));
    }
    if (i < n) { /* masked-off lanes load +0.0f: their product is +0.0 */
        __mmask8 m = (__mmask8)((1u << (n - i)) - 1);
        __m512d wd = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, w + i));
        __m512d xd = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, x + i));
        acc = _mm512_add_pd(acc, _mm512_mul_pd(wd, xd));
    }
    return reduce512(acc);
}

static inline __m512d bf16x8_to_pd(__m128i h) {
    __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    return _mm512_cvtps_pd(_mm256_castsi256_ps(u));
}

float k3_dot_bf16_avx512(const uint16_t *w, const float *x, size_t n) {
    __m512d acc = _mm512_setzero_pd();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m512d wd = bf16x8_to_pd(_mm_loadu_si128((const __m128i *)(w + i)));
        __m512d xd = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
        acc = _mm512_add_pd(acc, _mm512_mul_pd(wd, xd));
    }
    if (i < n) {
        __mmask8 m = (__mmask8)((1u << (n - i)) - 1);
        __m512d wd = bf16x8_to_pd(_mm_maskz_loadu_epi16(m, w + i));
        __m512d xd = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, x + i));
        acc = _mm512_add_pd(acc, _mm512_mul_pd(wd, xd));
    }
    return reduce512(acc);
}

/* One group of 8 elements: codes in the low 8 bytes of c (only bits 0..3 of each
 * byte matter: vpermt2pd reads index bits 0..2 and bit 3 selects the table half),
 * so the negative codes 8..15 pick the second table. */
static inline __m512d mxfp4_group(__m512d acc, __m128i c, __m512d tlo, __m512d thi, __m512d scale,
                                  const float *x) {
    __m512d e = _mm512_permutex2var_pd(tlo, _mm512_cvtepu8_epi64(c), thi);
    __m512d wd = _mm512_mul_pd(e, scale); /* E2M1 * 2^k: exact */
    __m512d xd = _mm512_cvtps_pd(_mm256_loadu_ps(x));
    return _mm512_add_pd(acc, _mm512_mul_pd(wd, xd));
}

float k3_dot_mxfp4_avx512(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n) {
    const __m512d tlo = _mm512_setr_pd(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
    const __m512d thi = _mm512_setr_pd(-0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0);
    __m512d acc = _mm512_setzero_pd();
    for (size_t b = 0; b < n / 32; b++) {
        __m512d scale = _mm512_set1_pd(k3_mxfp4_scale(scales[b]));
        __m128i p = _mm_loadu_si128((const __m128i *)(packed + b * 16));
        __m128i hi = _mm_srli_epi16(p, 4); /* byte j: high nibble of byte j in bits 0..3 */
        __m128i c0 = _mm_unpacklo_epi8(p, hi); /* elements 0..15: low nibble first */
        __m128i c1 = _mm_unpackhi_epi8(p, hi); /* elements 16..31 */
        const float *xb = x + b * 32;
        acc = mxfp4_group(acc, c0, tlo, thi, scale, xb);
        acc = mxfp4_group(acc, _mm_unpackhi_epi64(c0, c0), tlo, thi, scale, xb + 8);
        acc = mxfp4_group(acc, c1, tlo, thi, scale, xb + 16);
        acc = mxfp4_group(acc, _mm_unpackhi_epi64(c1, c1), tlo, thi, scale, xb + 24);
    }
    return reduce512(acc);
}

#endif
