/* kernels_gemm_avx512.c - multi-token ("prefill") kernels of the exact contract
 * (kernels.h) for the AVX-512 level: y[t][r] = W[r] . x[t] for a panel of up to
 * K3_GEMM_NR_AVX512 rows and all ntok tokens, register-blocked over rows and tokens.
 *
 * The same scheme as kernels_gemm_avx2.c (read its header for why the bits are those
 * of one token at a time), with the contract's 8 double lanes of a (row, token) pair
 * in ONE 512-bit register: lane l accumulates the products of the elements i with
 * i % 8 == l, sequentially in i, with FMA (each product is exact in double, so the
 * FMA rounds once exactly as acc + w*x does); a partial last column block is padded
 * with w = 0, x = 0 (the padded lanes add +0.0, as the contract's tail does); the
 * accumulators are reduced with k3_reduce8 at the end.
 *
 * Blocking: one call is a panel of up to K3_GEMM_NR_AVX512 (96) rows x all tokens
 * (dense and MXFP4 alike), in token blocks of at most TB (72) tokens (a call's blocks
 * balanced: 100 tokens are 50 + 50, not 72 + 28). Per token block and column block of
 * KC (256) columns, the block's activations are converted once into double (xd, for all
 * the panel's rows: 1/96 of a conversion per multiply-add; 6 tokens at a time, each
 * group just before the first sub-tile's micro-kernels use it); then per sub-tile of NS
 * (12) rows the 4-row x 6-token micro-kernel keeps 24 FMA chains in registers (24 FMAs
 * per 10 loads: each activation is loaded into a register once, not folded into the 4
 * FMAs) token group by token group, over the KC / 8 = 32 steps of the column block. The
 * weights reach it in one of these forms, by the caller's k3_gemm_weights (kernels_impl.h):
 * K3_GEMM_DOUBLE (every CPU but Zen 4 and Zen 5) always the last one, decoded doubles; K3_GEMM_WIDEN
 * (Zen 4, 2026-12-02, "Prefill, eighth session" in docs/PERFORMANCE.md; Zen 5 since the thirteenth
 * session) the first that applies:
 *  - bf16 (and f32) with no padding in the column block: read from W itself by the
 *    micro-kernel, each step's 8 weights of a row widened there (vpmovzxwd, shift,
 *    vcvtps2pd: exact); the sub-tile's raw rows (6 KiB) and the group's xd slice (12 KiB)
 *    stay in L1 together. Before, each sub-tile was decoded into doubles (wd, 24 KiB:
 *    with the slice over this Zen 4's 32 KiB L1) once per token block: 20 % of the
 *    gemm's samples, its stores and loads not overlapping the FMAs;
 *  - MXFP4: the sub-tile decoded once per token block into f32 (12 KiB; vpermd/vpsrlvd
 *    give each 32-bit lane its code, vpermps looks it up in the block's 16-entry table
 *    E2M1 x 2^(s-127) made by one vscalefps), exact for scale bytes <= 252 (with no
 *    FTZ/DAZ: s = 0 gives f32 subnormals), widened to double in the micro-kernel;
 *  - MXFP4 in the lane layout (mxfp4_weight.lanes, k3_gemm_mxfp4l_avx512): the same two
 *    decodes, each 128 columns of a row one 64-byte load (f32: two vpermd, then vpsrlvd +
 *    vpermps per 16; double: vpsrlvq + vpermi2pd per 8);
 *  - otherwise (a partial last column block of a dense row, cols % 8 != 0; an MXFP4
 *    sub-tile with a block scale above 252): decoded into doubles (wd: bf16 shift, f32
 *    widening, MXFP4 by the double table and vpermi2pd) as before. With a 48 KiB L1 (the
 *    Intel Xeon VM) the 24 KiB double sub-tile and the 12 KiB activation slice stay in L1
 *    together and the micro-kernel issues only loads and FMAs: widening in the micro-kernel
 *    costs each 8 weights of a row 3-4 shuffle/convert ops on the FMA ports per 6 tokens,
 *    decoding a sub-tile once costs them once per token block (twelfth session, bench_kernels
 *    --gemm, 1 thread: bf16 gemm 48-50 -> 57-64 % of the FMA peak, MXFP4 52-61 -> 55-68 %).
 * The panel's accumulators (NP x TB x 8 doubles, 432 KiB of the caller's workspace) live
 * in L2 between column blocks. Why these sizes (bench_kernels --gemm and a stand-alone
 * sweep, 1 thread, 2026-12-01): with everything in L1 the micro-kernel runs at the FMA
 * peak; in the kernel the accumulators' read-modify-write from L2 (128 bytes per KC / 8
 * multiply-adds of a chain) was the limit at KC 128, and each block's weight decode (per
 * TB tokens) and activation conversion (per panel) cost 20-25 % of the time; KC 256
 * halves the former, TB 72 takes a 64-token chunk in one block. Every token block uses
 * KC 256 (until 2026-12-02 a block of fewer than 32 tokens used 128 columns so that its
 * double wd and xd fitted L1: with the 6-12 KiB sub-tiles 256 is faster there too). Each
 * row's and token's next column block is prefetched while the current one is converted
 * (bf16 / f32 rows: when the sub-tile starts).
 * Compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx2 -mfma; the caller
 * checks the CPU. */
