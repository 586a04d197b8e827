/* kernels_gemm_avx512.c - multi-token ("prefill") kernels of the exact contract
 * (kernels.h) for the AVX-512 level: y[t][r] = W[r] . x[t] for a tile of up to
 * K3_GEMM_NR rows and all ntok tokens, register-blocked over rows and tokens.
 *
 * The same scheme as kernels_gemm_avx2.c (read its header for why the bits are those
 * of one token at a time), with the contract's 8 double lanes of a (row, token) pair
 * in ONE 512-bit register: lane l accumulates the products of the elements i with
 * i % 8 == l, sequentially in i, with FMA (each product is exact in double, so the
 * FMA rounds once exactly as acc + w*x does); a partial last column block is padded
 * with w = 0, x = 0 (the padded lanes add +0.0, as the contract's tail does); the
 * accumulators are reduced with k3_reduce8 at the end.
 *
 * Blocking: per column block of KC columns, the tile's weights are decoded once into
 * double (wd, shared by all tokens of the token block: bf16 shift, f32 widening,
 * MXFP4 E2M1 x 2^(s-127)) and the token block's activations once into double (xd,
 * shared by the tile's rows); the 4-row x 6-token micro-kernel keeps 24 FMA chains
 * in registers: 24 FMAs per 10 loads (the AVX2 one: 12 per 7, half as wide).
 * Compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx2 -mfma; the caller
 * checks the CPU. */
#include "common/kernels_impl.h"

#ifdef K3_HAVE_X86_KERNELS
#include <immintrin.h>

#define MR 4  /* rows per micro-kernel */
#define MT 6  /* tokens per micro-kernel */
#define NR K3_GEMM_NR
#define TB 24 /* tokens per token block (multiple of MT) */
#define KC 128 /* columns per column block (multiple of 32: whole MXFP4 blocks) */

#if NR % MR != 0 || TB % MT != 0 || KC % 32 != 0
#error "bad gemm blocking"
#endif

typedef enum { W_F32, W_BF16, W_MXFP4 } wkind;

/* acc[r][t][0..7] += wd[r][..] . xd[t][..] over nk8 chunks of 8 columns, for
 * R <= MR rows and T <= MT tokens. */
static inline __attribute__((always_inline)) void micro(const int R, const int T, const double *wd,
                                                        const double *xd, size_t nk8, double *acc) {
    __m512d a[MR][MT];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) a[r][t] = _mm512_load_pd(acc + ((size_t)r * TB + (size_t)t) * 8);
    for (size_t c = 0; c < nk8; c++) {
        __m512d w[MR];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) w[r] = _mm512_load_pd(wd + (size_t)r * KC + c * 8);
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            __m512d xv = _mm512_load_pd(xd + (size_t)t * KC + c * 8);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) a[r][t] = _mm512_fmadd_pd(w[r], xv, a[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) _mm512_store_pd(acc + ((size_t)r * TB + (size_t)t) * 8, a[r][t]);
}

/* every partial micro-kernel (R < MR or T < MT): wd/xd/acc already offset */
#define K3_MICRO_T(R)                                                                                       \
    switch (T) {                                                                                            \
    case 6: micro(R, 6, wd, xd, nk8, acc); break;                                                           \
    case 5: micro(R, 5, wd, xd, nk8, acc); break;                                                           \
    case 4: micro(R, 4, wd, xd, nk8, acc); break;                                                           \
    case 3: micro(R, 3, wd, xd, nk8, acc); break;                                                           \
    case 2: micro(R, 2, wd, xd, nk8, acc); break;                                                           \
    default: micro(R, 1, wd, xd, nk8, acc); break;                                                          \
    }
static void micro_any(int R, int T, const double *wd, const double *xd, size_t nk8, double *acc) {
    switch (R) {
    case 4: K3_MICRO_T(4) break;
    case 3: K3_MICRO_T(3) break;
    case 2: K3_MICRO_T(2) break;
    default: K3_MICRO_T(1) break;
    }
}
#undef K3_MICRO_T

/* xd[t][0..KC) = x[t][k0 .. k0+kn) in double, zero beyond kn (kn8 = kn rounded up to 8) */
static void pack_x(const float *x, size_t cols, size_t nt, size_t k0, size_t kn, size_t kn8, double *xd) {
    for (size_t t = 0; t < nt; t++) {
        const float *xs = x + t * cols + k0;
        double *d = xd + t * KC;
        size_t k = 0;
        for (; k + 8 <= kn; k += 8) _mm512_store_pd(d + k, _mm512_cvtps_pd(_mm256_loadu_ps(xs + k)));
        for (; k < kn; k++) d[k] = (double)xs[k];
        for (; k < kn8; k++) d[k] = 0.0;
    }
}

static inline __m256 bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* E2M1 decode of 8 codes of the 32-bit word at p (element k in bits 4k..4k+3) as floats */
static inline __m256 e2m1x8(const uint8_t *p) {
    const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
    const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    uint32_t q;
    memcpy(&q, p, sizeof q);
    __m256i codes = _mm256_srlv_epi32(_mm256_set1_epi32((int)q), sh);
    __m256 sgn = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(codes, 28), _mm256_set1_epi32((int)0x80000000u)));
    return _mm256_or_ps(_mm256_permutevar8x32_ps(mag, codes), sgn);
}

