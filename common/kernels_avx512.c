/* kernels_avx512.c - AVX-512 dot products of the exact kernel contract (kernels.h):
 * the 8 double lanes live in one __m512d; products are formed exactly in double and
 * added with FMA (fma(w, x, acc) == acc + w*x bit for bit, the product being exact),
 * tails add +0.0 to the empty lanes, and the lanes are reduced in the fixed order of
 * k3_reduce8. Single-row dots plus K3_ROWBLOCK (8)-row kernels that run the same
 * per-row operations interleaved (8 independent chains, x converted once per block).
 * Compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl. */
#include "common/kernels_impl.h"

#ifdef K3_HAVE_X86_KERNELS
#include <immintrin.h>
#include <pthread.h>

#if K3_ROWBLOCK != 8
#error "the row-block kernels below are written for 8 rows"
#endif

static inline float reduce512(__m512d acc) {
    double l[8];
    _mm512_storeu_pd(l, acc);
    return k3_reduce8(l);
}

/* lanes += w * x in one uop: w * x is exact in double (a float, bf16 or E2M1 * 2^k weight times a
 * float has at most 48 significant bits), so fma(w, x, acc) rounds once exactly as the add
 * does: the same bits (tests/unit/test_kernels.c test_fma_is_exact) */
static inline __m512d fma8(__m512d acc, __m512d wd, __m512d xd) { return _mm512_fmadd_pd(wd, xd, acc); }

static inline __m512d f32x8(const float *p) { return _mm512_cvtps_pd(_mm256_loadu_ps(p)); }
/* masked-off lanes load +0.0f, so a tail adds 0 * 0 = +0.0 to the empty lanes */
static inline __m512d f32x8_tail(const float *p, __mmask8 m) { return _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, p)); }
static inline __mmask8 tail_mask(size_t left) { return (__mmask8)((1u << left) - 1); }

/* Software prefetch for the streamed dense rows of the row-block kernels: one cache
 * line per row every 64 bytes, K3_PF_AHEAD bytes ahead in each of the 8 rows (8 KiB in
 * flight per block). Measured on the 2-core Xeon VM, matmul_dense of a 117 MB bf16
 * matrix from memory, best / 25th percentile of 30 calls: 1 thread 512 B 13.5-13.8 /
 * 12.9, 1 KiB 13.2-13.4 / 12.4-12.5, 2 KiB 12.4-12.8 / 11.7-12.4 GB/s; 2 threads
 * (quiet moment) 512 B 22.0-24.2 / 20.1-23.7, 1 KiB 22.7 / 21.1-21.5, 2 KiB 20.9-22.7 /
 * 20.1-21.6 GB/s; no prefetch (4 rows) about 10 % below. Addresses past a row are
 * harmless (the next rows). -DK3_PF_AHEAD=N overrides it. */
#ifndef K3_PF_AHEAD
#define K3_PF_AHEAD 1024
#endif
/* always_inline: a separate function holding only prefetches is judged side-effect
 * free by GCC 12's IPA and its calls are deleted. */
static inline __attribute__((always_inline)) void prefetch_rows8(const void *w, size_t row_bytes, size_t at) {
    uintptr_t p = (uintptr_t)w + at;
    for (int r = 0; r < 8; r++) _mm_prefetch((const char *)(p + (size_t)r * row_bytes), _MM_HINT_T0);
}

/* bf16 -> f32 is a 16-bit left shift: vpshufb of the 8 words broadcast to both 128-bit
 * lanes puts word k in the high half of dword k and zeros the low half (1 uop beside the
 * load, where a zero-extension and a shift take 2); then f32 -> double (exact). */
#define K3_BF16_IDX                                                                                         \
    _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7, -1, -1, 8, 9, -1, -1, 10, 11, -1, \
                     -1, 12, 13, -1, -1, 14, 15)
static inline __m512d bf16x8_to_pd(__m128i h, __m256i idx) {
    __m256i u = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(h), idx);
    return _mm512_cvtps_pd(_mm256_castsi256_ps(u));
}
static inline __m512d bf16x8(const uint16_t *p, __m256i idx) {
    return bf16x8_to_pd(_mm_loadu_si128((const __m128i *)p), idx);
}
static inline __m512d bf16x8_tail(const uint16_t *p, __mmask8 m, __m256i idx) {
    return bf16x8_to_pd(_mm_maskz_loadu_epi16(m, p), idx);
}

/* ---- dense F32 ---- */

float k3_dot_f32_avx512(const float *w, const float *x, size_t n) {
    __m512d acc = _mm512_setzero_pd();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) acc = fma8(acc, f32x8(w + i), f32x8(x + i));
    if (i < n) {
        __mmask8 m = tail_mask(n - i);
        acc = fma8(acc, f32x8_tail(w + i, m), f32x8_tail(x + i, m));
    }
    return reduce512(acc);
}

/* The 8-row kernels keep one accumulator per row (a0..a7); K3_STEP8(W8) adds the 8
 * products of columns j..j+7 of every row, W8(r) giving row r's 8 weights in double
 * and xd the 8 activations. */
#define K3_ACC_DECL __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0
#define K3_STEP8(W8)                                                                                        \
    do {                                                                                                    \
        a0 = fma8(a0, W8(0), xd);                                                                           \
        a1 = fma8(a1, W8(1), xd);                                                                           \
        a2 = fma8(a2, W8(2), xd);                                                                           \
        a3 = fma8(a3, W8(3), xd);                                                                           \
        a4 = fma8(a4, W8(4), xd);                                                                           \
        a5 = fma8(a5, W8(5), xd);                                                                           \
        a6 = fma8(a6, W8(6), xd);                                                                           \
        a7 = fma8(a7, W8(7), xd);                                                                           \
    } while (0)
#define K3_ACC_OUT(out, a0, a1, a2, a3, a4, a5, a6, a7)                                                     \
    do {                                                                                                    \
        (out)[0] = reduce512(a0);                                                                           \
        (out)[1] = reduce512(a1);                                                                           \
        (out)[2] = reduce512(a2);                                                                           \
        (out)[3] = reduce512(a3);                                                                           \
        (out)[4] = reduce512(a4);                                                                           \
        (out)[5] = reduce512(a5);                                                                           \
        (out)[6] = reduce512(a6);                                                                           \
        (out)[7] = reduce512(a7);                                                                           \
    } while (0)

