/* kernels_avx512.c - AVX-512 dot products of the exact kernel contract (kernels.h):
 * the 8 double lanes live in one __m512d; products are formed exactly in double
 * (multiply, then add; the one-token MXFP4 row kernel uses FMA, which is the same
 * bits because its products are exact), tails add +0.0 to the empty lanes, and the
 * lanes are reduced in the fixed order of k3_reduce8. Single-row dots plus
 * K3_ROWBLOCK-row kernels that run the same per-row operations interleaved.
 * Compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl. */
#include "common/kernels_impl.h"

#ifdef K3_HAVE_X86_KERNELS
#include <immintrin.h>
#include <pthread.h>

#if K3_ROWBLOCK != 4
#error "the row-block kernels below are written for 4 rows"
#endif

static inline float reduce512(__m512d acc) {
    double l[8];
    _mm512_storeu_pd(l, acc);
    return k3_reduce8(l);
}

/* lanes += w * x, the 8 products exact in double */
static inline __m512d acc8(__m512d acc, __m512d wd, __m512d xd) { return _mm512_add_pd(acc, _mm512_mul_pd(wd, xd)); }

static inline __m512d f32x8(const float *p) { return _mm512_cvtps_pd(_mm256_loadu_ps(p)); }
/* masked-off lanes load +0.0f, so a tail adds 0 * 0 = +0.0 to the empty lanes */
static inline __m512d f32x8_tail(const float *p, __mmask8 m) { return _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, p)); }
static inline __mmask8 tail_mask(size_t left) { return (__mmask8)((1u << left) - 1); }

/* Software prefetch for the streamed dense rows of the row-block kernels: one cache
 * line per row every 64 bytes, K3_PF_AHEAD bytes ahead (measured: +25-30 % for a
 * single thread streaming bf16 from memory). Addresses past a row are harmless. */
#define K3_PF_AHEAD 2048
/* always_inline: a separate function holding only prefetches is judged side-effect
 * free by GCC 12's IPA and its calls are deleted. */
static inline __attribute__((always_inline)) void prefetch_rows4(const void *w, size_t row_bytes, size_t at) {
    uintptr_t p = (uintptr_t)w + at + K3_PF_AHEAD;
    _mm_prefetch((const char *)p, _MM_HINT_T0);
    _mm_prefetch((const char *)(p + row_bytes), _MM_HINT_T0);
    _mm_prefetch((const char *)(p + 2 * row_bytes), _MM_HINT_T0);
    _mm_prefetch((const char *)(p + 3 * row_bytes), _MM_HINT_T0);
}

static inline __m512d bf16x8_to_pd(__m128i h) {
    __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16); /* bf16 -> f32 is a 16-bit shift */
    return _mm512_cvtps_pd(_mm256_castsi256_ps(u));
}
static inline __m512d bf16x8(const uint16_t *p) { return bf16x8_to_pd(_mm_loadu_si128((const __m128i *)p)); }
static inline __m512d bf16x8_tail(const uint16_t *p, __mmask8 m) { return bf16x8_to_pd(_mm_maskz_loadu_epi16(m, p)); }

/* ---- dense F32 ---- */

float k3_dot_f32_avx512(const float *w, const float *x, size_t n) {
    __m512d acc = _mm512_setzero_pd();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) acc = acc8(acc, f32x8(w + i), f32x8(x + i));
    if (i < n) {
        __mmask8 m = tail_mask(n - i);
        acc = acc8(acc, f32x8_tail(w + i, m), f32x8_tail(x + i, m));
    }
    return reduce512(acc);
}