#include "common/kernels_impl.h"

#ifdef K3_HAVE_X86_KERNELS
#include <immintrin.h>

#define MR 4  /* rows per micro-kernel */
#define MT 6  /* tokens per micro-kernel */
#define NP K3_GEMM_NR_AVX512 /* rows per call (panel): the activations are decoded once for them */
#ifndef NS
#define NS 12 /* rows per weight sub-tile (decoded together, L1-resident; a multiple of 3, 4 and 6) */
#endif
#ifndef TB
#define TB 72 /* tokens per token block at most (multiple of MT): each weight is decoded once for them */
#endif
#ifndef KC
#define KC 256 /* columns per column block (multiple of 32: whole MXFP4 blocks) */
#endif

#if NP % NS != 0 || NS % 12 != 0 || TB % MT != 0 || KC % 32 != 0
#error "bad gemm blocking"
#endif

/* A call's workspace (the caller's, 64-byte aligned; k3_gemm_ws_doubles_avx512): the panel's
 * accumulators (NP x TB x 8), the token block's activations (TB x KC) and a sub-tile's weights
 * (NS x KC doubles, or f32 in the first half), all in double: 600 KiB, which lived on the stack
 * before 2026-12-01 */
#define WS_ACC ((size_t)NP * TB * 8)
#define WS_XD ((size_t)TB * KC)
#define WS_WD ((size_t)NS * KC)
size_t k3_gemm_ws_doubles_avx512(void) { return WS_ACC + WS_XD + WS_WD; }

typedef enum { W_F32, W_BF16, W_MXFP4, W_MXFP4L /* MXFP4 codes in the lane layout */ } wkind;