void k3_rows_f32_avx512(const float *w, const float *x, size_t n, float *out) {
    K3_ACC_DECL;
    size_t i = 0;
#define W8(r) f32x8(w + (r) * n + j)
    for (; i + 16 <= n; i += 16) { /* 64 bytes of each row per step */
        prefetch_rows8(w, n * sizeof *w, i * sizeof *w + K3_PF_AHEAD);
        for (size_t j = i; j < i + 16; j += 8) {
            __m512d xd = f32x8(x + j);
            K3_STEP8(W8);
        }
    }
    for (size_t j = i; j + 8 <= n; j += 8, i += 8) {
        __m512d xd = f32x8(x + j);
        K3_STEP8(W8);
    }
#undef W8
    if (i < n) {
        __mmask8 m = tail_mask(n - i);
        __m512d xd = f32x8_tail(x + i, m);
#define W8(r) f32x8_tail(w + (r) * n + i, m)
        K3_STEP8(W8);
#undef W8
    }
    K3_ACC_OUT(out, a0, a1, a2, a3, a4, a5, a6, a7);
}

/* ---- dense BF16 ---- */

float k3_dot_bf16_avx512(const uint16_t *w, const float *x, size_t n) {
    const __m256i idx = K3_BF16_IDX;
    __m512d acc = _mm512_setzero_pd();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) acc = fma8(acc, bf16x8(w + i, idx), f32x8(x + i));
    if (i < n) {
        __mmask8 m = tail_mask(n - i);
        acc = fma8(acc, bf16x8_tail(w + i, m, idx), f32x8_tail(x + i, m));
    }
    return reduce512(acc);
}

/* The decode hot spot (every trunk matrix and the lm head): per 8 weights of a row a
 * broadcast load, a vpshufb, a conversion (2 uops) and an FMA; x converted once per 8 rows. */
void k3_rows_bf16_avx512(const uint16_t *w, const float *x, size_t n, float *out) {
    const __m256i idx = K3_BF16_IDX;
    K3_ACC_DECL;
    size_t i = 0;
#define W8(r) bf16x8(w + (r) * n + j, idx)
    for (; i + 32 <= n; i += 32) { /* 64 bytes of each row per step */
        prefetch_rows8(w, n * sizeof *w, i * sizeof *w + K3_PF_AHEAD);
        for (size_t j = i; j < i + 32; j += 8) {
            __m512d xd = f32x8(x + j);
            K3_STEP8(W8);
        }
    }
    for (size_t j = i; j + 8 <= n; j += 8, i += 8) {
        __m512d xd = f32x8(x + j);
        K3_STEP8(W8);
    }
#undef W8
    if (i < n) {
        __mmask8 m = tail_mask(n - i);
        __m512d xd = f32x8_tail(x + i, m);
#define W8(r) bf16x8_tail(w + (r) * n + i, m, idx)
        K3_STEP8(W8);
#undef W8
    }
    K3_ACC_OUT(out, a0, a1, a2, a3, a4, a5, a6, a7);
}

/* The decode hot spot without a conversion (k3_rows_bf16_xs_avx512): a bf16 weight w with
 * sign s, exponent field e and fraction m, placed as the double with sign s, exponent field e
 * (not rebiased) and fraction m << 45, is |w| * 2^-896 with w's sign: for a normal w
 * (1 + m/128) 2^(e-127) becomes (1 + m/128) 2^(e-1023), for a subnormal (e == 0) m 2^-133
 * becomes the double subnormal m 2^45 2^-1074 = m 2^-1029, and +-0 stays +-0. With x scaled by
 * 2^896 (xs, exact: a float times a power of two, at most (2 - 2^-23) 2^1023), the product
 * (w 2^-896)(x 2^896) is exactly w*x, which the FMA rounds once into the lane as before: the
 * same bits as converting w (an Inf or NaN weight, which no load lets through, would not be).
 * Building it: vpermw puts word k of 16 into the top 16 bits of qword k (zeros below: a zero-
 * masked permute), an arithmetic shift right by 3 moves e and m into place and copies s into
 * bits 60..63, and an AND clears bits 60..62. Per 8 weights: a permute, a shift, an AND (the
 * cheap integer pipes) and an FMA taking x from memory, where k3_rows_bf16_avx512 spends a
 * vpshufb and a vcvtps2pd (the expensive one on Zen 5) plus x's conversion once per 8 rows.
 * Measured on the 2-vCPU EPYC Zen 5 VM (2026-12-01), 8 rows of 7168 columns in L2, 1 thread:
 * 41.6-42.7 GB/s of weights converting, 47.2-47.7 with this. */
static inline __m512d bf16_xs8(__m512i v, __m512i perm) {
    const __m512i keep = _mm512_set1_epi64((long long)0x8fffffffffffffffull); /* sign, exponent low 8, fraction */
    __m512i q = _mm512_maskz_permutexvar_epi16((__mmask32)0x88888888u, perm, v);
    return _mm512_castsi512_pd(_mm512_and_si512(_mm512_srai_epi64(q, 3), keep));
}

void k3_rows_bf16_xs_avx512(const uint16_t *w, const double *xs, size_t n, float *out) {
    /* _mm512_set_epi16 lists words 31..0: qword k's top word (word 4k+3) takes weight word k (or 8 + k) */
    const __m512i p0 = _mm512_set_epi16(7, 0, 0, 0, 6, 0, 0, 0, 5, 0, 0, 0, 4, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 1, 0,
                                        0, 0, 0, 0, 0, 0);
    const __m512i p1 = _mm512_set_epi16(15, 0, 0, 0, 14, 0, 0, 0, 13, 0, 0, 0, 12, 0, 0, 0, 11, 0, 0, 0, 10, 0, 0, 0,
                                        9, 0, 0, 0, 8, 0, 0, 0);
    K3_ACC_DECL;
#define K3_XS_LOAD(r, at) _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(w + (r) * n + (at))))
#define K3_XS_ROW(a, r, V)                                                                                  \
    do {                                                                                                    \
        __m512i v_ = V;                                                                                     \
        a = fma8(a, bf16_xs8(v_, p0), x0);                                                                  \
        a = fma8(a, bf16_xs8(v_, p1), x1);                                                                  \
    } while (0)
#define K3_XS_STEP16(V)                                                                                     \
    do {                                                                                                    \
        K3_XS_ROW(a0, 0, V(0));                                                                             \
        K3_XS_ROW(a1, 1, V(1));                                                                             \
        K3_XS_ROW(a2, 2, V(2));                                                                             \
        K3_XS_ROW(a3, 3, V(3));                                                                             \
        K3_XS_ROW(a4, 4, V(4));                                                                             \
        K3_XS_ROW(a5, 5, V(5));                                                                             \
        K3_XS_ROW(a6, 6, V(6));                                                                             \
        K3_XS_ROW(a7, 7, V(7));                                                                             \
    } while (0)
    size_t i = 0;
#define V(r) K3_XS_LOAD(r, j)
    for (; i + 32 <= n; i += 32) { /* 64 bytes of each row per step */
        prefetch_rows8(w, n * sizeof *w, i * sizeof *w + K3_PF_AHEAD);
        for (size_t j = i; j < i + 32; j += 16) {
            __m512d x0 = _mm512_loadu_pd(xs + j), x1 = _mm512_loadu_pd(xs + j + 8);
            K3_XS_STEP16(V);
        }
    }
    for (size_t j = i; j + 16 <= n; j += 16, i += 16) {
        __m512d x0 = _mm512_loadu_pd(xs + j), x1 = _mm512_loadu_pd(xs + j + 8);
        K3_XS_STEP16(V);
    }
#undef V
    if (i < n) { /* 1..15 columns: one group of 8 lanes, or two; missing weights and x are +0 */
        const size_t left = n - i;
        const __mmask16 mw = (__mmask16)((1u << left) - 1);
        const __m512d x0 = _mm512_maskz_loadu_pd(tail_mask(left < 8 ? left : 8), xs + i);
#define V(r) _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(mw, w + (r) * n + i))
        if (left <= 8) {
#define K3_XS_ROW1(a, r) a = fma8(a, bf16_xs8(V(r), p0), x0)
            K3_XS_ROW1(a0, 0);
            K3_XS_ROW1(a1, 1);
            K3_XS_ROW1(a2, 2);
            K3_XS_ROW1(a3, 3);
            K3_XS_ROW1(a4, 4);
            K3_XS_ROW1(a5, 5);
            K3_XS_ROW1(a6, 6);
            K3_XS_ROW1(a7, 7);
#undef K3_XS_ROW1
        } else {
            const __m512d x1 = _mm512_maskz_loadu_pd(tail_mask(left - 8), xs + i + 8);
            K3_XS_STEP16(V);
        }
#undef V
    }
#undef K3_XS_STEP16
#undef K3_XS_ROW
#undef K3_XS_LOAD
    K3_ACC_OUT(out, a0, a1, a2, a3, a4, a5, a6, a7);
}

