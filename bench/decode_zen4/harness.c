/* harness.c - one-token kernel variants on this CPU (seventh session, Zen 4), outside the build.
 *   cc -O2 -fopenmp -ffp-contract=off -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx512vbmi -mavx2 -mfma -I. \
 *      bench/decode_zen4/harness.c build/libk3.a -lm -o /tmp/d4_harness
 *   flock /work/bench.lock /tmp/d4_harness [bf16|mx|l2] [reps]
 * bf16: a 12288 x 7168 matrix from memory (THP buffer like the engine's trunk), 1 and 2 threads,
 * jobs of the variant's rows, schedule(dynamic, 4) as the coordinator; variants alternated
 * call by call; best and median GB/s of weight bytes. Every variant's output is compared with
 * the library's xs16 bits. mx: 16 of 48 distinct rw6-shaped experts (w1, w3 3072 x 3584,
 * w2 3584 x 3072) per call, rotating, one token, GFLOP/s (2 per weight). l2: the same kernels
 * on 16 rows that stay in L2 (the compute ceiling). */
#include "bench/decode_zen4/bench_util.h"
static inline float red4x2(__m256d lo, __m256d hi) {
    double l[8];
    _mm256_storeu_pd(l, lo);
    _mm256_storeu_pd(l + 4, hi);
    return k3_reduce8(l);
}

/* ---------------- bf16 variants ---------------- */
typedef struct {
    const float *x;
    const double *xs; /* x * 2^896 */
    const double *xd; /* x */
} xin;
typedef void (*bf_fn)(const uint16_t *w, const xin *in, size_t n, float *out);

static void lib_xs16(const uint16_t *w, const xin *in, size_t n, float *o) { k3_rows_bf16_xs16_avx512(w, in->xs, n, o); }
static void lib_xsb16(const uint16_t *w, const xin *in, size_t n, float *o) { k3_rows_bf16_xsb16_avx512(w, in->xs, n, o); }
static void lib_xs8(const uint16_t *w, const xin *in, size_t n, float *o) { k3_rows_bf16_xs_avx512(w, in->xs, n, o); }
static void lib_cvt8(const uint16_t *w, const xin *in, size_t n, float *o) { k3_rows_bf16_avx512(w, in->x, n, o); }
static void lib_avx2(const uint16_t *w, const xin *in, size_t n, float *o) { k3_rows_bf16_avx2(w, in->x, n, o); }

static inline __m512d xs8(__m512i v, __m512i perm) {
    const __m512i keep = _mm512_set1_epi64((long long)0x8fffffffffffffffull);
    __m512i q = _mm512_maskz_permutexvar_epi16((__mmask32)0x88888888u, perm, v);
    return _mm512_castsi512_pd(_mm512_and_si512(_mm512_srai_epi64(q, 3), keep));
}
#define P0 _mm512_set_epi16(7, 0, 0, 0, 6, 0, 0, 0, 5, 0, 0, 0, 4, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0)
#define P1 _mm512_set_epi16(15, 0, 0, 0, 14, 0, 0, 0, 13, 0, 0, 0, 12, 0, 0, 0, 11, 0, 0, 0, 10, 0, 0, 0, 9, 0, 0, 0, 8, 0, 0, 0)

/* xs, R rows, prefetch PF bytes ahead (0: none); full 32-column steps only (n % 32 == 0 here) */
#define XS_ZMM(NAME, R, PF)                                                                                  \
    static void NAME(const uint16_t *w, const xin *in, size_t n, float *o) {                                \
        const __m512i p0 = P0, p1 = P1;                                                                      \
        const double *xs = in->xs;                                                                           \
        __m512d a[R];                                                                                        \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) a[r] = _mm512_setzero_pd();                     \
        for (size_t i = 0; i < n; i += 32) {                                                                 \
            if (PF) {                                                                                        \
                const uintptr_t pf = (uintptr_t)(w + i) + (PF);                                              \
                _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                         \
                    _mm_prefetch((const char *)(pf + (size_t)r * n * 2), _MM_HINT_T0);                       \
            }                                                                                                \
            _Pragma("GCC unroll 2") for (size_t j = i; j < i + 32; j += 16) {                                \
                const __m512d x0 = _mm512_loadu_pd(xs + j), x1 = _mm512_loadu_pd(xs + j + 8);                \
                _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {                                       \
                    const __m512i v = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(w + r * n + j))); \
                    a[r] = _mm512_fmadd_pd(xs8(v, p0), x0, a[r]);                                            \
                    a[r] = _mm512_fmadd_pd(xs8(v, p1), x1, a[r]);                                            \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) o[r] = red8(a[r]);                              \
    }
XS_ZMM(xs16_pf0, 16, 0)
XS_ZMM(xs16_pf256, 16, 256)
XS_ZMM(xs16_pf512, 16, 512)
XS_ZMM(xs16_pf1k, 16, 1024)
XS_ZMM(xs8_pf1k, 8, 1024)
XS_ZMM(xs8_pf2k, 8, 2048)

/* xs with vpshufb zmm (in-lane) from a 128-bit broadcast instead of vpermw: lane L of 4 gets
 * words 2L, 2L+1 of the 8 loaded */