static inline __m256 bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* acc[r][t][0..7] += w[r][..] . xd[t][..] over nk8 chunks of 8 columns, for R rows
 * and T tokens (acc rows TB tokens apart); R x T chains + R weights + 1 activation
 * must fit the 32 registers (the shapes used: 4x6, 3x7, 3x8, 6x3, 6x4, 4x5, 8x2, 8x1,
 * and up to 4x6 for a sub-tile's partial row group). The weights w, rows ldw elements
 * apart: RAW 0 doubles (the decoded wd, ldw = kc), 1 bf16 (W itself, ldw = cols), 2 f32
 * (W itself, or a decoded MXFP4 sub-tile with ldw = kc), widened to double exactly here. */
static inline __attribute__((always_inline)) void micro(const int RAW, const int R, const int T, const size_t kc,
                                                        const void *wp, const size_t ldw, const double *xd, size_t nk8,
                                                        double *acc) {
    const double *wd = (const double *)wp;
    const uint16_t *wb = (const uint16_t *)wp;
    const float *wf = (const float *)wp;
    __m512d a[8][8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) a[r][t] = _mm512_load_pd(acc + ((size_t)r * TB + (size_t)t) * 8);
    for (size_t c = 0; c < nk8; c++) {
        __m512d w[8];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            w[r] = RAW == 1   ? _mm512_cvtps_pd(bf16x8(wb + (size_t)r * ldw + c * 8))
                   : RAW == 2 ? _mm512_cvtps_pd(_mm256_loadu_ps(wf + (size_t)r * ldw + c * 8))
                              : _mm512_load_pd(wd + (size_t)r * ldw + c * 8);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m512d xv = _mm512_load_pd(xd + (size_t)t * kc + c * 8);
            /* in a register: otherwise GCC folds the load into each of the R FMAs (3x8: 27
             * loads per 24 FMAs, load-bound; measured 10-30 % slower on that shape) */
            __asm__("" : "+v"(xv));
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) a[r][t] = _mm512_fmadd_pd(w[r], xv, a[r][t]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) _mm512_store_pd(acc + ((size_t)r * TB + (size_t)t) * 8, a[r][t]);
}

/* any R <= MR rows x T <= MT tokens: wd/xd/acc already offset */
#define K3_MICRO_T(R)                                                                                       \
    switch (T) {                                                                                            \
    case 6: micro(RAW, R, 6, kc, wp, ldw, xd, nk8, acc); break;                                                           \
    case 5: micro(RAW, R, 5, kc, wp, ldw, xd, nk8, acc); break;                                                           \
    case 4: micro(RAW, R, 4, kc, wp, ldw, xd, nk8, acc); break;                                                           \
    case 3: micro(RAW, R, 3, kc, wp, ldw, xd, nk8, acc); break;                                                           \
    case 2: micro(RAW, R, 2, kc, wp, ldw, xd, nk8, acc); break;                                                           \
    default: micro(RAW, R, 1, kc, wp, ldw, xd, nk8, acc); break;                                                          \
    }
static inline __attribute__((always_inline)) void micro_any(const int RAW, int R, int T, size_t kc, const void *wp,
                                                            size_t ldw, const double *xd, size_t nk8, double *acc) {
    switch (R) {
    case 4: K3_MICRO_T(4) break;
    case 3: K3_MICRO_T(3) break;
    case 2: K3_MICRO_T(2) break;
    default: K3_MICRO_T(1) break;
    }
}
#undef K3_MICRO_T

/* One token group (T tokens) against the ns rows of a weight sub-tile: R-row
 * micro-kernels, the rows left (ns % R: a panel's last sub-tile, or 4 of 12 rows for
 * the 8-row shape) in pieces of at most MR rows x MT tokens. */
static inline __attribute__((always_inline)) void token_group(const int RAW, const int R, const int T, const size_t kc,
                                                              size_t ns, const void *wp, size_t ldw, const double *xd,
                                                              size_t nk8, double *acc) {
    const size_t esz = RAW == 1 ? 2 : RAW == 2 ? 4 : 8;
    size_t r = 0;
    for (; r + (size_t)R <= ns; r += (size_t)R)
        micro(RAW, R, T, kc, (const char *)wp + r * ldw * esz, ldw, xd, nk8, acc + r * TB * 8);
    for (; r < ns; r += MR) {
        const int rr = ns - r < MR ? (int)(ns - r) : MR;
        for (int t = 0; t < T; t += MT)
            micro_any(RAW, rr, T - t < MT ? T - t : MT, kc, (const char *)wp + r * ldw * esz, ldw, xd + (size_t)t * kc,
                      nk8, acc + (r * TB + (size_t)t) * 8);
    }
}

/* Where a token block's activations come from when token_groups converts them itself
 * (the first sub-tile of a column block): x of the block's first token, the row length,
 * the column block (k0, kn, kn8) and whether the next one exists (prefetch). */
typedef struct {
    const float *x;
    size_t cols, k0, kn, kn8;
    int pf;
} x_source;
static void pack_x(const float *x, size_t cols, size_t nt, size_t k0, size_t kn, size_t kn8, int pf, size_t kc,
                   double *xd);

/* The nt tokens of a block against a sub-tile: groups of 6 tokens (4 rows each: 24
 * chains); the last 1-5 tokens in a shape that still keeps 16-24 chains: 7 or 8
 * tokens (the last 6 and 1-2 more) at 3 rows, 3-4 at 6 rows, 5 at 4, 1-2 (a block of
 * fewer than 6) at 8 rows. With xs, each group's slice of xd is converted just before
 * the group's first micro-kernel (it is then in L1 for them, and the conversion's
 * stores overlap the FMAs around it instead of running as a pass of their own). */
static inline __attribute__((always_inline)) void token_groups_kc(const int RAW, const size_t kc, size_t nt, size_t ns,
                                                                  const void *wd, size_t ldw, double *xd, size_t nk8,
                                                                  double *acc, const x_source *xs) {
    const size_t q = nt / MT, rem = nt % MT;
    const size_t nfull = (rem == 1 || rem == 2) && q > 0 ? q - 1 : q;
    size_t t = 0;
    for (size_t g = 0; g < nfull; g++, t += MT) {
        if (xs) pack_x(xs->x + t * xs->cols, xs->cols, MT, xs->k0, xs->kn, xs->kn8, xs->pf, kc, xd + t * kc);
        token_group(RAW, MR, MT, kc, ns, wd, ldw, xd + t * kc, nk8, acc + t * 8);
    }
    if (xs && nt > t) pack_x(xs->x + t * xs->cols, xs->cols, nt - t, xs->k0, xs->kn, xs->kn8, xs->pf, kc, xd + t * kc);
    xd += t * kc;
    acc += t * 8;
    switch (nt - t) {
    case 0: break;
    case 8: token_group(RAW, 3, 8, kc, ns, wd, ldw, xd, nk8, acc); break;
    case 7: token_group(RAW, 3, 7, kc, ns, wd, ldw, xd, nk8, acc); break;
    case 5: token_group(RAW, 4, 5, kc, ns, wd, ldw, xd, nk8, acc); break;
    case 4: token_group(RAW, 6, 4, kc, ns, wd, ldw, xd, nk8, acc); break;
    case 3: token_group(RAW, 6, 3, kc, ns, wd, ldw, xd, nk8, acc); break;
    case 2: token_group(RAW, 8, 2, kc, ns, wd, ldw, xd, nk8, acc); break;
    default: token_group(RAW, 8, 1, kc, ns, wd, ldw, xd, nk8, acc); break;
    }
}

/* the weights in the micro-kernels: decoded doubles (wd, rows KC apart), f32 (a decoded MXFP4
 * sub-tile, rows KC apart; or W itself, rows cols apart), or bf16 read from W itself */
static void token_groups_f64(size_t nt, size_t ns, const double *wd, double *xd, size_t nk8, double *acc,
                             const x_source *xs) {
    token_groups_kc(0, KC, nt, ns, wd, KC, xd, nk8, acc, xs);
}
static void token_groups_f32(size_t nt, size_t ns, const float *wf, size_t ldw, double *xd, size_t nk8, double *acc,
                             const x_source *xs) {
    token_groups_kc(2, KC, nt, ns, wf, ldw, xd, nk8, acc, xs);
}
static void token_groups_bf16(size_t nt, size_t ns, const uint16_t *wb, size_t ldw, double *xd, size_t nk8,
                              double *acc, const x_source *xs) {
    token_groups_kc(1, KC, nt, ns, wb, ldw, xd, nk8, acc, xs);
}

#ifndef PF_HINT
#define PF_HINT _MM_HINT_T0
#endif
/* prefetch bytes [p, p + n) (n a multiple of 64) */
static inline __attribute__((always_inline)) void prefetch_span(const void *p, size_t n) {
    for (size_t o = 0; o < n; o += 64) _mm_prefetch((const char *)p + o, PF_HINT);
}

/* xd[t][0..kc) = x[t][k0 .. k0+kn) in double, zero beyond kn (kn8 = kn rounded up to 8);
 * prefetches each token's next column block (pf: the block exists) */
static void pack_x(const float *x, size_t cols, size_t nt, size_t k0, size_t kn, size_t kn8, int pf, size_t kc,
                   double *xd) {
    for (size_t t = 0; t < nt; t++) {
        const float *xs = x + t * cols + k0;
        double *d = xd + t * kc;
        if (pf) prefetch_span(xs + kc, kc * sizeof(float));
        size_t k = 0;
        for (; k + 8 <= kn; k += 8) _mm512_store_pd(d + k, _mm512_cvtps_pd(_mm256_loadu_ps(xs + k)));
        for (; k < kn; k++) d[k] = (double)xs[k];
        for (; k < kn8; k++) d[k] = 0.0;
    }
}

/* wd[r][0..kc) = row r0 + r of W, columns k0 .. k0+kn, as exact doubles; zero beyond kn.
 * MXFP4: a block's 16-entry table E2M1 x 2^(s-127) (exact in double) indexed by the codes
 * with vpermi2pd, which reads bits 0..3 of each 64-bit lane (the 64-bit word of packed
 * bytes holds element k in bits 4k..4k+3: broadcast, shift lane k right by 4k or 4k-32).
 * Prefetches each row's next column block (pf: the block exists). */
static inline __attribute__((always_inline)) void pack_w(wkind kind, const void *w, const uint8_t *scales,
                                                         size_t cols, size_t r0, size_t nr, size_t k0, size_t kn,
                                                         size_t kn8, int pf, size_t kc, double *wd) {
    const __m512i sh_lo = _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28);
    const __m512i sh_hi = _mm512_setr_epi64(32, 36, 40, 44, 48, 52, 56, 60);
    const __m512d pos = _mm512_setr_pd(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
    const __m512d neg = _mm512_setr_pd(-0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0);
    for (size_t r = 0; r < nr; r++) {
        double *d = wd + r * kc;
        size_t k = 0;
        if (kind == W_F32) {
            const float *ws = (const float *)w + (r0 + r) * cols + k0;
            if (pf) prefetch_span(ws + kc, kc * 4);
            for (; k + 8 <= kn; k += 8) _mm512_store_pd(d + k, _mm512_cvtps_pd(_mm256_loadu_ps(ws + k)));
            for (; k < kn; k++) d[k] = (double)ws[k];
        } else if (kind == W_BF16) {
            const uint16_t *ws = (const uint16_t *)w + (r0 + r) * cols + k0;
            if (pf) prefetch_span(ws + kc, kc * 2);
            for (; k + 8 <= kn; k += 8) _mm512_store_pd(d + k, _mm512_cvtps_pd(bf16x8(ws + k)));
            for (; k < kn; k++) d[k] = (double)bf16_to_f32(ws[k]);
        } else { /* kn % 32 == 0: whole blocks (lane layout: kn, k0 % 128 == 0) */
            const uint8_t *ps = (const uint8_t *)w + (r0 + r) * (cols / 2) + k0 / 2;
            const uint8_t *ss = scales + (r0 + r) * (cols / 32) + k0 / 32;
            if (pf) {
                prefetch_span(ps + kc / 2, kc / 2);
                _mm_prefetch((const char *)ss + kc / 32, PF_HINT);
            }
            /* lane layout: per 128 columns qword l holds the codes of columns 8j + l at bits 4j,
             * so the 8 weights of columns 8j .. 8j + 7 are the 64 bytes shifted right by 4j */
            for (; kind == W_MXFP4L && k < kn; k += 32) {
                const __m512d s = _mm512_set1_pd(k3_mxfp4_scale(ss[k / 32]));
                const __m512d tp = _mm512_mul_pd(pos, s), tn = _mm512_mul_pd(neg, s);
                const __m512i v = _mm512_loadu_si512((const void *)(ps + (k & ~(size_t)127) / 2));
                const long long j0 = (long long)(k % 128) / 8; /* the block's first j */
                for (long long j = 0; j < 4; j++)
                    _mm512_store_pd(d + k + 8 * j, _mm512_permutex2var_pd(tp, _mm512_srlv_epi64(v, _mm512_set1_epi64(4 * (j0 + j))), tn));
            }
            for (; k < kn; k += 32) {
                const __m512d s = _mm512_set1_pd(k3_mxfp4_scale(ss[k / 32]));
                const __m512d tp = _mm512_mul_pd(pos, s), tn = _mm512_mul_pd(neg, s);
                uint64_t q0, q1;
                memcpy(&q0, ps + k / 2, 8);
                memcpy(&q1, ps + k / 2 + 8, 8);
                const __m512i b0 = _mm512_set1_epi64((long long)q0), b1 = _mm512_set1_epi64((long long)q1);
                _mm512_store_pd(d + k, _mm512_permutex2var_pd(tp, _mm512_srlv_epi64(b0, sh_lo), tn));
                _mm512_store_pd(d + k + 8, _mm512_permutex2var_pd(tp, _mm512_srlv_epi64(b0, sh_hi), tn));
                _mm512_store_pd(d + k + 16, _mm512_permutex2var_pd(tp, _mm512_srlv_epi64(b1, sh_lo), tn));
                _mm512_store_pd(d + k + 24, _mm512_permutex2var_pd(tp, _mm512_srlv_epi64(b1, sh_hi), tn));
            }
        }
        for (; k < kn8; k++) d[k] = 0.0;
    }
}

/* wf[r][0..kc) = MXFP4 rows r0 + r of W, columns k0 .. k0+kn (kn % 32 == 0), as f32: exact
 * for every block scale s <= 252 (|E2M1| x 2^(s-127) <= 6 x 2^125; s = 0 gives the f32
 * subnormal 2^-128 and up, exact: nothing here sets FTZ/DAZ). Per 16 codes (8 packed bytes):
 * each 32-bit lane gets its byte word's code by vpermd + vpsrlvd, then vpermps looks it up in
 * the block's 16-entry table (E2M1 x 2^(s-127), converted from the double table exactly).
 * Returns 0 (and wf is not usable) if a block's scale is above 252. */
static inline __attribute__((always_inline)) int pack_w_mxfp4_f32(int lanes, const uint8_t *packed,
                                                                  const uint8_t *scales, size_t cols, size_t r0,
                                                                  size_t nr, size_t k0, size_t kn, int pf, size_t kc,
                                                                  float *wf) {
    const __m512 e2m1 = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f,
                                       -3.0f, -4.0f, -6.0f);
    const __m512i sel = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i shv = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    /* lane layout (kn, k0 % 128 == 0): per 128 columns qword l holds the codes of columns 8j + l
     * at bits 4j; output 16s + i (s < 8) is column 8 (2s + i / 8) + i % 8: dword 2 (i % 8) of the
     * 64 bytes for j < 8 (s < 4), dword 2 (i % 8) + 1 for j >= 8, shifted right by 4 (j % 8). */
    const __m512i lsel = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14);
    const __m512i lsh = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
    int ok = 1;
    for (size_t r = 0; r < nr; r++) {
        float *d = wf + r * kc;
        const uint8_t *ps = packed + (r0 + r) * (cols / 2) + k0 / 2;
        const uint8_t *ss = scales + (r0 + r) * (cols / 32) + k0 / 32;
        if (pf) {
            prefetch_span(ps + kc / 2, kc / 2);
            _mm_prefetch((const char *)ss + kc / 32, PF_HINT);
        }
        for (size_t k = 0; lanes && k < kn; k += 128) {
            const __m512i v = _mm512_loadu_si512((const void *)(ps + k / 2));
            const __m512i c_lo = _mm512_permutexvar_epi32(lsel, v); /* j = 0..7 */
            const __m512i c_hi = _mm512_permutexvar_epi32(_mm512_add_epi32(lsel, _mm512_set1_epi32(1)), v); /* 8..15 */
            for (size_t b = 0; b < 4; b++) {
                const uint8_t sb = ss[(k + 32 * b) / 32];
                ok &= sb <= 252;
                const __m512 tab = _mm512_scalef_ps(e2m1, _mm512_set1_ps((float)((int)sb - 127)));
                for (size_t h = 0; h < 2; h++) {
                    const size_t st = 2 * b + h; /* output step: columns 16 st .. 16 st + 15 */
                    const __m512i cv = st < 4 ? c_lo : c_hi;
                    const __m512i idx = _mm512_srlv_epi32(cv, _mm512_add_epi32(lsh, _mm512_set1_epi32((int)(8 * (st % 4)))));
                    _mm512_store_ps(d + k + 16 * st, _mm512_permutexvar_ps(idx, tab));
                }
            }
        }
        for (size_t k = 0; !lanes && k < kn; k += 32) {
            ok &= ss[k / 32] <= 252;
            const __m512 tab = _mm512_scalef_ps(e2m1, _mm512_set1_ps((float)((int)ss[k / 32] - 127)));
            uint64_t q0, q1;
            memcpy(&q0, ps + k / 2, 8);
            memcpy(&q1, ps + k / 2 + 8, 8);
            const __m512i i0 = _mm512_srlv_epi32(_mm512_permutexvar_epi32(sel, _mm512_castsi128_si512(_mm_cvtsi64_si128((long long)q0))), shv);
            const __m512i i1 = _mm512_srlv_epi32(_mm512_permutexvar_epi32(sel, _mm512_castsi128_si512(_mm_cvtsi64_si128((long long)q1))), shv);
            _mm512_store_ps(d + k, _mm512_permutexvar_ps(i0, tab));
            _mm512_store_ps(d + k + 16, _mm512_permutexvar_ps(i1, tab));
        }
    }
    return ok;
}