void k3_rows_f32_avx512(const float *w, const float *x, size_t n, float *out) {
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    const float *w1 = w + n, *w2 = w + 2 * n, *w3 = w + 3 * n;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) { /* 64 bytes of each row per step */
        prefetch_rows4(w, n * sizeof *w, i * sizeof *w);
        for (size_t j = i; j < i + 16; j += 8) {
            __m512d xd = f32x8(x + j);
            a0 = acc8(a0, f32x8(w + j), xd);
            a1 = acc8(a1, f32x8(w1 + j), xd);
            a2 = acc8(a2, f32x8(w2 + j), xd);
            a3 = acc8(a3, f32x8(w3 + j), xd);
        }
    }
    for (; i + 8 <= n; i += 8) {
        __m512d xd = f32x8(x + i);
        a0 = acc8(a0, f32x8(w + i), xd);
        a1 = acc8(a1, f32x8(w1 + i), xd);
        a2 = acc8(a2, f32x8(w2 + i), xd);
        a3 = acc8(a3, f32x8(w3 + i), xd);
    }
    if (i < n) {
        __mmask8 m = tail_mask(n - i);
        __m512d xd = f32x8_tail(x + i, m);
        a0 = acc8(a0, f32x8_tail(w + i, m), xd);
        a1 = acc8(a1, f32x8_tail(w1 + i, m), xd);
        a2 = acc8(a2, f32x8_tail(w2 + i, m), xd);
        a3 = acc8(a3, f32x8_tail(w3 + i, m), xd);
    }
    out[0] = reduce512(a0);
    out[1] = reduce512(a1);
    out[2] = reduce512(a2);
    out[3] = reduce512(a3);
}

/* ---- dense BF16 ---- */

float k3_dot_bf16_avx512(const uint16_t *w, const float *x, size_t n) {
    __m512d acc = _mm512_setzero_pd();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) acc = acc8(acc, bf16x8(w + i), f32x8(x + i));
    if (i < n) {
        __mmask8 m = tail_mask(n - i);
        acc = acc8(acc, bf16x8_tail(w + i, m), f32x8_tail(x + i, m));
    }
    return reduce512(acc);
}

void k3_rows_bf16_avx512(const uint16_t *w, const float *x, size_t n, float *out) {
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    const uint16_t *w1 = w + n, *w2 = w + 2 * n, *w3 = w + 3 * n;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) { /* 64 bytes of each row per step */
        prefetch_rows4(w, n * sizeof *w, i * sizeof *w);
        for (size_t j = i; j < i + 32; j += 8) {
            __m512d xd = f32x8(x + j);
            a0 = acc8(a0, bf16x8(w + j), xd);
            a1 = acc8(a1, bf16x8(w1 + j), xd);
            a2 = acc8(a2, bf16x8(w2 + j), xd);
            a3 = acc8(a3, bf16x8(w3 + j), xd);
        }
    }
    for (; i + 8 <= n; i += 8) {
        __m512d xd = f32x8(x + i);
        a0 = acc8(a0, bf16x8(w + i), xd);
        a1 = acc8(a1, bf16x8(w1 + i), xd);
        a2 = acc8(a2, bf16x8(w2 + i), xd);
        a3 = acc8(a3, bf16x8(w3 + i), xd);
    }
    if (i < n) {
        __mmask8 m = tail_mask(n - i);
        __m512d xd = f32x8_tail(x + i, m);
        a0 = acc8(a0, bf16x8_tail(w + i, m), xd);
        a1 = acc8(a1, bf16x8_tail(w1 + i, m), xd);
        a2 = acc8(a2, bf16x8_tail(w2 + i, m), xd);
        a3 = acc8(a3, bf16x8_tail(w3 + i, m), xd);
    }
    out[0] = reduce512(a0);
    out[1] = reduce512(a1);
    out[2] = reduce512(a2);
    out[3] = reduce512(a3);
}

/* 4 rows x 2 tokens (x and x + n): each weight vector is converted once for both. */
static inline void acc8_x2(__m512d *a, __m512d *b, __m512d wd, __m512d xa, __m512d xb) {
    *a = acc8(*a, wd, xa);
    *b = acc8(*b, wd, xb);
}