static inline __m512i sb_idx(void) {
    /* qword 2L (bytes 16L..16L+7): bytes 6,7 <- word 2L (bytes 4L, 4L+1 of the lane's copy); qword 2L+1 <- word 2L+1 */
    char b[64];
    for (int L = 0; L < 4; L++)
        for (int k = 0; k < 16; k++) {
            int q = k / 8, byte = k % 8; /* qword in lane, byte in qword */
            int word = 2 * L + q;
            b[16 * L + k] = byte == 6 ? (char)(2 * word) : byte == 7 ? (char)(2 * word + 1) : (char)0x80;
        }
    return _mm512_loadu_si512(b);
}
#define XS_SB(NAME, R, PF)                                                                                   \
    static void NAME(const uint16_t *w, const xin *in, size_t n, float *o) {                                \
        const __m512i idx = sb_idx();                                                                        \
        const __m512i keep = _mm512_set1_epi64((long long)0x8fffffffffffffffull);                            \
        const double *xs = in->xs;                                                                           \
        __m512d a[R];                                                                                        \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) a[r] = _mm512_setzero_pd();                     \
        for (size_t i = 0; i < n; i += 32) {                                                                 \
            if (PF) {                                                                                        \
                const uintptr_t pf = (uintptr_t)(w + i) + (PF);                                              \
                _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                         \
                    _mm_prefetch((const char *)(pf + (size_t)r * n * 2), _MM_HINT_T0);                       \
            }                                                                                                \
            _Pragma("GCC unroll 4") for (size_t j = i; j < i + 32; j += 8) {                                 \
                const __m512d x0 = _mm512_loadu_pd(xs + j);                                                  \
                _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {                                       \
                    const __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(w + r * n + j))); \
                    const __m512i q = _mm512_shuffle_epi8(v, idx);                                           \
                    a[r] = _mm512_fmadd_pd(_mm512_castsi512_pd(_mm512_and_si512(_mm512_srai_epi64(q, 3), keep)), x0, a[r]); \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) o[r] = red8(a[r]);                              \
    }
XS_SB(xs16sb_pf512, 16, 512)

/* ymm halves of xs: a row's 8 lanes are two ymm accumulators (lanes 0-3, 4-7); vpshufb ymm of a
 * 128-bit broadcast: low lane words 0,1 / 4,5, high lane 2,3 / 6,7 */
static inline __m256i ysb_idx(int half) {
    char b[32];
    for (int L = 0; L < 2; L++)
        for (int k = 0; k < 16; k++) {
            int q = k / 8, byte = k % 8;
            int word = 4 * half + 2 * L + q;
            b[16 * L + k] = byte == 6 ? (char)(2 * word) : byte == 7 ? (char)(2 * word + 1) : (char)0x80;
        }
    return _mm256_loadu_si256((const __m256i *)b);
}
#define XS_YMM(NAME, R, PF)                                                                                  \
    static void NAME(const uint16_t *w, const xin *in, size_t n, float *o) {                                \
        const __m256i i0 = ysb_idx(0), i1 = ysb_idx(1);                                                      \
        const __m256i keep = _mm256_set1_epi64x((long long)0x8fffffffffffffffull);                           \
        const double *xs = in->xs;                                                                           \
        __m256d lo[R], hi[R];                                                                                \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) lo[r] = hi[r] = _mm256_setzero_pd();            \
        for (size_t i = 0; i < n; i += 32) {                                                                 \
            if (PF) {                                                                                        \
                const uintptr_t pf = (uintptr_t)(w + i) + (PF);                                              \
                _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                         \
                    _mm_prefetch((const char *)(pf + (size_t)r * n * 2), _MM_HINT_T0);                       \
            }                                                                                                \
            _Pragma("GCC unroll 4") for (size_t j = i; j < i + 32; j += 8) {                                 \
                _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {                                       \
                    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(w + r * n + j))); \
                    const __m256i q0 = _mm256_shuffle_epi8(v, i0), q1 = _mm256_shuffle_epi8(v, i1);         \
                    lo[r] = _mm256_fmadd_pd(_mm256_castsi256_pd(_mm256_and_si256(_mm256_srai_epi64(q0, 3), keep)), _mm256_loadu_pd(xs + j), lo[r]); \
                    hi[r] = _mm256_fmadd_pd(_mm256_castsi256_pd(_mm256_and_si256(_mm256_srai_epi64(q1, 3), keep)), _mm256_loadu_pd(xs + j + 4), hi[r]); \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) o[r] = red4x2(lo[r], hi[r]);                    \
    }
XS_YMM(xsy8_pf1k, 8, 1024)
XS_YMM(xsy12_pf512, 12, 512)

/* vpshufb + vcvtps2pd (the older decode) in R-row jobs with x already in double (unscaled) */
#define CVT_ZMM(NAME, R, PF)                                                                                 \
    static void NAME(const uint16_t *w, const xin *in, size_t n, float *o) {                                \
        const __m256i idx = _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7, -1, -1, 8, 9, -1, -1, 10, 11, -1, -1, 12, 13, -1, -1, 14, 15); \
        const double *xd = in->xd;                                                                           \
        __m512d a[R];                                                                                        \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) a[r] = _mm512_setzero_pd();                     \
        for (size_t i = 0; i < n; i += 32) {                                                                 \
            if (PF) {                                                                                        \
                const uintptr_t pf = (uintptr_t)(w + i) + (PF);                                              \
                _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                         \
                    _mm_prefetch((const char *)(pf + (size_t)r * n * 2), _MM_HINT_T0);                       \
            }                                                                                                \
            _Pragma("GCC unroll 4") for (size_t j = i; j < i + 32; j += 8) {                                 \
                const __m512d x0 = _mm512_loadu_pd(xd + j);                                                  \
                _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {                                       \
                    const __m256i u = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(w + r * n + j))), idx); \
                    a[r] = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_castsi256_ps(u)), x0, a[r]);               \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) o[r] = red8(a[r]);                              \
    }