/* The same for 16 rows (K3_XS_ROWS), prefetching K3_PF_AHEAD16 bytes ahead in each: 16 streams
 * of 512 bytes in flight measured faster than 8 of 1 KiB on Zen 5 (2026-12-01, 12288 x 7168
 * from memory, 1 thread best of 20: 37.7-39.1 GB/s against 29.8-30.5 with 8 rows, the read
 * ceiling being 39.0-39.3 in the same hold; 2 threads 58.6-59.0 against 53.4-54.8; 16 rows with
 * 256, 384, 768 bytes ahead 36.8-38.5 / 51.0-59.6, 2 KiB ahead 21.6 / 36.9 (the lines in flight
 * outgrow L1), 24 and 32 rows 14.8-24.5 / 20.1-39.7 (accumulators spilled)). */
#ifndef K3_PF_AHEAD16
#define K3_PF_AHEAD16 512
#endif
void k3_rows_bf16_xs16_avx512(const uint16_t *w, const double *xs, size_t n, float *out) {
    const __m512i p0 = _mm512_set_epi16(7, 0, 0, 0, 6, 0, 0, 0, 5, 0, 0, 0, 4, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 1, 0,
                                        0, 0, 0, 0, 0, 0);
    const __m512i p1 = _mm512_set_epi16(15, 0, 0, 0, 14, 0, 0, 0, 13, 0, 0, 0, 12, 0, 0, 0, 11, 0, 0, 0, 10, 0, 0, 0,
                                        9, 0, 0, 0, 8, 0, 0, 0);
    enum { R = 16 };
    __m512d a[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) a[r] = _mm512_setzero_pd();
/* columns j .. j+15 of the 16 rows (a macro, not a function: the accumulators stay in registers) */
#define K3_XS16_COLS16(j)                                                                                   \
    do {                                                                                                    \
        const __m512d x0 = _mm512_loadu_pd(xs + (j)), x1 = _mm512_loadu_pd(xs + (j) + 8);                   \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {                                              \
            const __m512i v = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(w + r * n + (j)))); \
            a[r] = fma8(a[r], bf16_xs8(v, p0), x0);                                                         \
            a[r] = fma8(a[r], bf16_xs8(v, p1), x1);                                                         \
        }                                                                                                   \
    } while (0)
    size_t i = 0;
    for (; i + 32 <= n; i += 32) { /* 64 bytes of each row per step */
        const uintptr_t pf = (uintptr_t)(w + i) + K3_PF_AHEAD16;
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) _mm_prefetch((const char *)(pf + (size_t)r * n * sizeof *w), _MM_HINT_T0);
#pragma GCC unroll 2
        for (size_t j = i; j < i + 32; j += 16) K3_XS16_COLS16(j);
    }
    for (; i + 16 <= n; i += 16) K3_XS16_COLS16(i);
#undef K3_XS16_COLS16
    if (i < n) { /* 1..15 columns: one group of 8 lanes, or two; missing weights and x are +0 */
        const size_t left = n - i;
        const __mmask16 mw = (__mmask16)((1u << left) - 1);
        const __m512d x0 = _mm512_maskz_loadu_pd(tail_mask(left < 8 ? left : 8), xs + i);
        const __m512d x1 = left > 8 ? _mm512_maskz_loadu_pd(tail_mask(left - 8), xs + i + 8) : x0;
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            const __m512i v = _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(mw, w + r * n + i));
            a[r] = fma8(a[r], bf16_xs8(v, p0), x0);
            if (left > 8) a[r] = fma8(a[r], bf16_xs8(v, p1), x1);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) out[r] = reduce512(a[r]);
}

/* The same 16 rows with the bytes built by one shuffle per 8 weights and the shifts shared by 32
 * (k3_rows_bf16_xsb16_avx512, AVX512-VBMI): the double bf16_xs8 builds for a weight w has only
 * bytes 5, 6 and 7 non-zero: byte 5 = (w << 5) & 0xe0 (fraction bits 0..2 at bits 45..47),
 * byte 6 = (w >> 3) & 0xff (fraction bits 3..6 and exponent bits 0..3 at 48..55), byte 7 =
 * exponent bits 4..7 at 56..59, zeros at 60..62 and the sign at 63. For the 32 weights of one
 * 64-byte load W of a row, T = W << 5 (16-bit lanes) holds bytes 5 and 6 of every weight (its
 * low and high byte) and U = (W >>arith 3) & 0x8fff holds byte 7 (its high byte); then per 8
 * weights one zero-masked vpermi2b (bytes 5, 6, 7 of qword l from T and U, word 8j + l) and the
 * FMA. Per 32 weights 2 shifts, an AND, 4 vpermi2b and 4 FMAs where bf16_xs8 spends 4 vpermw,
 * 4 shifts and 4 ANDs: on Zen 4, whose 512-bit shifts, shuffles and FMAs each hold a 256-bit
 * pipe for two cycles, the kernel is bound by those pipes, not by memory, at 1 thread.
 * Measured on the 2-vCPU EPYC Zen 4 VM (2026-12-01, bench/decode_zen4/harness.c, best / median
 * of 15 alternated calls): 96 rows x 7168 in L2, 1 thread 23.5 / 23.0 GB/s (xs16) -> 29.1 /
 * 28.7; 12288 x 7168 from memory 18.7 / 18.3 -> 24.8 / 23.5 (2 threads 31.7 / 28.2 -> 33.1 /
 * 29.1, both at the read ceiling). The same doubles into the same FMAs in the same order: the
 * bits of k3_rows_bf16_xs16_avx512. The 1..31 columns after the last 32 are loaded masked (+0
 * weights and x: an accumulator, never -0, is unchanged by +0). K3_PF_AHEAD_XSB bytes ahead
 * in each row (0: the hardware prefetchers alone, measured best here). */