/* wd[r][0..KC) = row r0 + r of W, columns k0 .. k0+kn, as exact doubles; zero beyond kn */
static inline __attribute__((always_inline)) void pack_w(wkind kind, const void *w, const uint8_t *scales,
                                                         size_t cols, size_t r0, size_t nr, size_t k0, size_t kn,
                                                         size_t kn8, double *wd) {
    for (size_t r = 0; r < nr; r++) {
        double *d = wd + r * KC;
        size_t k = 0;
        if (kind == W_F32) {
            const float *ws = (const float *)w + (r0 + r) * cols + k0;
            for (; k + 8 <= kn; k += 8) _mm512_store_pd(d + k, _mm512_cvtps_pd(_mm256_loadu_ps(ws + k)));
            for (; k < kn; k++) d[k] = (double)ws[k];
        } else if (kind == W_BF16) {
            const uint16_t *ws = (const uint16_t *)w + (r0 + r) * cols + k0;
            for (; k + 8 <= kn; k += 8) _mm512_store_pd(d + k, _mm512_cvtps_pd(bf16x8(ws + k)));
            for (; k < kn; k++) d[k] = (double)bf16_to_f32(ws[k]);
        } else { /* kn % 32 == 0: whole blocks */
            const uint8_t *ps = (const uint8_t *)w + (r0 + r) * (cols / 2) + k0 / 2;
            const uint8_t *ss = scales + (r0 + r) * (cols / 32) + k0 / 32;
            for (; k < kn; k += 32) {
                const __m512d s = _mm512_set1_pd(k3_mxfp4_scale(ss[k / 32]));
                for (size_t g = 0; g < 4; g++)
                    _mm512_store_pd(d + k + g * 8, _mm512_mul_pd(_mm512_cvtps_pd(e2m1x8(ps + k / 2 + g * 4)), s));
            }
        }
        for (; k < kn8; k++) d[k] = 0.0;
    }
}

/* prefetch bytes [p, p + n) of each of cnt rows stride bytes apart */
static inline __attribute__((always_inline)) void prefetch_rows(const void *p, size_t n, size_t cnt, size_t stride) {
    for (size_t r = 0; r < cnt; r++)
        for (size_t o = 0; o < n; o += 64) _mm_prefetch((const char *)p + r * stride + o, _MM_HINT_T0);
}

static inline __attribute__((always_inline)) void gemm_tile(wkind kind, const void *w, const uint8_t *scales,
                                                            size_t rows, size_t cols, size_t r0, size_t nr,
                                                            const float *x, size_t ntok, float *y) {
    _Alignas(64) double wd[NR * KC];
    _Alignas(64) double xd[TB * KC];
    _Alignas(64) double acc[NR * TB * 8];
    for (size_t t0 = 0; t0 < ntok; t0 += TB) {
        const size_t nt = ntok - t0 < TB ? ntok - t0 : TB;
        memset(acc, 0, sizeof acc);
        for (size_t k0 = 0; k0 < cols; k0 += KC) {
            const size_t kn = cols - k0 < KC ? cols - k0 : KC, kn8 = (kn + 7) & ~(size_t)7;
            if (k0 + KC < cols) { /* the next column block's weights and activations */
                const size_t k1 = k0 + KC;
                if (kind == W_F32) prefetch_rows((const float *)w + r0 * cols + k1, KC * 4, nr, cols * 4);
                else if (kind == W_BF16) prefetch_rows((const uint16_t *)w + r0 * cols + k1, KC * 2, nr, cols * 2);
                else prefetch_rows((const uint8_t *)w + r0 * (cols / 2) + k1 / 2, KC / 2, nr, cols / 2);
                prefetch_rows(x + t0 * cols + k1, KC * 4, nt, cols * 4);
            }
            pack_w(kind, w, scales, cols, r0, nr, k0, kn, kn8, wd);
            pack_x(x + t0 * cols, cols, nt, k0, kn, kn8, xd);
            for (size_t r = 0; r < nr; r += MR) {
                const int R = nr - r < MR ? (int)(nr - r) : MR;
                size_t t = 0;
                for (; t + MT <= nt; t += MT) {
                    if (R == MR) micro(MR, MT, wd + r * KC, xd + t * KC, kn8 / 8, acc + (r * TB + t) * 8);
                    else micro_any(R, MT, wd + r * KC, xd + t * KC, kn8 / 8, acc + (r * TB + t) * 8);
                }
                if (t < nt) micro_any(R, (int)(nt - t), wd + r * KC, xd + t * KC, kn8 / 8, acc + (r * TB + t) * 8);
            }
        }
        for (size_t t = 0; t < nt; t++)
            for (size_t r = 0; r < nr; r++) y[(t0 + t) * rows + r0 + r] = k3_reduce8(acc + (r * TB + t) * 8);
    }
}

void k3_gemm_f32_avx512(const float *w, size_t rows, size_t cols, size_t r0, size_t nr, const float *x, size_t ntok,
                        float *y) {
    gemm_tile(W_F32, w, NULL, rows, cols, r0, nr, x, ntok, y);
}

void k3_gemm_bf16_avx512(const uint16_t *w, size_t rows, size_t cols, size_t r0, size_t nr, const float *x,
                         size_t ntok, float *y) {
    gemm_tile(W_BF16, w, NULL, rows, cols, r0, nr, x, ntok, y);
}

void k3_gemm_mxfp4_avx512(const uint8_t *packed, const uint8_t *scales, size_t rows, size_t cols, size_t r0,
                          size_t nr, const float *x, size_t ntok, float *y) {
    gemm_tile(W_MXFP4, packed, scales, rows, cols, r0, nr, x, ntok, y);
}

#endif