CVT_ZMM(cvt16_pf512, 16, 512)

/* the same with ymm halves: vcvtps2pd xmm -> ymm */
#define CVT_YMM(NAME, R, PF)                                                                                 \
    static void NAME(const uint16_t *w, const xin *in, size_t n, float *o) {                                \
        const __m256i idx = _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7, -1, -1, 8, 9, -1, -1, 10, 11, -1, -1, 12, 13, -1, -1, 14, 15); \
        const double *xd = in->xd;                                                                           \
        __m256d lo[R], hi[R];                                                                                \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) lo[r] = hi[r] = _mm256_setzero_pd();            \
        for (size_t i = 0; i < n; i += 32) {                                                                 \
            if (PF) {                                                                                        \
                const uintptr_t pf = (uintptr_t)(w + i) + (PF);                                              \
                _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                         \
                    _mm_prefetch((const char *)(pf + (size_t)r * n * 2), _MM_HINT_T0);                       \
            }                                                                                                \
            _Pragma("GCC unroll 4") for (size_t j = i; j < i + 32; j += 8) {                                 \
                _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {                                       \
                    const __m256i u = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(w + r * n + j))), idx); \
                    lo[r] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(_mm256_castsi256_ps(u))), _mm256_loadu_pd(xd + j), lo[r]); \
                    hi[r] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(_mm256_castsi256_ps(u), 1)), _mm256_loadu_pd(xd + j + 4), hi[r]); \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) o[r] = red4x2(lo[r], hi[r]);                    \
    }
CVT_YMM(cvty8_pf1k, 8, 1024)

/* bytes instead of a shift per 8 weights: per 32 weights of a row (one 64-byte load W),
 * T = W << 5 (16-bit lanes: low byte = the double's byte 5, high byte = byte 6) and
 * U = (W >>arith 3) & 0x8fff (high byte = byte 7: w bits 11..14 and the sign at bit 7); then per
 * 8 weights one zero-masked vpermi2b (bytes 5, 6, 7 of each qword from T and U) and the FMA:
 * the bits of bf16_xs8 */
#define XS_B3(NAME, R, PF)                                                                                   \
    static void NAME(const uint16_t *w, const xin *in, size_t n, float *o) {                                \
        const __m512i i0 = b3_idx(0), i1 = b3_idx(1), i2 = b3_idx(2), i3 = b3_idx(3);                        \
        const __m512i k8f = _mm512_set1_epi16((short)0x8fff);                                                \
        const __mmask64 m = 0xE0E0E0E0E0E0E0E0ull;                                                           \
        const double *xs = in->xs;                                                                           \
        __m512d a[R];                                                                                        \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) a[r] = _mm512_setzero_pd();                     \
        for (size_t i = 0; i < n; i += 32) {                                                                 \
            if (PF) {                                                                                        \
                const uintptr_t pf = (uintptr_t)(w + i) + (PF);                                              \
                _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                         \
                    _mm_prefetch((const char *)(pf + (size_t)r * n * 2), _MM_HINT_T0);                       \
            }                                                                                                \
            _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {                                           \
                const __m512i W = _mm512_loadu_si512((const void *)(w + r * n + i));                         \
                const __m512i T = _mm512_slli_epi16(W, 5), U = _mm512_and_si512(_mm512_srai_epi16(W, 3), k8f); \
                a[r] = _mm512_fmadd_pd(_mm512_castsi512_pd(_mm512_maskz_permutex2var_epi8(m, T, i0, U)), _mm512_loadu_pd(xs + i), a[r]); \
                a[r] = _mm512_fmadd_pd(_mm512_castsi512_pd(_mm512_maskz_permutex2var_epi8(m, T, i1, U)), _mm512_loadu_pd(xs + i + 8), a[r]); \
                a[r] = _mm512_fmadd_pd(_mm512_castsi512_pd(_mm512_maskz_permutex2var_epi8(m, T, i2, U)), _mm512_loadu_pd(xs + i + 16), a[r]); \
                a[r] = _mm512_fmadd_pd(_mm512_castsi512_pd(_mm512_maskz_permutex2var_epi8(m, T, i3, U)), _mm512_loadu_pd(xs + i + 24), a[r]); \
            }                                                                                                \
        }                                                                                                    \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) o[r] = red8(a[r]);                              \
    }
XS_B3(b3_16_pf512, 16, 512)
XS_B3(b3_16_pf1k, 16, 1024)
XS_B3(b3_8_pf1k, 8, 1024)
XS_B3(b3_8_pf2k, 8, 2048)
XS_B3(b3_16_pf0, 16, 0)
XS_B3(b3_16_pf256, 16, 256)
XS_B3(b3_12_pf0, 12, 0)
XS_B3(b3_24_pf0, 24, 0)


/* pt (ninth session): V = vpermw(W) (word 4p + k <- word 8k + p), then 32- and 64-bit shifts and
 * ANDs only (ops that issue beside the FMA on Zen 4: bench/decode_zen4/ports.c), 13 + 1 ops per
 * 32 weights against xsb16's 11 with four vpermi2b; lt: the same on memory already in that
 * transposed order (a load-time layout; speed only: its bits differ, MISMATCH is expected).
 * Measured: pt16 27.4 against xsb16 28.9 GB/s in L2, lt12 30.7 (+6 %): not worth a layout. */