#ifndef K3_PF_AHEAD_XSB
#define K3_PF_AHEAD_XSB 0
#endif
static inline __attribute__((target("avx512vbmi"), always_inline)) __m512d bf16_xsb8(__m512i t, __m512i u, __m512i idx) {
    return _mm512_castsi512_pd(_mm512_maskz_permutex2var_epi8((__mmask64)0xE0E0E0E0E0E0E0E0ull, t, idx, u));
}
/* next != NULL (k3_rows_bf16_xsb16n_avx512): the next job's next_bytes (the driver's: the 16 rows
 * this thread computes next, contiguous) are prefetched into L2 while these 16 rows are computed,
 * evenly over the 32-column steps (at least 1 KiB a step, whole lines): one sequential stream
 * the prefetchers follow, where the 16 rows' own loads are 16 streams 2 * n bytes apart. Only
 * prefetches: the same operations in the same order as without. Measured on the Zen 4 VM
 * (eighth session, bench/decode_zen4/tiled.c, 12288 x 7168 from memory, 1 thread, best / median
 * of 21 alternated calls): 23.7 / 22.1 -> 28.3 / 27.5 GB/s, 22.6 / 18.8 -> 27.5 / 21.6. */
static inline __attribute__((target("avx512vbmi"), always_inline)) void xsb16_body(const uint16_t *w, const double *xs,
                                                                                    size_t n, float *out,
                                                                                    const void *next,
                                                                                    size_t next_bytes) {
    uintptr_t pf = (uintptr_t)next, pf_end = next ? pf + next_bytes : 0;
    size_t pf_step = 0; /* bytes of the next job prefetched a 32-column step */
    if (next && n >= 32) pf_step = ((next_bytes + n / 32 - 1) / (n / 32) + 1023) & ~(size_t)1023;
    /* idx[j]: qword l takes byte 5 = T byte 2(8j + l), byte 6 = T byte 2(8j + l) + 1, byte 7 = U byte 2(8j + l) + 1
     * (vpermi2b: index bit 6 picks U); bytes 0..4 are zeroed by the mask */
    __m512i idx[4];
    for (int j = 0; j < 4; j++) {
        uint8_t b[64];
        for (int l = 0; l < 8; l++) {
            const int wd = 8 * j + l;
            memset(b + 8 * l, 0, 5);
            b[8 * l + 5] = (uint8_t)(2 * wd);
            b[8 * l + 6] = (uint8_t)(2 * wd + 1);
            b[8 * l + 7] = (uint8_t)(64 + 2 * wd + 1);
        }
        idx[j] = _mm512_loadu_si512(b);
    }
    const __m512i k8f = _mm512_set1_epi16((short)0x8fff); /* sign and exponent bits 4..7 in the high byte */
    enum { R = 16 };
    __m512d a[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) a[r] = _mm512_setzero_pd();
/* the 32 weights of row r from W at column j: groups 0 .. G-1 of 8 */
#define K3_XSB_ROW(r, W, G)                                                                              \
    do {                                                                                                    \
        const __m512i t_ = _mm512_slli_epi16(W, 5), u_ = _mm512_and_si512(_mm512_srai_epi16(W, 3), k8f);    \
        _Pragma("GCC unroll 4") for (int g = 0; g < (G); g++) a[r] =                                        \
            fma8(a[r], bf16_xsb8(t_, u_, idx[g]), xg[g]);                                                   \
    } while (0)
    size_t i = 0;
    for (; i + 32 <= n; i += 32) { /* 64 bytes of each row per step */
        if (K3_PF_AHEAD_XSB) {
            const uintptr_t pa = (uintptr_t)(w + i) + K3_PF_AHEAD_XSB;
#pragma GCC unroll 16
            for (int r = 0; r < R; r++) _mm_prefetch((const char *)(pa + (size_t)r * n * sizeof *w), _MM_HINT_T0);
        }
        if (pf < pf_end) {
            for (size_t o = 0; o < pf_step; o += 64) _mm_prefetch((const char *)(pf + o), _MM_HINT_T1);
            pf += pf_step;
        }
        const __m512d xg[4] = {_mm512_loadu_pd(xs + i), _mm512_loadu_pd(xs + i + 8), _mm512_loadu_pd(xs + i + 16),
                               _mm512_loadu_pd(xs + i + 24)};
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            const __m512i W = _mm512_loadu_si512((const void *)(w + r * n + i));
            K3_XSB_ROW(r, W, 4);
        }
    }
    if (i < n) { /* 1..31 columns: ceil(left / 8) groups of 8 lanes; missing weights and x are +0 */
        const size_t left = n - i;
        const int groups = (int)((left + 7) / 8);
        const __mmask32 mw = (__mmask32)((1u << left) - 1); /* left < 32 */
        __m512d xg[4];
        for (int g = 0; g < 4; g++) {
            const size_t c = (size_t)g * 8;
            xg[g] = c < left ? _mm512_maskz_loadu_pd(tail_mask(left - c < 8 ? left - c : 8), xs + i + c)
                             : _mm512_setzero_pd();
        }
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            const __m512i W = _mm512_maskz_loadu_epi16(mw, w + r * n + i);
            K3_XSB_ROW(r, W, groups);
        }
    }
#undef K3_XSB_ROW
#pragma GCC unroll 16
    for (int r = 0; r < R; r++) out[r] = reduce512(a[r]);
}
__attribute__((target("avx512vbmi"))) void k3_rows_bf16_xsb16_avx512(const uint16_t *w, const double *xs, size_t n,
                                                                      float *out) {
    xsb16_body(w, xs, n, out, NULL, 0);
}
__attribute__((target("avx512vbmi"))) void k3_rows_bf16_xsb16n_avx512(const uint16_t *w, const double *xs, size_t n,
                                                                       float *out, const void *next,
                                                                       size_t next_bytes) {
    xsb16_body(w, xs, n, out, next, next_bytes);
}