void k3_rows_bf16_x2_avx512(const uint16_t *w, const float *x, size_t n, float *out) {
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    const uint16_t *w1 = w + n, *w2 = w + 2 * n, *w3 = w + 3 * n;
    const float *x2 = x + n;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        prefetch_rows4(w, n * sizeof *w, i * sizeof *w);
        for (size_t j = i; j < i + 32; j += 8) {
            __m512d xa = f32x8(x + j), xb = f32x8(x2 + j);
            acc8_x2(&a0, &b0, bf16x8(w + j), xa, xb);
            acc8_x2(&a1, &b1, bf16x8(w1 + j), xa, xb);
            acc8_x2(&a2, &b2, bf16x8(w2 + j), xa, xb);
            acc8_x2(&a3, &b3, bf16x8(w3 + j), xa, xb);
        }
    }
    for (; i + 8 <= n; i += 8) {
        __m512d xa = f32x8(x + i), xb = f32x8(x2 + i);
        acc8_x2(&a0, &b0, bf16x8(w + i), xa, xb);
        acc8_x2(&a1, &b1, bf16x8(w1 + i), xa, xb);
        acc8_x2(&a2, &b2, bf16x8(w2 + i), xa, xb);
        acc8_x2(&a3, &b3, bf16x8(w3 + i), xa, xb);
    }
    if (i < n) {
        __mmask8 m = tail_mask(n - i);
        __m512d xa = f32x8_tail(x + i, m), xb = f32x8_tail(x2 + i, m);
        acc8_x2(&a0, &b0, bf16x8_tail(w + i, m), xa, xb);
        acc8_x2(&a1, &b1, bf16x8_tail(w1 + i, m), xa, xb);
        acc8_x2(&a2, &b2, bf16x8_tail(w2 + i, m), xa, xb);
        acc8_x2(&a3, &b3, bf16x8_tail(w3 + i, m), xa, xb);
    }
    out[0] = reduce512(a0);
    out[1] = reduce512(a1);
    out[2] = reduce512(a2);
    out[3] = reduce512(a3);
    out[4] = reduce512(b0);
    out[5] = reduce512(b1);
    out[6] = reduce512(b2);
    out[7] = reduce512(b3);
}

/* ---- MXFP4 ----
 * One 32-element block: 16 packed bytes, one scale byte. Element k of a 64-bit
 * little-endian word of packed bytes sits in bits 4k..4k+3 (byte j: element 2j in
 * the low nibble, 2j+1 in the high one), so broadcasting the word and shifting lane
 * k right by 4k (or 4k-32) puts element k's code in bits 0..3 of lane k. vpermi2pd
 * reads exactly those bits: 0..2 pick the entry, bit 3 (the sign) picks the
 * negative half of the table. The table is pre-multiplied by the block scale
 * 2^(s-127): E2M1 * 2^k is exact in double, so the weight equals the scalar one. */

typedef struct {
    __m512i sh_lo, sh_hi; /* shifts for elements 0..7 and 8..15 of a 64-bit word */
    __m512d pos, neg;     /* E2M1 codes 0..7 and 8..15 */
} mxfp4_consts;

static inline mxfp4_consts mxfp4_init(void) {
    mxfp4_consts c;
    c.sh_lo = _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28);
    c.sh_hi = _mm512_setr_epi64(32, 36, 40, 44, 48, 52, 56, 60);
    c.pos = _mm512_setr_pd(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
    c.neg = _mm512_setr_pd(-0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0);
    return c;
}

static inline __m512i bcast_word(const uint8_t *p) {
    uint64_t q;
    memcpy(&q, p, sizeof q);
    return _mm512_set1_epi64((long long)q);
}