#define XS_PT(NAME, R, LT)                                                                                   \
    static void NAME(const uint16_t *w, const xin *in, size_t n, float *o) {                                 \
        const double *xs = in->xs;                                                                           \
        short ti[32];                                                                                        \
        for (int p = 0; p < 8; p++) for (int k = 0; k < 4; k++) ti[4 * p + k] = (short)(8 * k + p);         \
        const __m512i tidx = _mm512_loadu_si512(ti);                                                         \
        const __m512i M = _mm512_set1_epi64((long long)0x8FFFE00000000000ull);                               \
        __m512d a[R];                                                                                        \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) a[r] = _mm512_setzero_pd();                     \
        for (size_t i = 0; i < n; i += 32) {                                                                 \
            const __m512d x0 = _mm512_loadu_pd(xs + i), x1 = _mm512_loadu_pd(xs + i + 8),                     \
                          x2 = _mm512_loadu_pd(xs + i + 16), x3 = _mm512_loadu_pd(xs + i + 24);               \
            _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {                                           \
                __m512i W = _mm512_loadu_si512((const void *)(w + r * n + i));                               \
                if (!LT) W = _mm512_permutexvar_epi16(tidx, W);                                              \
                const __m512i sh = _mm512_srai_epi32(W, 3);                                                  \
                const __m512i sl = _mm512_srai_epi32(_mm512_slli_epi32(W, 16), 3);                           \
                const __m512d d0 = _mm512_castsi512_pd(_mm512_and_si512(_mm512_slli_epi64(sl, 32), M));      \
                const __m512d d1 = _mm512_castsi512_pd(_mm512_and_si512(_mm512_slli_epi64(sh, 32), M));      \
                const __m512d d2 = _mm512_castsi512_pd(_mm512_and_si512(sl, M));                             \
                const __m512d d3 = _mm512_castsi512_pd(_mm512_and_si512(sh, M));                             \
                a[r] = _mm512_fmadd_pd(d0, x0, a[r]);                                                        \
                a[r] = _mm512_fmadd_pd(d1, x1, a[r]);                                                        \
                a[r] = _mm512_fmadd_pd(d2, x2, a[r]);                                                        \
                a[r] = _mm512_fmadd_pd(d3, x3, a[r]);                                                        \
            }                                                                                                \
        }                                                                                                    \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) o[r] = red8(a[r]);                              \
    }
XS_PT(pt16, 16, 0)
XS_PT(pt12, 12, 0)
XS_PT(pt8, 8, 0)
XS_PT(lt16, 16, 1)
XS_PT(lt12, 12, 1)
typedef struct {
    const char *name;
    bf_fn fn;
    int rows;
} bf_var;
static const bf_var BF[] = {
    {"lib xs16 (512B)", lib_xs16, 16},   {"lib xsb16 (bytes)", lib_xsb16, 16},   {"lib xs 8 (1K)", lib_xs8, 8},       {"lib cvt 8 (x float)", lib_cvt8, 8},
    {"lib avx2 8", lib_avx2, 8},         {"xs16 pf0", xs16_pf0, 16},          {"xs16 pf256", xs16_pf256, 16},
    {"xs16 pf512", xs16_pf512, 16},      {"xs16 pf1k", xs16_pf1k, 16},        {"xs8 pf1k", xs8_pf1k, 8},
    {"xs8 pf2k", xs8_pf2k, 8},           {"xs16 vpshufb pf512", xs16sb_pf512, 16}, {"xs ymm 8 pf1k", xsy8_pf1k, 8},
    {"xs ymm 12 pf512", xsy12_pf512, 12}, {"cvt16 xd pf512", cvt16_pf512, 16}, {"cvt ymm 8 xd pf1k", cvty8_pf1k, 8},
    {"b3 16 pf512", b3_16_pf512, 16}, {"b3 16 pf1k", b3_16_pf1k, 16}, {"b3 8 pf1k", b3_8_pf1k, 8}, {"b3 8 pf2k", b3_8_pf2k, 8}, {"b3 16 pf0", b3_16_pf0, 16}, {"b3 16 pf256", b3_16_pf256, 16}, {"b3 12 pf0", b3_12_pf0, 12}, {"b3 24 pf0", b3_24_pf0, 24}, {"pt16 vpermw+shifts", pt16, 16}, {"pt12", pt12, 12}, {"pt8", pt8, 8}, {"lt16 (layout, wrong bits)", lt16, 16}, {"lt12 (layout, wrong bits)", lt12, 12},
};
#define NBF (sizeof BF / sizeof BF[0])

static void bf_run(const bf_var *v, const uint16_t *w, size_t rows, size_t n, const xin *in, float *y) {
    const size_t R = (size_t)v->rows, jobs = rows / R;
#pragma omp parallel for schedule(dynamic, 4)
    for (size_t j = 0; j < jobs; j++) v->fn(w + j * R * n, in, n, y + j * R);
}

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, z = *(const double *)b;
    return x < z ? -1 : x > z;
}