/* 8 rows x 2 tokens (x and x + n): each weight vector is converted once for both. */
void k3_rows_bf16_x2_avx512(const uint16_t *w, const float *x, size_t n, float *out) {
    const __m256i idx = K3_BF16_IDX;
    K3_ACC_DECL;
    __m512d b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0, b6 = a0, b7 = a0;
    const float *x2 = x + n;
#define K3_STEP8_X2(W8)                                                                                     \
    do {                                                                                                    \
        __m512d wd_;                                                                                        \
        wd_ = W8(0), a0 = fma8(a0, wd_, xa), b0 = fma8(b0, wd_, xb);                                        \
        wd_ = W8(1), a1 = fma8(a1, wd_, xa), b1 = fma8(b1, wd_, xb);                                        \
        wd_ = W8(2), a2 = fma8(a2, wd_, xa), b2 = fma8(b2, wd_, xb);                                        \
        wd_ = W8(3), a3 = fma8(a3, wd_, xa), b3 = fma8(b3, wd_, xb);                                        \
        wd_ = W8(4), a4 = fma8(a4, wd_, xa), b4 = fma8(b4, wd_, xb);                                        \
        wd_ = W8(5), a5 = fma8(a5, wd_, xa), b5 = fma8(b5, wd_, xb);                                        \
        wd_ = W8(6), a6 = fma8(a6, wd_, xa), b6 = fma8(b6, wd_, xb);                                        \
        wd_ = W8(7), a7 = fma8(a7, wd_, xa), b7 = fma8(b7, wd_, xb);                                        \
    } while (0)
    size_t i = 0;
#define W8(r) bf16x8(w + (r) * n + j, idx)
    for (; i + 32 <= n; i += 32) {
        prefetch_rows8(w, n * sizeof *w, i * sizeof *w + K3_PF_AHEAD);
        for (size_t j = i; j < i + 32; j += 8) {
            __m512d xa = f32x8(x + j), xb = f32x8(x2 + j);
            K3_STEP8_X2(W8);
        }
    }
    for (size_t j = i; j + 8 <= n; j += 8, i += 8) {
        __m512d xa = f32x8(x + j), xb = f32x8(x2 + j);
        K3_STEP8_X2(W8);
    }
#undef W8
    if (i < n) {
        __mmask8 m = tail_mask(n - i);
        __m512d xa = f32x8_tail(x + i, m), xb = f32x8_tail(x2 + i, m);
#define W8(r) bf16x8_tail(w + (r) * n + i, m, idx)
        K3_STEP8_X2(W8);
#undef W8
    }
#undef K3_STEP8_X2
    K3_ACC_OUT(out, a0, a1, a2, a3, a4, a5, a6, a7);
    K3_ACC_OUT(out + 8, b0, b1, b2, b3, b4, b5, b6, b7);
}

/* ---- MXFP4 ----
 * One 32-element block: 16 packed bytes, one scale byte. Element k of a 64-bit
 * little-endian word of packed bytes sits in bits 4k..4k+3 (byte j: element 2j in
 * the low nibble, 2j+1 in the high one), so broadcasting the word and shifting lane
 * k right by 4k (or 4k-32) puts element k's code in bits 0..3 of lane k. vpermi2pd
 * reads exactly those bits: 0..2 pick the entry, bit 3 (the sign) picks the
 * negative half of the table. The table is the E2M1 values times the block scale
 * 2^(s-127), one 128-byte entry per scale byte s (mxfp4_tab, 32 KiB, built once):
 * E2M1 * 2^k is exact in double, so the weight equals the scalar one, and the
 * product with a float activation is exact too, so fma(w, x, acc) gives the bits of
 * acc + w*x. Per 8 weights: a shift, a vpermi2pd and an FMA. */

static double mxfp4_tab[256][16] __attribute__((aligned(64)));
static pthread_once_t mxfp4_tab_once = PTHREAD_ONCE_INIT;
static void mxfp4_tab_init(void) {
    for (unsigned s = 0; s < 256; s++)
        for (unsigned c = 0; c < 16; c++) mxfp4_tab[s][c] = (double)E2M1_VALUES[c] * k3_mxfp4_scale((uint8_t)s);
}

typedef struct {
    __m512i sh_lo, sh_hi; /* shifts for elements 0..7 and 8..15 of a 64-bit word */
} mxfp4_consts;

static inline mxfp4_consts mxfp4_init(void) {
    pthread_once(&mxfp4_tab_once, mxfp4_tab_init);
    mxfp4_consts c;
    c.sh_lo = _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28);
    c.sh_hi = _mm512_setr_epi64(32, 36, 40, 44, 48, 52, 56, 60);
    return c;
}

static inline __m512i bcast_word(const uint8_t *p) {
    uint64_t q;
    memcpy(&q, p, sizeof q);
    return _mm512_set1_epi64((long long)q);
}

/* the 8 weights of elements 8j..8j+7 of a block (j = 0..3) with the block's table t */
#define K3_MX_W(t, q, sh) _mm512_permutex2var_pd(_mm512_load_pd(t), _mm512_srlv_epi64(q, sh), _mm512_load_pd((t) + 8))

/* acc += the 32 products of one block (packed bytes p, table t), x0..x3 its activations */
static inline __m512d mxfp4_block(const mxfp4_consts *c, __m512d acc, const uint8_t *p, const double *t, __m512d x0,
                                  __m512d x1, __m512d x2, __m512d x3) {
    __m512i q0 = bcast_word(p), q1 = bcast_word(p + 8);
    acc = fma8(acc, K3_MX_W(t, q0, c->sh_lo), x0);
    acc = fma8(acc, K3_MX_W(t, q0, c->sh_hi), x1);
    acc = fma8(acc, K3_MX_W(t, q1, c->sh_lo), x2);
    acc = fma8(acc, K3_MX_W(t, q1, c->sh_hi), x3);
    return acc;
}

float k3_dot_mxfp4_avx512(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n) {
    const mxfp4_consts c = mxfp4_init();
    __m512d acc = _mm512_setzero_pd();
    for (size_t b = 0; b < n / 32; b++) {
        const float *xb = x + b * 32;
        acc = mxfp4_block(&c, acc, packed + b * 16, mxfp4_tab[scales[b]], f32x8(xb), f32x8(xb + 8), f32x8(xb + 16),
                          f32x8(xb + 24));
    }
    return reduce512(acc);
}

/* The one-token 8-row kernel (decode's expert hot spot). The table offsets of the 8
 * rows' blocks are prepared per chunk of K3_MX_CHUNK blocks into a small array on the
 * stack (one 16-byte load, zero-extension and shift per 16 blocks of a row), so the
 * block loop needs one base register for all 8 rows' scales and no scalar shift per
 * block; x is converted once per 8 rows. No software prefetch: the kernel is bound by
 * its vector ports (a shift, a vpermi2pd and an FMA per 8 weights) and the hardware
 * prefetchers keep its 8 row streams ahead; prefetching each row 1 KiB ahead measured
 * 5-7 % slower (1 thread, 64 distinct experts from memory, best of 40 calls:
 * 20.2-20.5 GFLOP/s with it, 21.5-21.6 without). K3_MX_AHEAD > 0 turns it back on. */
