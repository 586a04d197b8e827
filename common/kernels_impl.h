/* kernels_impl.h - internal glue between kernels.c and the per-ISA kernel files
 * (kernels_avx2.c, kernels_avx512.c): their dot functions and the helpers every
 * path shares so that they perform exactly the same operations (kernels.h contract).
 * Not part of the public API. */
#ifndef K3_KERNELS_IMPL_H
#define K3_KERNELS_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/kernels.h"

/* Row-block kernels: out[j] = the dot of row j (j < K3_ROWBLOCK) with x, the rows
 * being consecutive in memory (row j at w + j*n; for MXFP4 at packed + j*n/2 and
 * scales + j*n/32). Each out[j] has exactly the bits of the level's single-row dot:
 * the rows are only interleaved so that their independent accumulation chains
 * overlap and the conversion of x is shared. The drivers use them for full blocks.
 * The _x2 variants take 2 tokens (x and x + n) and write out[t*K3_ROWBLOCK + j]:
 * each weight vector is decoded once for both tokens. */
#define K3_ROWBLOCK 8
typedef void (*k3_rows_f32_fn)(const float *w, const float *x, size_t n, float *out);
typedef void (*k3_rows_bf16_fn)(const uint16_t *w, const float *x, size_t n, float *out);
typedef void (*k3_rows_mxfp4_fn)(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n, float *out);

#if defined(__x86_64__) || defined(__i386__)
#define K3_HAVE_X86_KERNELS 1
float k3_dot_f32_avx2(const float *w, const float *x, size_t n);
float k3_dot_bf16_avx2(const uint16_t *w, const float *x, size_t n);
float k3_dot_mxfp4_avx2(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n);
void k3_rows_mxfp4_avx2(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n, float *out);
void k3_rows_f32_avx2(const float *w, const float *x, size_t n, float *out);
void k3_rows_bf16_avx2(const uint16_t *w, const float *x, size_t n, float *out);
float k3_dot_f32_avx512(const float *w, const float *x, size_t n);
float k3_dot_bf16_avx512(const uint16_t *w, const float *x, size_t n);
float k3_dot_mxfp4_avx512(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n);
void k3_rows_f32_avx512(const float *w, const float *x, size_t n, float *out);
void k3_rows_bf16_avx512(const uint16_t *w, const float *x, size_t n, float *out);
void k3_rows_mxfp4_avx512(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n, float *out);
/* x given in double (xd[i] == (double)x[i]): the bits of k3_rows_mxfp4_avx512 */
typedef void (*k3_rows_mxfp4_xd_fn)(const uint8_t *packed, const uint8_t *scales, const double *xd, size_t n, float *out);
void k3_rows_mxfp4_xd_avx512(const uint8_t *packed, const uint8_t *scales, const double *xd, size_t n, float *out);
/* the same bits with a one-source lookup (vpermw of the doubles' top words); chosen on AMD Zen 4 */
void k3_rows_mxfp4_xdw_avx512(const uint8_t *packed, const uint8_t *scales, const double *xd, size_t n, float *out);
/* the same bits from the lane layout of the codes (k3_mxfp4_to_lanes; n % K3_MXFP4_LANE_COLS == 0):
 * one plain load per row and 128 columns instead of four broadcasts per 32; the drivers run it on
 * lane-layout weights (mxfp4_weight.lanes: the expert cache repacks resident experts when
 * matmul_mxfp4_lanes_wanted) */
void k3_rows_mxfp4_xdl_avx512(const uint8_t *lanes, const uint8_t *scales, const double *xd, size_t n, float *out);
void k3_rows_bf16_x2_avx512(const uint16_t *w, const float *x, size_t n, float *out);
/* x given in double and scaled: xs[i] == (double)x[i] * 2^896 (K3_BF16_XS_SCALE; exact, finite
 * for every finite float): the bits of k3_rows_bf16_avx512 for finite weights (the only ones a
 * model loads: check_finite) */
#define K3_BF16_XS_SCALE 0x1p896
typedef void (*k3_rows_bf16_xs_fn)(const uint16_t *w, const double *xs, size_t n, float *out);
void k3_rows_bf16_xs_avx512(const uint16_t *w, const double *xs, size_t n, float *out);
/* the same for K3_XS_ROWS (16) consecutive rows: out[0..15] */
#define K3_XS_ROWS 16
void k3_rows_bf16_xs16_avx512(const uint16_t *w, const double *xs, size_t n, float *out);
/* the same bits, the bytes of each double built by vpermi2b (needs AVX512-VBMI: k3_cpu_has_vbmi);
 * chosen on AMD Zen 4 (kernels.c choice_pick) */
void k3_rows_bf16_xsb16_avx512(const uint16_t *w, const double *xs, size_t n, float *out);
/* the same bits, prefetching next_bytes at next (the job the thread computes after this one;
 * NULL: none) into L2 meanwhile; chosen with xsb16 (kernels.c) */
typedef void (*k3_rows_bf16_xsn_fn)(const uint16_t *w, const double *xs, size_t n, float *out, const void *next,
                                    size_t next_bytes);
void k3_rows_bf16_xsb16n_avx512(const uint16_t *w, const double *xs, size_t n, float *out, const void *next,
                                size_t next_bytes);