/* Rows r0 .. r0+nr (nr <= NP) x all tokens. Per token block (at most TB tokens, the
 * blocks of one call balanced), per column block: the block's activations decoded once
 * (xd, for all nr rows), then per sub-tile of NS rows the micro-kernels run token group
 * by token group; with K3_GEMM_WIDEN on W's own bf16 / f32 rows, on the sub-tile's MXFP4 weights
 * decoded once into f32, or (padding, a scale above 252) decoded once into double (wd); with
 * K3_GEMM_DOUBLE always on wd; xd's 6-token
 * slice and the sub-tile stay in L1, the accumulators of the panel, NP x TB x 8 doubles,
 * in L2 between column blocks. */
static inline __attribute__((always_inline)) void gemm_tile(wkind kind, k3_gemm_weights how, const void *w,
                                                            const uint8_t *scales, size_t rows, size_t cols, size_t r0,
                                                            size_t nr, const float *x, size_t ntok, float *y, double *ws) {
    const int widen = how == K3_GEMM_WIDEN;
    double *const acc = ws, *const xd = acc + WS_ACC, *const wd = xd + WS_XD;
    const size_t nblk = (ntok + TB - 1) / TB;
    const size_t tb = (ntok + nblk - 1) / nblk; /* <= TB; the last block is at most nblk - 1 tokens short */
    for (size_t t0 = 0; t0 < ntok; t0 += tb) {
        const size_t nt = ntok - t0 < tb ? ntok - t0 : tb;
        for (size_t r = 0; r < nr; r++) memset(acc + r * TB * 8, 0, nt * 8 * sizeof *acc); /* the block's tokens only */
        const size_t kc = KC;
        for (size_t k0 = 0; k0 < cols; k0 += kc) {
            const size_t kn = cols - k0 < kc ? cols - k0 : kc, kn8 = (kn + 7) & ~(size_t)7;
            const int pf = k0 + kc < cols;
            const x_source xs = {x + t0 * cols, cols, k0, kn, kn8, pf};
            for (size_t s0 = 0; s0 < nr; s0 += NS) {
                const size_t ns = nr - s0 < NS ? nr - s0 : NS;
                double *const a = acc + s0 * TB * 8;
                const x_source *const xsp = s0 == 0 ? &xs : NULL;
                if (widen && kind != W_MXFP4 && kind != W_MXFP4L && kn == kn8) { /* no padding: the micro-kernels read W's rows */
                    const size_t esz = kind == W_BF16 ? 2 : 4;
                    const char *ws0 = (const char *)w + ((r0 + s0) * cols + k0) * esz;
                    if (pf)
                        for (size_t r = 0; r < ns; r++) prefetch_span(ws0 + (r * cols + kc) * esz, kc * esz);
                    if (kind == W_BF16) token_groups_bf16(nt, ns, (const uint16_t *)ws0, cols, xd, kn8 / 8, a, xsp);
                    else token_groups_f32(nt, ns, (const float *)ws0, cols, xd, kn8 / 8, a, xsp);
                } else if (widen && (kind == W_MXFP4 || kind == W_MXFP4L) &&
                           pack_w_mxfp4_f32(kind == W_MXFP4L, w, scales, cols, r0 + s0, ns, k0, kn, pf, kc, (float *)wd)) {
                    token_groups_f32(nt, ns, (const float *)wd, kc, xd, kn8 / 8, a, xsp);
                } else {
                    pack_w(kind, w, scales, cols, r0 + s0, ns, k0, kn, kn8, pf, kc, wd);
                    token_groups_f64(nt, ns, wd, xd, kn8 / 8, a, xsp);
                }
            }
        }
        for (size_t t = 0; t < nt; t++)
            for (size_t r = 0; r < nr; r++) y[(t0 + t) * rows + r0 + r] = k3_reduce8(acc + (r * TB + t) * 8);
    }
}