#define K3_MX_CHUNK 64
/* Prefetch of the NEXT 8 rows into L2 while these 8 are computed (K3_MX_NEXT, on by
 * default): a row block is one contiguous region (8 rows of packed bytes, then the scales
 * elsewhere), and the drivers hand a thread consecutive blocks (dynamic chunks of 4), so the
 * next block is usually the thread's next job. The hardware prefetchers do poorly on these
 * 8 short interleaved streams (a row of rw6's experts is 1.5-1.75 KiB, 24-28 lines): spread
 * over the block loop, 2 lines per 32-column block cover the next block's 8 x n/2 bytes
 * (its 8 rows of scales at the first block). Measured on the 2-core Xeon VM, 16 of 48
 * distinct rw6-shaped experts (w1/w3 3072 x 3584, w2 3584 x 3072) per call, one token,
 * weights from memory, best / mean of 20 calls in one lock hold, alternated: 1 thread
 * 17.2-20.0 / 15.9-16.6 GFLOP/s without, 20.4-26.1 / 18.8-24.6 with; 2 threads 32.8-35.8 /
 * 30.2-32.8 without, 38.6-44.3 / 35.9-39.9 with. Harmless at the last block of a matrix
 * (the lines after it, or the next matrix's). -DK3_MX_NEXT=N prefetches N blocks ahead
 * (0 turns it off); 2 and 3 measured no better than 1 (03:57 UTC, same harness). */
#ifndef K3_MX_NEXT
#define K3_MX_NEXT 1
#endif

static inline __attribute__((always_inline)) void mxfp4_prefetch_next(const uint8_t *packed, const uint8_t *scales,
                                                                      size_t pr, size_t sr, size_t nb, size_t b) {
    const char *q = (const char *)packed + K3_MX_NEXT * 8 * pr + b * (8 * pr / nb); /* 8 pr / nb = 128 bytes */
    _mm_prefetch(q, _MM_HINT_T1);
    _mm_prefetch(q + 64, _MM_HINT_T1);
    if (b == 0)
        for (size_t r = 0; r < 8 * sr; r += 64) _mm_prefetch((const char *)scales + K3_MX_NEXT * 8 * sr + r, _MM_HINT_T1);
}
#ifndef K3_MX_AHEAD
#define K3_MX_AHEAD 0
#endif

static inline void mxfp4_offsets(const uint8_t *s, size_t nb, uint32_t *off) {
    size_t b = 0;
    for (; b + 16 <= nb; b += 16)
        _mm512_storeu_si512(off + b, _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(s + b))), 7));
    if (b < nb) {
        __mmask16 m = (__mmask16)((1u << (nb - b)) - 1);
        _mm512_mask_storeu_epi32(off + b, m, _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, s + b)), 7));
    }
}

/* The 8 rows' body; x (float, widened here per block) or xd (already double): with the
 * constant NULL of each caller the other branch compiles away. */
static inline __attribute__((always_inline)) void mxfp4_rows8(const uint8_t *packed, const uint8_t *scales,
                                                              const float *x, const double *xd, size_t n, float *out) {
    const mxfp4_consts c = mxfp4_init();
    const size_t pr = n / 2, sr = n / 32, nb = n / 32; /* row strides; blocks per row */
    const char *tab = (const char *)mxfp4_tab;
    uint32_t off[8][K3_MX_CHUNK];
    K3_ACC_DECL;
    for (size_t b0 = 0; b0 < nb; b0 += K3_MX_CHUNK) {
        const size_t nbc = nb - b0 < K3_MX_CHUNK ? nb - b0 : K3_MX_CHUNK;
        for (size_t r = 0; r < 8; r++) mxfp4_offsets(scales + r * sr + b0, nbc, off[r]);
        for (size_t b = 0; b < nbc; b++) {
            const uint8_t *p = packed + (b0 + b) * 16;
            if (K3_MX_AHEAD && (b & 3) == 0) prefetch_rows8(p, pr, K3_MX_AHEAD);
            if (K3_MX_NEXT) mxfp4_prefetch_next(packed, scales, pr, sr, nb, b0 + b);
            __m512d x0, x1, x2, x3;
            if (xd) {
                const double *xb = xd + (b0 + b) * 32;
                x0 = _mm512_loadu_pd(xb), x1 = _mm512_loadu_pd(xb + 8), x2 = _mm512_loadu_pd(xb + 16),
                x3 = _mm512_loadu_pd(xb + 24);
            } else {
                const float *xb = x + (b0 + b) * 32;
                x0 = f32x8(xb), x1 = f32x8(xb + 8), x2 = f32x8(xb + 16), x3 = f32x8(xb + 24);
            }
#define K3_MX_ROW(a, r) a = mxfp4_block(&c, a, p + (r) * pr, (const double *)(tab + off[r][b]), x0, x1, x2, x3)
            K3_MX_ROW(a0, 0);
            K3_MX_ROW(a1, 1);
            K3_MX_ROW(a2, 2);
            K3_MX_ROW(a3, 3);
            K3_MX_ROW(a4, 4);
            K3_MX_ROW(a5, 5);
            K3_MX_ROW(a6, 6);
            K3_MX_ROW(a7, 7);
#undef K3_MX_ROW
        }
    }
    K3_ACC_OUT(out, a0, a1, a2, a3, a4, a5, a6, a7);
}

void k3_rows_mxfp4_avx512(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n, float *out) {
    mxfp4_rows8(packed, scales, x, NULL, n, out);
}

/* The same 8 rows with x already in double (xd[i] == (double)x[i], converted once per
 * call by the driver instead of once per 8 rows here): the block's 4 x vectors are plain
 * loads, which the FMAs take as memory operands (8 fewer vector uops per block of 8
 * rows: 2 per conversion). The same operations on the same doubles: the same bits. */
void k3_rows_mxfp4_xd_avx512(const uint8_t *packed, const uint8_t *scales, const double *xd, size_t n, float *out) {
    mxfp4_rows8(packed, scales, NULL, xd, n, out);
}