static void bench_bf16(int reps, int l2) {
    const size_t rows = l2 ? 96 : 12288, n = 7168; /* l2: 96 rows (48 a thread at 2 threads: 672 KiB, in L2) */
    uint16_t *w = weight_mem_alloc(rows * n * 2);
    float *x = aligned_alloc(64, n * 4), *y = aligned_alloc(64, rows * 4), *ref = aligned_alloc(64, rows * 4);
    double *xs = aligned_alloc(64, n * 8), *xd = aligned_alloc(64, n * 8);
    uint64_t s = 1;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < rows * n; i++) {
        uint64_t t = i * 0x9e3779b97f4a7c15ull;
        uint64_t r = rng(&t);
        w[i] = (uint16_t)(((r >> 16) & 0x8000) | (0x3c00 + (r & 0x07ff))); /* finite, |w| ~ 2^-7..2^-4 */
    }
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)((double)(rng(&s) >> 11) * 0x1p-53 - 0.5);
        xs[i] = (double)x[i] * K3_BF16_XS_SCALE;
        xd[i] = x[i];
    }
    xin in = {x, xs, xd};
    double *t = malloc(sizeof(double) * NBF * (size_t)reps);
    const int inner = l2 ? 200 : 1;
    for (int th = 1; th <= 2; th++) {
        omp_set_num_threads(th);
        bf_run(&BF[0], w, rows, n, &in, ref);
        for (size_t v = 0; v < NBF; v++) { /* warm + check */
            memset(y, 0, rows * 4);
            bf_run(&BF[v], w, rows, n, &in, y);
            if (memcmp(y, ref, rows * 4)) printf("MISMATCH %s\n", BF[v].name);
        }
        for (int r = 0; r < reps; r++)
            for (size_t v = 0; v < NBF; v++) {
                double t0 = now_s();
                for (int k = 0; k < inner; k++) bf_run(&BF[v], w, rows, n, &in, y);
                t[v * reps + r] = (now_s() - t0) / inner;
            }
        printf("bf16 %zu x %zu%s, %d thread(s), %d alternated calls: GB/s best / median\n", rows, n, l2 ? " (L2)" : "",
               th, reps);
        for (size_t v = 0; v < NBF; v++) {
            qsort(t + v * reps, (size_t)reps, sizeof *t, cmpd);
            double gb = (double)rows * n * 2 / 1e9;
            printf("  %-22s %6.1f / %6.1f\n", BF[v].name, gb / t[v * reps], gb / t[v * reps + reps / 2]);
        }
    }
    free(t);
    weight_mem_free(w);
}

/* ---------------- MXFP4 variants ---------------- */
static double tab[256][16] __attribute__((aligned(64)));
static void tab_init(void) {
    for (unsigned s = 0; s < 256; s++)
        for (unsigned c = 0; c < 16; c++) tab[s][c] = (double)E2M1_VALUES[c] * k3_mxfp4_scale((uint8_t)s);
}
typedef void (*mx_fn)(const uint8_t *p, const uint8_t *s, const double *xd, size_t n, float *out);

static inline __m512i bq(const uint8_t *p) {
    uint64_t q;
    memcpy(&q, p, 8);
    return _mm512_set1_epi64((long long)q);
}
/* R rows, shift kind SH (0 srlv, 1 multishift), prefetch of the next R-row block (NEXT) */
#define MX_ROWS(NAME, R, SH, NEXT)                                                                           \
    static void NAME(const uint8_t *packed, const uint8_t *scales, const double *xd, size_t n, float *out) { \
        const size_t pr = n / 2, sr = n / 32, nb = n / 32;                                                   \
        const __m512i slo = SH ? _mm512_set1_epi64(0x0000000000000000ll) : _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28); \
        const __m512i shi = _mm512_setr_epi64(32, 36, 40, 44, 48, 52, 56, 60);                               \
        const __m512i mlo = _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28), mhi = shi;                      \
        (void)slo;                                                                                           \
        __m512d a[R];                                                                                        \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) a[r] = _mm512_setzero_pd();                     \
        for (size_t b = 0; b < nb; b++) {                                                                    \
            const uint8_t *p = packed + b * 16;                                                              \
            if (NEXT) {                                                                                      \
                const char *q = (const char *)packed + (size_t)R * pr + b * ((size_t)R * pr / nb);          \
                for (size_t o = 0; o < (size_t)R * pr / nb; o += 64) _mm_prefetch(q + o, _MM_HINT_T1);       \
                if (b == 0)                                                                                  \
                    for (size_t o = 0; o < (size_t)R * sr; o += 64)                                          \
                        _mm_prefetch((const char *)scales + (size_t)R * sr + o, _MM_HINT_T1);                \
            }                                                                                                \
            const double *xb = xd + b * 32;                                                                  \
            const __m512d x0 = _mm512_loadu_pd(xb), x1 = _mm512_loadu_pd(xb + 8), x2 = _mm512_loadu_pd(xb + 16), \
                          x3 = _mm512_loadu_pd(xb + 24);                                                     \
            _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {                                           \
                const double *t = tab[scales[r * sr + b]];                                                   \
                const __m512d t0 = _mm512_load_pd(t), t1 = _mm512_load_pd(t + 8);                            \
                const __m512i q0 = bq(p + r * pr), q1 = bq(p + r * pr + 8);                                  \
                __m512i i0, i1, i2, i3;                                                                      \
                if (SH) {                                                                                    \
                    i0 = _mm512_multishift_epi64_epi8(mlo, q0), i1 = _mm512_multishift_epi64_epi8(mhi, q0);  \
                    i2 = _mm512_multishift_epi64_epi8(mlo, q1), i3 = _mm512_multishift_epi64_epi8(mhi, q1);  \
                } else {                                                                                     \
                    i0 = _mm512_srlv_epi64(q0, mlo), i1 = _mm512_srlv_epi64(q0, mhi);                        \
                    i2 = _mm512_srlv_epi64(q1, mlo), i3 = _mm512_srlv_epi64(q1, mhi);                        \
                }                                                                                            \
                a[r] = _mm512_fmadd_pd(_mm512_permutex2var_pd(t0, i0, t1), x0, a[r]);                        \
                a[r] = _mm512_fmadd_pd(_mm512_permutex2var_pd(t0, i1, t1), x1, a[r]);                        \
                a[r] = _mm512_fmadd_pd(_mm512_permutex2var_pd(t0, i2, t1), x2, a[r]);                        \
                a[r] = _mm512_fmadd_pd(_mm512_permutex2var_pd(t0, i3, t1), x3, a[r]);                        \
            }                                                                                                \
        }                                                                                                    \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) out[r] = red8(a[r]);                            \
    }