void k3_gemm_f32_avx512(const float *w, size_t rows, size_t cols, size_t r0, size_t nr, const float *x, size_t ntok,
                        float *y, double *ws, k3_gemm_weights how) {
    gemm_tile(W_F32, how, w, NULL, rows, cols, r0, nr, x, ntok, y, ws);
}

void k3_gemm_bf16_avx512(const uint16_t *w, size_t rows, size_t cols, size_t r0, size_t nr, const float *x,
                         size_t ntok, float *y, double *ws, k3_gemm_weights how) {
    gemm_tile(W_BF16, how, w, NULL, rows, cols, r0, nr, x, ntok, y, ws);
}

void k3_gemm_mxfp4_avx512(const uint8_t *packed, const uint8_t *scales, size_t rows, size_t cols, size_t r0,
                          size_t nr, const float *x, size_t ntok, float *y, double *ws, k3_gemm_weights how) {
    gemm_tile(W_MXFP4, how, packed, scales, rows, cols, r0, nr, x, ntok, y, ws);
}

void k3_gemm_mxfp4l_avx512(const uint8_t *lanes, const uint8_t *scales, size_t rows, size_t cols, size_t r0,
                           size_t nr, const float *x, size_t ntok, float *y, double *ws, k3_gemm_weights how) {
    gemm_tile(W_MXFP4L, how, lanes, scales, rows, cols, r0, nr, x, ntok, y, ws);
}

#endif