int k3_cpu_has_vbmi(void);
void k3_rows_mxfp4_x2_avx512(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n, float *out);

/* Multi-token kernels (kernels_gemm_avx2.c, AVX2 + FMA): y[t*rows + r0 + r] for
 * r < nr <= K3_GEMM_NR and t < ntok, each the bits of the single-row dot. Used by
 * the drivers for ntok >= K3_GEMM_MIN_TOK at the AVX2 level (the _avx512 ones at
 * the AVX-512 level). */
#ifndef K3_GEMM_NR
#define K3_GEMM_NR 24
#endif
#define K3_GEMM_MIN_TOK 4
void k3_gemm_f32_avx2(const float *w, size_t rows, size_t cols, size_t r0, size_t nr, const float *x, size_t ntok,
                      float *y);
void k3_gemm_bf16_avx2(const uint16_t *w, size_t rows, size_t cols, size_t r0, size_t nr, const float *x,
                       size_t ntok, float *y);
void k3_gemm_mxfp4_avx2(const uint8_t *packed, const uint8_t *scales, size_t rows, size_t cols, size_t r0, size_t nr,
                        const float *x, size_t ntok, float *y);
/* The same for the AVX-512 level (kernels_gemm_avx512.c: the 8 lanes in one register),
 * for nr <= K3_GEMM_NR_AVX512 rows a call, in a workspace ws of k3_gemm_ws_doubles_avx512()
 * doubles, 64-byte aligned, that the call owns (kernels.c keeps one per thread). */
#ifndef K3_GEMM_NR_AVX512
#define K3_GEMM_NR_AVX512 96
#endif
size_t k3_gemm_ws_doubles_avx512(void);
/* How the weights reach the micro-kernels (the same bits either way, test_kernels checks both):
 * K3_GEMM_WIDEN: bf16 / f32 rows read from W and widened to double in the micro-kernel, MXFP4
 * decoded once per token block into f32 and widened there (chosen on Zen 4, whose 32 KiB L1 does
 * not hold a double sub-tile beside the activations, and on Zen 5, where it measured even with the
 * doubles to 1.04x faster in the engine's prefill, docs/PERFORMANCE.md "Thirteenth session"); K3_GEMM_DOUBLE:
 * every sub-tile decoded once per token block into doubles, so the micro-kernel's only vector ops
 * are loads and FMAs (chosen elsewhere: on the Intel Xeon VM 1.25x the bf16 gemm, 1.1x the MXFP4
 * one; docs/PERFORMANCE.md "Twelfth session"). */
typedef enum { K3_GEMM_WIDEN = 0, K3_GEMM_DOUBLE = 1 } k3_gemm_weights;
void k3_gemm_f32_avx512(const float *w, size_t rows, size_t cols, size_t r0, size_t nr, const float *x, size_t ntok,
                        float *y, double *ws, k3_gemm_weights how);
void k3_gemm_bf16_avx512(const uint16_t *w, size_t rows, size_t cols, size_t r0, size_t nr, const float *x,
                         size_t ntok, float *y, double *ws, k3_gemm_weights how);
void k3_gemm_mxfp4_avx512(const uint8_t *packed, const uint8_t *scales, size_t rows, size_t cols, size_t r0,
                          size_t nr, const float *x, size_t ntok, float *y, double *ws, k3_gemm_weights how);
/* the same bits from the lane layout (cols % K3_MXFP4_LANE_COLS == 0) */
void k3_gemm_mxfp4l_avx512(const uint8_t *lanes, const uint8_t *scales, size_t rows, size_t cols, size_t r0,
                           size_t nr, const float *x, size_t ntok, float *y, double *ws, k3_gemm_weights how);
/* n64 groups of 64 release-layout bytes (128 codes of one row) rewritten in place into the lane
 * layout (AVX512-VBMI: k3_cpu_has_vbmi) */
void k3_mxfp4_to_lanes_vbmi(uint8_t *p, size_t n64);
#endif

/* The lane layout of MXFP4 codes (kernels.c; k3_rows_mxfp4_xdl_avx512 reads it): per row and
 * K3_MXFP4_LANE_COLS (128) columns, 64 bytes, 64-bit word l holds the codes of columns 8j + l
 * (j = 0..15), code j at bits 4j..4j+3: lane l of the contract's 8 lanes gets all its codes of 4
 * blocks from one word. The scales are unchanged. cols % 128 == 0; src and dst do not overlap.
 * k3_mxfp4_from_lanes is the inverse. */
#define K3_MXFP4_LANE_COLS 128
void k3_mxfp4_to_lanes(const uint8_t *src, uint8_t *dst, size_t rows, size_t cols);
void k3_mxfp4_from_lanes(const uint8_t *src, uint8_t *dst, size_t rows, size_t cols);

/* 2^(s-127) as a double, exact for every byte s (s = 0 gives 2^-127, a normal double). */
static inline double k3_mxfp4_scale(uint8_t s) {
    uint64_t u = (uint64_t)(s + 896u) << 52; /* biased exponent (s - 127) + 1023 */
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* The contract's fixed lane reduction, then one rounding to float. */
static inline float k3_reduce8(const double l[8]) {
    double a = (l[0] + l[1]) + (l[2] + l[3]);
    double b = (l[4] + l[5]) + (l[6] + l[7]);
    return (float)(a + b);
}

#endif