MX_ROWS(mx8_srlv, 8, 0, 1)
MX_ROWS(mx8_ms, 8, 1, 1)
MX_ROWS(mx4_srlv, 4, 0, 1)
MX_ROWS(mx16_srlv, 16, 0, 1)
MX_ROWS(mx16_ms, 16, 1, 1)
MX_ROWS(mx8_srlv_nopf, 8, 0, 0)

/* multishift index of BOTH halves of a qword pair: one vpmultishiftqb gives lane l's byte 0 =
 * nibble l and byte 4 = nibble l + 8 (from a broadcast word); vpermi2pd reads bits 0..3, so the
 * second index is that vector shifted by 32 - the same count as srlv. (not built: on paper) */

/* MXFP4 with a one-source lookup: the doubles of E2M1 * 2^(s-127) have only their top 16 bits
 * non-zero, so vpermw (zero-masked to word 3 of each qword) of a 32-word table (16 codes,
 * twice: the index's bit 4 is the next nibble) builds them; the index of lane l is the nibble
 * shifted LEFT to bits 48..51 (vpsllvq by 48 - 4l of a 64-bit broadcast for elements 0..7, of
 * a 32-bit broadcast for 8..15) */
static uint16_t topw[256][32] __attribute__((aligned(64)));
static void topw_init(void) {
    for (unsigned s = 0; s < 256; s++)
        for (unsigned c = 0; c < 32; c++) {
            double v = tab[s][c & 15];
            uint64_t u;
            memcpy(&u, &v, 8);
            if (u & 0xffffffffffffull) abort();
            topw[s][c] = (uint16_t)(u >> 48);
        }
}
#define MXW_ROWS(NAME, R, NEXT)                                                                              \
    static void NAME(const uint8_t *packed, const uint8_t *scales, const double *xd, size_t n, float *out) { \
        const size_t pr = n / 2, sr = n / 32, nb = n / 32;                                                   \
        const __m512i sl = _mm512_setr_epi64(48, 44, 40, 36, 32, 28, 24, 20);                               \
        __m512d a[R];                                                                                        \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) a[r] = _mm512_setzero_pd();                     \
        for (size_t b = 0; b < nb; b++) {                                                                    \
            const uint8_t *p = packed + b * 16;                                                              \
            if (NEXT) {                                                                                      \
                const char *q = (const char *)packed + (size_t)R * pr + b * ((size_t)R * pr / nb);          \
                for (size_t o = 0; o < (size_t)R * pr / nb; o += 64) _mm_prefetch(q + o, _MM_HINT_T1);       \
                if (b == 0)                                                                                  \
                    for (size_t o = 0; o < (size_t)R * sr; o += 64)                                          \
                        _mm_prefetch((const char *)scales + (size_t)R * sr + o, _MM_HINT_T1);                \
            }                                                                                                \
            const double *xb = xd + b * 32;                                                                  \
            _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {                                           \
                const __m512i tw = _mm512_load_si512((const void *)topw[scales[r * sr + b]]);                \
                const uint8_t *pp = p + r * pr;                                                              \
                uint64_t q0, q1; uint32_t d0, d1;                                                            \
                memcpy(&q0, pp, 8), memcpy(&d0, pp + 4, 4), memcpy(&q1, pp + 8, 8), memcpy(&d1, pp + 12, 4); \
                const __m512i i0 = _mm512_sllv_epi64(_mm512_set1_epi64((long long)q0), sl);                  \
                const __m512i i1 = _mm512_sllv_epi64(_mm512_set1_epi32((int)d0), sl);                        \
                const __m512i i2 = _mm512_sllv_epi64(_mm512_set1_epi64((long long)q1), sl);                  \
                const __m512i i3 = _mm512_sllv_epi64(_mm512_set1_epi32((int)d1), sl);                        \
                a[r] = _mm512_fmadd_pd(_mm512_castsi512_pd(_mm512_maskz_permutexvar_epi16(0x88888888u, i0, tw)), _mm512_loadu_pd(xb), a[r]); \
                a[r] = _mm512_fmadd_pd(_mm512_castsi512_pd(_mm512_maskz_permutexvar_epi16(0x88888888u, i1, tw)), _mm512_loadu_pd(xb + 8), a[r]); \
                a[r] = _mm512_fmadd_pd(_mm512_castsi512_pd(_mm512_maskz_permutexvar_epi16(0x88888888u, i2, tw)), _mm512_loadu_pd(xb + 16), a[r]); \
                a[r] = _mm512_fmadd_pd(_mm512_castsi512_pd(_mm512_maskz_permutexvar_epi16(0x88888888u, i3, tw)), _mm512_loadu_pd(xb + 24), a[r]); \
            }                                                                                                \
        }                                                                                                    \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) out[r] = red8(a[r]);                            \
    }
MXW_ROWS(mxw8, 8, 1)
MXW_ROWS(mxw16, 16, 1)

/* the next R rows (R * pr packed bytes, R * sr scales) into L2, spread over the steps of a row:
 * step i of n prefetches its share (and the scales at step 0) */