/* acc += the 32 products of one block, x0..x3 its 32 activations in double */
static inline __m512d mxfp4_block(const mxfp4_consts *c, __m512d acc, const uint8_t *packed, uint8_t scale,
                                  __m512d x0, __m512d x1, __m512d x2, __m512d x3) {
    __m512d s = _mm512_set1_pd(k3_mxfp4_scale(scale));
    __m512d tpos = _mm512_mul_pd(c->pos, s), tneg = _mm512_mul_pd(c->neg, s);
    __m512i q0 = bcast_word(packed), q1 = bcast_word(packed + 8);
    acc = acc8(acc, _mm512_permutex2var_pd(tpos, _mm512_srlv_epi64(q0, c->sh_lo), tneg), x0);
    acc = acc8(acc, _mm512_permutex2var_pd(tpos, _mm512_srlv_epi64(q0, c->sh_hi), tneg), x1);
    acc = acc8(acc, _mm512_permutex2var_pd(tpos, _mm512_srlv_epi64(q1, c->sh_lo), tneg), x2);
    acc = acc8(acc, _mm512_permutex2var_pd(tpos, _mm512_srlv_epi64(q1, c->sh_hi), tneg), x3);
    return acc;
}

float k3_dot_mxfp4_avx512(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n) {
    const mxfp4_consts c = mxfp4_init();
    __m512d acc = _mm512_setzero_pd();
    for (size_t b = 0; b < n / 32; b++) {
        const float *xb = x + b * 32;
        acc = mxfp4_block(&c, acc, packed + b * 16, scales[b], f32x8(xb), f32x8(xb + 8), f32x8(xb + 16),
                          f32x8(xb + 24));
    }
    return reduce512(acc);
}

/* The one-token row-block kernel (the decode hot spot), with fewer uops on the two
 * vector ports per 8 weights than the shared block above:
 * - fma(w, x, acc) instead of acc + w*x: w = E2M1 * 2^(s-127) has at most 2
 *   significant bits and x is a float (24), so w*x is exact in double (the exponents
 *   stay far inside the double range) and the fma rounds once, exactly like the add;
 * - the block scale is read from a 256-entry table of doubles, so its broadcast is a
 *   load (no GPR->vector move and shuffle); the packed words are broadcast from memory.
 * Products, lanes and the per-lane order are those of the scalar reference. */
static double mxfp4_scale_tab[256];
static void mxfp4_scale_tab_init(void) {
    for (unsigned i = 0; i < 256; i++) mxfp4_scale_tab[i] = k3_mxfp4_scale((uint8_t)i);
}

static inline __m512d mxfp4_block_fma(const mxfp4_consts *c, __m512d acc, const uint8_t *packed, uint8_t scale,
                                      __m512d x0, __m512d x1, __m512d x2, __m512d x3) {
    __m512d s = _mm512_set1_pd(mxfp4_scale_tab[scale]);
    __m512d tpos = _mm512_mul_pd(c->pos, s), tneg = _mm512_mul_pd(c->neg, s);
    __m512i q0 = bcast_word(packed), q1 = bcast_word(packed + 8);
    acc = _mm512_fmadd_pd(_mm512_permutex2var_pd(tpos, _mm512_srlv_epi64(q0, c->sh_lo), tneg), x0, acc);
    acc = _mm512_fmadd_pd(_mm512_permutex2var_pd(tpos, _mm512_srlv_epi64(q0, c->sh_hi), tneg), x1, acc);
    acc = _mm512_fmadd_pd(_mm512_permutex2var_pd(tpos, _mm512_srlv_epi64(q1, c->sh_lo), tneg), x2, acc);
    acc = _mm512_fmadd_pd(_mm512_permutex2var_pd(tpos, _mm512_srlv_epi64(q1, c->sh_hi), tneg), x3, acc);
    return acc;
}