/* The same 8 rows with a one-source lookup (k3_rows_mxfp4_xdw_avx512): the double
 * E2M1[c] * 2^(s-127) has only its top 16 bits non-zero (at most 2 significant bits: the
 * mantissa's bit 51 at most), so a zero-masked vpermw putting word mxfp4_topw[s][c] into word 3
 * of each qword builds it; the table (256 scales x 32 words, 16 KiB) holds the 16 codes twice,
 * since the index is bits 48..52 of the qword and bit 52 is the next nibble. The index of lane l
 * is its nibble shifted LEFT to bits 48..51: vpsllvq by 48 - 4l of the block's first 8 bytes
 * broadcast as a qword (elements 0..7), of bytes 4..7 broadcast as a dword (8..15), and the same
 * for bytes 8..15. Per 8 weights a shift, a vpermw and an FMA, as shift + vpermi2pd + FMA in
 * mxfp4_rows8, but a one-source permute: on Zen 4, where a 512-bit two-source permute competes
 * with the FMAs for their pipe (12 FMAs + 12 vpermi2pd take ~20.5 cycles, + 12 vpermw ~16-18),
 * measured 2026-12-01 (bench/decode_zen4/harness.c, 16 of 48 rw6-shaped experts from memory, one
 * token, 1 thread, best / median of 9 alternated calls): 29.5 / 28.6 -> 31.7 / 29.9 GFLOP/s;
 * 64 rows in L2 29.3 / 28.2 -> 31.9 / 30.3. The same doubles in the same FMAs: the same bits. */
static uint16_t mxfp4_topw[256][32] __attribute__((aligned(64)));
static pthread_once_t mxfp4_topw_once = PTHREAD_ONCE_INIT;
static void mxfp4_topw_init(void) {
    pthread_once(&mxfp4_tab_once, mxfp4_tab_init);
    for (unsigned s = 0; s < 256; s++)
        for (unsigned c = 0; c < 32; c++) {
            uint64_t u;
            memcpy(&u, &mxfp4_tab[s][c & 15], sizeof u); /* low 48 bits zero (see above) */
            mxfp4_topw[s][c] = (uint16_t)(u >> 48);
        }
}
static inline __m512d mxfp4_w16(__m512i idx, __m512i tw) {
    return _mm512_castsi512_pd(_mm512_maskz_permutexvar_epi16((__mmask32)0x88888888u, idx, tw));
}
void k3_rows_mxfp4_xdw_avx512(const uint8_t *packed, const uint8_t *scales, const double *xd, size_t n, float *out) {
    pthread_once(&mxfp4_topw_once, mxfp4_topw_init);
    const size_t pr = n / 2, sr = n / 32, nb = n / 32; /* row strides; blocks per row */
    const __m512i sl = _mm512_setr_epi64(48, 44, 40, 36, 32, 28, 24, 20);
    K3_ACC_DECL;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *p = packed + b * 16;
        if (K3_MX_NEXT) mxfp4_prefetch_next(packed, scales, pr, sr, nb, b);
        const double *xb = xd + b * 32;
        const __m512d x0 = _mm512_loadu_pd(xb), x1 = _mm512_loadu_pd(xb + 8), x2 = _mm512_loadu_pd(xb + 16),
                      x3 = _mm512_loadu_pd(xb + 24);
#define K3_MXW_ROW(a, r)                                                                                    \
    do {                                                                                                    \
        const uint8_t *q_ = p + (r) * pr;                                                                   \
        const __m512i tw_ = _mm512_load_si512((const void *)mxfp4_topw[scales[(r) * sr + b]]);              \
        uint64_t w0_, w1_;                                                                                  \
        uint32_t h0_, h1_;                                                                                  \
        memcpy(&w0_, q_, 8), memcpy(&h0_, q_ + 4, 4), memcpy(&w1_, q_ + 8, 8), memcpy(&h1_, q_ + 12, 4);    \
        a = fma8(a, mxfp4_w16(_mm512_sllv_epi64(_mm512_set1_epi64((long long)w0_), sl), tw_), x0);          \
        a = fma8(a, mxfp4_w16(_mm512_sllv_epi64(_mm512_set1_epi32((int)h0_), sl), tw_), x1);                \
        a = fma8(a, mxfp4_w16(_mm512_sllv_epi64(_mm512_set1_epi64((long long)w1_), sl), tw_), x2);          \
        a = fma8(a, mxfp4_w16(_mm512_sllv_epi64(_mm512_set1_epi32((int)h1_), sl), tw_), x3);                \
    } while (0)
        K3_MXW_ROW(a0, 0);
        K3_MXW_ROW(a1, 1);
        K3_MXW_ROW(a2, 2);
        K3_MXW_ROW(a3, 3);
        K3_MXW_ROW(a4, 4);
        K3_MXW_ROW(a5, 5);
        K3_MXW_ROW(a6, 6);
        K3_MXW_ROW(a7, 7);
#undef K3_MXW_ROW
    }
    K3_ACC_OUT(out, a0, a1, a2, a3, a4, a5, a6, a7);
}

/* The same 8 rows from the lane layout (k3_mxfp4_to_lanes): per 128 columns each row's 64 bytes
 * are loaded once and kept in a register; code j of lane l is brought to bits 48..51 of its qword
 * by one immediate shift (left by 48 - 4j, or right by 4j - 48: bit 52 is then the next code's
 * or zero, and the 32-word table holds every code twice), then the same zero-masked vpermw of
 * mxfp4_topw and the same FMA as k3_rows_mxfp4_xdw_avx512, with the 8 rows innermost (8
 * independent chains between two FMAs of one chain). Per 8 weights a shift, a vpermw and an FMA
 * and no broadcast (xdw's four broadcast loads per 32 weights are what holds it at ~1.85 cycles
 * per 8 weights instead of 1.5 on Zen 4: bench/decode_zen4/ports.c). Measured in
 * bench/decode_zen4/harness.c (its mxr8, 2026-12-02, 16 of 48 rw6 experts from memory, GFLOP/s
 * best / median, three holds): 1 thread 31.6-33.3 / 28.4-32.4 against xdw's 28.8-31.0 /
 * 23.7-27.7, 2 threads 62.2-65.6 / 55.5-58.8 against 51.8-59.6 / 46.5-50.3; this function itself in
 * two later holds +4-8 % from memory, +8-20 % in L2 (docs/PERFORMANCE.md). The same doubles into
 * the same FMAs in the same order: the bits of xdw. n % K3_MXFP4_LANE_COLS == 0. */