static inline void prefetch_next_rows(const uint8_t *packed, const uint8_t *scales, size_t R, size_t pr, size_t sr,
                                      size_t n, size_t i) {
    const char *pn = (const char *)packed + R * pr + i * (R * pr / n);
    for (size_t o = 0; o < R * pr / n; o += 64) _mm_prefetch(pn + o, _MM_HINT_T1);
    if (i == 0)
        for (size_t o = 0; o < R * sr; o += 64) _mm_prefetch((const char *)scales + R * sr + o, _MM_HINT_T1);
}

/* mxw8 with the 8 rows innermost (tenth session): per block, group by group, each row's
 * broadcast + shift + vpermw + FMA (8 independent chains between two FMAs of a chain, as the library's k3_rows_mxfp4_xdl_avx512)
 * instead of each row's 4 chained FMAs in turn. The same operations: the same bits. */
static void mxw8ri(const uint8_t *packed, const uint8_t *scales, const double *xd, size_t n, float *out) {
    enum { R = 8 };
    const size_t pr = n / 2, sr = n / 32, nb = n / 32;
    const __m512i sl = _mm512_setr_epi64(48, 44, 40, 36, 32, 28, 24, 20);
    __m512d a[R];
    for (int r = 0; r < R; r++) a[r] = _mm512_setzero_pd();
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *p = packed + b * 16;
        prefetch_next_rows(packed, scales, R, pr, sr, nb, b);
        const double *xb = xd + b * 32;
        __m512i tw[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) tw[r] = _mm512_load_si512((const void *)topw[scales[(size_t)r * sr + b]]);
#define MXW_G(g, BC, off)                                                                                 \
    do {                                                                                                  \
        const __m512d x_ = _mm512_loadu_pd(xb + 8 * (g));                                                 \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                             \
            const uint8_t *pp = p + (size_t)r * pr + (off);                                               \
            const __m512i i_ = _mm512_sllv_epi64(BC(pp), sl);                                             \
            a[r] = _mm512_fmadd_pd(_mm512_castsi512_pd(_mm512_maskz_permutexvar_epi16(0x88888888u, i_, tw[r])), x_, a[r]); \
        }                                                                                                 \
    } while (0)
#define BCQ(pp) ({ uint64_t q_; memcpy(&q_, pp, 8); _mm512_set1_epi64((long long)q_); })
#define BCD(pp) ({ uint32_t d_; memcpy(&d_, pp, 4); _mm512_set1_epi32((int)d_); })
        MXW_G(0, BCQ, 0);
        MXW_G(1, BCD, 4);
        MXW_G(2, BCQ, 8);
        MXW_G(3, BCD, 12);
#undef MXW_G
#undef BCQ
#undef BCD
    }
    for (int r = 0; r < R; r++) out[r] = red8(a[r]);
}


static void lib_mx(const uint8_t *p, const uint8_t *s, const double *xd, size_t n, float *o) {
    k3_rows_mxfp4_xd_avx512(p, s, xd, n, o);
}
static void lib_mxw(const uint8_t *p, const uint8_t *s, const double *xd, size_t n, float *o) {
    k3_rows_mxfp4_xdw_avx512(p, s, xd, n, o);
}
static void lib_mxl(const uint8_t *p, const uint8_t *s, const double *xd, size_t n, float *o) {
    k3_rows_mxfp4_xdl_avx512(p, s, xd, n, o);
}
typedef struct {
    const char *name;
    mx_fn fn;
    const void *f32fn; /* a float-x kernel (AVX2) instead */
    int rows;
    int repacked; /* takes mxm.rp (k3_mxfp4_to_lanes's layout) */
} mx_var;
static void avx2_mx_stub(const uint8_t *p, const uint8_t *s, const double *xd, size_t n, float *o) {
    (void)p, (void)s, (void)xd, (void)n, (void)o;
}
static const mx_var MX[] = {
    {"lib mxfp4_xd 8", lib_mx, NULL, 8},        {"lib mxfp4_xdw 8 (words)", lib_mxw, NULL, 8},        {"lib avx2 8 (x float)", avx2_mx_stub, (const void *)k3_rows_mxfp4_avx2, 8},
    {"mx8 srlv next", mx8_srlv, NULL, 8},       {"mx8 multishift next", mx8_ms, NULL, 8},
    {"mx4 srlv next", mx4_srlv, NULL, 4},       {"mx16 srlv next", mx16_srlv, NULL, 16},
    {"mx16 multishift next", mx16_ms, NULL, 16}, {"mx8 srlv no prefetch", mx8_srlv_nopf, NULL, 8},
    {"mxw8 sllv+vpermw", mxw8, NULL, 8, 0}, {"mxw16 sllv+vpermw", mxw16, NULL, 16, 0},
    {"mxw8ri rows innermost", mxw8ri, NULL, 8, 0},
    {"lib mxfp4_xdl (lanes)", lib_mxl, NULL, 8, 1},
};
#define NMX (sizeof MX / sizeof MX[0])

typedef struct {
    size_t rows, cols;
    uint8_t *p, *s;
    uint8_t *rp; /* the packed bytes in k3_mxfp4_to_lanes's layout */
} mxm;

static void mx_call(const mx_var *v, const mxm *m, size_t nm, const float *const *x, const double *const *xd,
                    float *const *y) {
    size_t first[64];
    first[0] = 0;
    for (size_t i = 0; i < nm; i++) first[i + 1] = first[i] + m[i].rows / (size_t)v->rows;
    const size_t R = (size_t)v->rows;
#pragma omp parallel for schedule(guided, 4)
    for (size_t j = 0; j < first[nm]; j++) {
        size_t i = 0;
        while (j >= first[i + 1]) i++;
        const size_t r0 = (j - first[i]) * R, c = m[i].cols;
        if (v->f32fn)
            ((k3_rows_mxfp4_fn)v->f32fn)(m[i].p + r0 * c / 2, m[i].s + r0 * c / 32, x[i], c, y[i] + r0);
        else v->fn((v->repacked ? m[i].rp : m[i].p) + r0 * c / 2, m[i].s + r0 * c / 32, xd[i], c, y[i] + r0);
    }
}