void k3_rows_mxfp4_avx512(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n, float *out) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, mxfp4_scale_tab_init);
    const mxfp4_consts c = mxfp4_init();
    const size_t pr = n / 2, sr = n / 32; /* row strides */
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t b = 0; b < n / 32; b++) {
        const float *xb = x + b * 32;
        const uint8_t *p = packed + b * 16, *s = scales + b;
        __m512d x0 = f32x8(xb), x1 = f32x8(xb + 8), x2 = f32x8(xb + 16), x3 = f32x8(xb + 24);
        a0 = mxfp4_block_fma(&c, a0, p, s[0], x0, x1, x2, x3);
        a1 = mxfp4_block_fma(&c, a1, p + pr, s[sr], x0, x1, x2, x3);
        a2 = mxfp4_block_fma(&c, a2, p + 2 * pr, s[2 * sr], x0, x1, x2, x3);
        a3 = mxfp4_block_fma(&c, a3, p + 3 * pr, s[3 * sr], x0, x1, x2, x3);
    }
    out[0] = reduce512(a0);
    out[1] = reduce512(a1);
    out[2] = reduce512(a2);
    out[3] = reduce512(a3);
}

/* 4 rows x 2 tokens (x and x + n): each decoded weight vector serves both tokens. */
typedef struct {
    __m512d a0, a1, a2, a3; /* token 0: the 32 activations of the block in double */
    __m512d b0, b1, b2, b3; /* token 1 */
} x2_block;

static inline void mxfp4_block_x2(const mxfp4_consts *c, __m512d *a, __m512d *b, const uint8_t *packed,
                                  uint8_t scale, const x2_block *xv) {
    __m512d s = _mm512_set1_pd(k3_mxfp4_scale(scale));
    __m512d tpos = _mm512_mul_pd(c->pos, s), tneg = _mm512_mul_pd(c->neg, s);
    __m512i q0 = bcast_word(packed), q1 = bcast_word(packed + 8);
    __m512d e0 = _mm512_permutex2var_pd(tpos, _mm512_srlv_epi64(q0, c->sh_lo), tneg);
    __m512d e1 = _mm512_permutex2var_pd(tpos, _mm512_srlv_epi64(q0, c->sh_hi), tneg);
    __m512d e2 = _mm512_permutex2var_pd(tpos, _mm512_srlv_epi64(q1, c->sh_lo), tneg);
    __m512d e3 = _mm512_permutex2var_pd(tpos, _mm512_srlv_epi64(q1, c->sh_hi), tneg);
    *a = acc8(acc8(acc8(acc8(*a, e0, xv->a0), e1, xv->a1), e2, xv->a2), e3, xv->a3);
    *b = acc8(acc8(acc8(acc8(*b, e0, xv->b0), e1, xv->b1), e2, xv->b2), e3, xv->b3);
}

void k3_rows_mxfp4_x2_avx512(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n, float *out) {
    const mxfp4_consts c = mxfp4_init();
    const size_t pr = n / 2, sr = n / 32;
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (size_t b = 0; b < n / 32; b++) {
        const float *xa = x + b * 32, *xb = x + n + b * 32;
        const x2_block xv = {f32x8(xa), f32x8(xa + 8), f32x8(xa + 16), f32x8(xa + 24),
                             f32x8(xb), f32x8(xb + 8), f32x8(xb + 16), f32x8(xb + 24)};
        const uint8_t *p = packed + b * 16, *s = scales + b;
        mxfp4_block_x2(&c, &a0, &b0, p, s[0], &xv);
        mxfp4_block_x2(&c, &a1, &b1, p + pr, s[sr], &xv);
        mxfp4_block_x2(&c, &a2, &b2, p + 2 * pr, s[2 * sr], &xv);
        mxfp4_block_x2(&c, &a3, &b3, p + 3 * pr, s[3 * sr], &xv);
    }
    out[0] = reduce512(a0);
    out[1] = reduce512(a1);
    out[2] = reduce512(a2);
    out[3] = reduce512(a3);
    out[4] = reduce512(b0);
    out[5] = reduce512(b1);
    out[6] = reduce512(b2);
    out[7] = reduce512(b3);
}

#endif