/* (& 63 only keeps the unused arm's immediate in range: j is a constant) */
#define K3_MXL_IDX(Q, j) ((j) <= 12 ? _mm512_slli_epi64(Q, (48 - 4 * (j)) & 63) : _mm512_srli_epi64(Q, (4 * (j) - 48) & 63))
void k3_rows_mxfp4_xdl_avx512(const uint8_t *lanes, const uint8_t *scales, const double *xd, size_t n, float *out) {
    pthread_once(&mxfp4_topw_once, mxfp4_topw_init);
    enum { R = 8 };
    const size_t pr = n / 2, sr = n / 32, nb = n / 32, nq = n / K3_MXFP4_LANE_COLS;
    __m512d a[R];
    for (int r = 0; r < R; r++) a[r] = _mm512_setzero_pd();
    for (size_t q = 0; q < nq; q++) {
        if (K3_MX_NEXT)
            for (size_t b = 4 * q; b < 4 * q + 4; b++) mxfp4_prefetch_next(lanes, scales, pr, sr, nb, b);
        const double *xb = xd + q * K3_MXFP4_LANE_COLS;
        __m512i Q[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            Q[r] = _mm512_loadu_si512((const void *)(lanes + (size_t)r * pr + q * 64));
            __asm__("" : "+v"(Q[r])); /* in a register, not a memory operand of every shift */
        }
#define K3_MXL_STEP(j)                                                                                      \
    do {                                                                                                    \
        const __m512d x_ = _mm512_loadu_pd(xb + 8 * (j));                                                   \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                                 \
            a[r] = fma8(a[r], mxfp4_w16(K3_MXL_IDX(Q[r], j), tw[r]), x_);                                   \
    } while (0)
#define K3_MXL_BLOCK(bb)                                                                                    \
    do {                                                                                                    \
        __m512i tw[R];                                                                                      \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) tw[r] =                                         \
            _mm512_load_si512((const void *)mxfp4_topw[scales[(size_t)r * sr + 4 * q + (bb)]]);             \
        K3_MXL_STEP(4 * (bb));                                                                              \
        K3_MXL_STEP(4 * (bb) + 1);                                                                          \
        K3_MXL_STEP(4 * (bb) + 2);                                                                          \
        K3_MXL_STEP(4 * (bb) + 3);                                                                          \
    } while (0)
        K3_MXL_BLOCK(0);
        K3_MXL_BLOCK(1);
        K3_MXL_BLOCK(2);
        K3_MXL_BLOCK(3);
#undef K3_MXL_BLOCK
#undef K3_MXL_STEP
    }
    K3_ACC_OUT(out, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
}
#undef K3_MXL_IDX

/* 4 rows x 2 tokens (x and x + n): each decoded weight vector serves both tokens;
 * out[j] token 0 of row j, out[8 + j] token 1. The 8-row _x2 kernel runs it twice. */
typedef struct {
    __m512d a0, a1, a2, a3; /* token 0: the 32 activations of the block in double */
    __m512d b0, b1, b2, b3; /* token 1 */
} x2_block;

static inline void mxfp4_block_x2(const mxfp4_consts *c, __m512d *a, __m512d *b, const uint8_t *packed,
                                  const double *t, const x2_block *xv) {
    __m512i q0 = bcast_word(packed), q1 = bcast_word(packed + 8);
    __m512d e0 = K3_MX_W(t, q0, c->sh_lo), e1 = K3_MX_W(t, q0, c->sh_hi);
    __m512d e2 = K3_MX_W(t, q1, c->sh_lo), e3 = K3_MX_W(t, q1, c->sh_hi);
    *a = fma8(fma8(fma8(fma8(*a, e0, xv->a0), e1, xv->a1), e2, xv->a2), e3, xv->a3);
    *b = fma8(fma8(fma8(fma8(*b, e0, xv->b0), e1, xv->b1), e2, xv->b2), e3, xv->b3);
}

static void mxfp4_rows4_x2(const mxfp4_consts *c, const uint8_t *packed, const uint8_t *scales, const float *x,
                           size_t n, float *out) {
    const size_t pr = n / 2, sr = n / 32;
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (size_t b = 0; b < n / 32; b++) {
        const float *xa = x + b * 32, *xb = x + n + b * 32;
        const x2_block xv = {f32x8(xa), f32x8(xa + 8), f32x8(xa + 16), f32x8(xa + 24),
                             f32x8(xb), f32x8(xb + 8), f32x8(xb + 16), f32x8(xb + 24)};
        const uint8_t *p = packed + b * 16, *s = scales + b;
        mxfp4_block_x2(c, &a0, &b0, p, mxfp4_tab[s[0]], &xv);
        mxfp4_block_x2(c, &a1, &b1, p + pr, mxfp4_tab[s[sr]], &xv);
        mxfp4_block_x2(c, &a2, &b2, p + 2 * pr, mxfp4_tab[s[2 * sr]], &xv);
        mxfp4_block_x2(c, &a3, &b3, p + 3 * pr, mxfp4_tab[s[3 * sr]], &xv);
    }
    out[0] = reduce512(a0);
    out[1] = reduce512(a1);
    out[2] = reduce512(a2);
    out[3] = reduce512(a3);
    out[8] = reduce512(b0);
    out[9] = reduce512(b1);
    out[10] = reduce512(b2);
    out[11] = reduce512(b3);
}

void k3_rows_mxfp4_x2_avx512(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n, float *out) {
    const mxfp4_consts c = mxfp4_init();
    mxfp4_rows4_x2(&c, packed, scales, x, n, out);
    mxfp4_rows4_x2(&c, packed + 4 * (n / 2), scales + 4 * (n / 32), x, n, out + 4);
}

/* The lane layout in place, 64 bytes (128 codes of one row) at a time: the codes of the even and
 * odd columns split into bytes (lo[b] = column 2b, hi[b] = column 2b + 1), then lane byte 8l + k
 * takes column 16k + l in its low nibble and 16k + 8 + l in its high one (k3_mxfp4_to_lanes),
 * both gathered by one vpermi2b from (lo, hi): byte (l & 1 ? 64 : 0) + 8k + l / 2, and + 4 for
 * the high nibble's column. A permutation of the nibbles: test_kernels checks it against
 * k3_mxfp4_to_lanes. */
__attribute__((target("avx512vbmi"))) void k3_mxfp4_to_lanes_vbmi(uint8_t *p, size_t n64) {
    uint8_t ia[64], ib[64];
    for (int l = 0; l < 8; l++)
        for (int k = 0; k < 8; k++) {
            ia[8 * l + k] = (uint8_t)((l & 1 ? 64 : 0) + 8 * k + l / 2);
            ib[8 * l + k] = (uint8_t)(ia[8 * l + k] + 4);
        }
    const __m512i idx_a = _mm512_loadu_si512((const void *)ia), idx_b = _mm512_loadu_si512((const void *)ib);
    const __m512i nib = _mm512_set1_epi8(0x0f);
    for (size_t g = 0; g < n64; g++) {
        uint8_t *q = p + 64 * g;
        const __m512i v = _mm512_loadu_si512((const void *)q);
        const __m512i lo = _mm512_and_si512(v, nib), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
        const __m512i a = _mm512_permutex2var_epi8(lo, idx_a, hi), b = _mm512_permutex2var_epi8(lo, idx_b, hi);
        _mm512_storeu_si512((void *)q, _mm512_or_si512(a, _mm512_slli_epi16(b, 4)));
    }
}

#endif