static void bench_mx(int reps, int l2) {
    tab_init();
    topw_init();
    enum { NE = 48, PER = 16 };
    const size_t d = 7168 / 2, f = 3072; /* rw6: hidden 7168? expert w1/w3 3072 x 3584 (rows x cols), w2 3584 x 3072 */
    (void)d;
    const size_t ne = l2 ? 1 : NE;
    mxm *m = malloc(sizeof(mxm) * ne * 3);
    for (size_t e = 0; e < ne * 3; e++) {
        size_t rows = e % 3 == 2 ? 3584 : f, cols = e % 3 == 2 ? f : 3584;
        if (l2) rows = 64;
        m[e].rows = rows, m[e].cols = cols;
        m[e].p = weight_mem_alloc(rows * cols / 2 + rows * cols / 32);
        m[e].s = m[e].p + rows * cols / 2;
        uint64_t sd = e + 7;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < rows * cols / 2; i += 8) {
            uint64_t t = (e + 1) * 0x9e3779b97f4a7c15ull ^ i, r = rng(&t);
            memcpy(m[e].p + i, &r, 8);
        }
        for (size_t i = 0; i < rows * cols / 32; i++) m[e].s[i] = (uint8_t)(110 + rng(&sd) % 30);
        m[e].rp = weight_mem_alloc(rows * cols / 2);
        k3_mxfp4_to_lanes(m[e].p, m[e].rp, rows, cols);
    }
    float *xa = aligned_alloc(64, 3584 * 4), *xb = aligned_alloc(64, 3584 * 4);
    double *xda = aligned_alloc(64, 3584 * 8), *xdb = aligned_alloc(64, 3584 * 8);
    uint64_t s = 3;
    for (size_t i = 0; i < 3584; i++) {
        xa[i] = (float)((double)(rng(&s) >> 11) * 0x1p-53 - 0.5), xda[i] = xa[i];
        xb[i] = (float)((double)(rng(&s) >> 11) * 0x1p-53 - 0.5), xdb[i] = xb[i];
    }
    const size_t per = l2 ? 1 : PER, nm = per * 3;
    float *yb = malloc(sizeof(float) * nm * 3584), *rb = malloc(sizeof(float) * nm * 3584);
    float *y[48], *ry[48];
    const float *x[48];
    const double *xd[48];
    for (size_t i = 0; i < nm; i++) {
        y[i] = yb + i * 3584, ry[i] = rb + i * 3584;
        x[i] = i % 3 == 2 ? xb : xa, xd[i] = i % 3 == 2 ? xdb : xda;
    }
    double flop = 0;
    for (size_t i = 0; i < nm; i++) flop += 2.0 * (double)m[i].rows * (double)m[i].cols;
    double *t = malloc(sizeof(double) * NMX * (size_t)reps);
    const int inner = l2 ? 100 : 1;
    mxm sel[48];
    for (int th = 1; th <= 2; th++) {
        omp_set_num_threads(th);
        for (size_t i = 0; i < nm; i++) sel[i] = m[i];
        mx_call(&MX[0], sel, nm, x, xd, ry);
        for (size_t v = 0; v < NMX; v++) {
            mx_call(&MX[v], sel, nm, x, xd, y);
            if (memcmp(yb, rb, sizeof(float) * nm * 3584) && 0) printf("MISMATCH %s\n", MX[v].name);
            for (size_t i = 0; i < nm; i++)
                if (memcmp(y[i], ry[i], m[i].rows * 4)) { printf("MISMATCH %s (matrix %zu)\n", MX[v].name, i); break; }
        }
        int call = 0;
        for (int r = 0; r < reps; r++)
            for (size_t v = 0; v < NMX; v++) {
                const size_t e0 = l2 ? 0 : (size_t)(call++ % 3) * PER; /* 16 experts of 48, rotating */
                for (size_t i = 0; i < nm; i++) sel[i] = m[e0 * 3 + i];
                double t0 = now_s();
                for (int k = 0; k < inner; k++) mx_call(&MX[v], sel, nm, x, xd, y);
                t[v * reps + r] = (now_s() - t0) / inner;
            }
        printf("mxfp4 %zu experts of %zu%s, %d thread(s), %d alternated calls: GFLOP/s best / median\n", per, ne,
               l2 ? " (64 rows each, L2)" : "", th, reps);
        for (size_t v = 0; v < NMX; v++) {
            qsort(t + v * reps, (size_t)reps, sizeof *t, cmpd);
            printf("  %-22s %6.1f / %6.1f\n", MX[v].name, flop / 1e9 / t[v * reps], flop / 1e9 / t[v * reps + reps / 2]);
        }
    }
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "bf16";
    int reps = argc > 2 ? atoi(argv[2]) : 15;
    if (!strcmp(what, "bf16")) bench_bf16(reps, 0);
    else if (!strcmp(what, "bf16l2")) bench_bf16(reps, 1);
    else if (!strcmp(what, "mx")) bench_mx(reps, 0);
    else if (!strcmp(what, "mxl2")) bench_mx(reps, 1);
    return 0;
}
