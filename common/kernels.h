/* kernels.h - the exact compute kernels of k3 (matrix-vector / small matrix-matrix).
 *
 * Contract (docs/MODEL.md section 3):
 *  - Every dot product y = sum_i w_i * x_i uses ONE fixed partition, whatever the
 *    SIMD level, thread count or number of tokens:
 *      each product p_i = (double)w_i * (double)x_i is computed in double (exact:
 *      a float/bf16/E2M1*2^k weight times a float has at most 48 significant bits);
 *      element i is added to lane (i % 8) of 8 double accumulators, sequentially in i;
 *      a tail (n % 8 != 0) adds +0.0 to the lanes that have no element;
 *      lanes are reduced as ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)); the result is
 *      rounded to float once.
 *    For MXFP4 the weight is E2M1[code] * 2^(scale-127), formed exactly in double.
 *  - Scalar, AVX2 and AVX-512 paths perform exactly these operations: bit-identical.
 *  - Multi-token calls compute each (row, token) dot with the same partition, so a
 *    batch of T tokens gives the bits of T single-token calls.
 *  - Threads (OpenMP) split rows only, never a single dot product.
 *  - MXFP4 scale byte 255 (NaN in OCP) is refused when a checkpoint is validated
 *    (mxfp4_check_scales); the kernels themselves never see it.
 *  - No abort: an MXFP4 weight needs cols % 32 == 0 and a dense one a known dtype, both refused
 *    at load (config_parse, the checkpoint / expert-store shape checks); a weight that still
 *    breaks them makes the matmul write NaN (and say so on stderr), which the sampler refuses.
 */
#ifndef K3_KERNELS_H
#define K3_KERNELS_H

#include <stddef.h>
#include <stdint.h>

typedef enum { SIMD_AUTO = 0, SIMD_SCALAR, SIMD_AVX2, SIMD_AVX512 } simd_level;

typedef enum { DTYPE_F32 = 0, DTYPE_BF16 } dense_dtype;

/* A dense row-major weight W[rows][cols] (PyTorch nn.Linear layout), F32 or BF16. */
typedef struct {
    dense_dtype dtype;
    size_t rows, cols;
    const void *data;
    int unit, slot;   /* trunk matrices: place in the trunk walk (unit, index in it), set once at
                       * trunk creation; layer code asks the trunk pass for a weight by this place */
} dense_weight;

/* A packed MXFP4 weight: logical [rows][cols], cols % 32 == 0.
 * packed: rows x cols/2 bytes; scales: rows x cols/32. lanes 0: the release layout (low nibble
 * = even element); lanes 1: the same codes in the lane layout (mxfp4_repack_lanes; cols % 128
 * == 0), which the Zen 4 one-token kernel reads with one load per row and 128 columns. Every
 * consumer takes either layout with the same bits; a lane weight with cols % 128 != 0 is
 * refused (NaN output, as for cols % 32). */
typedef struct {
    size_t rows, cols;
    const uint8_t *packed;
    const uint8_t *scales;
    int lanes;
} mxfp4_weight;

/* The row-dot functions of one SIMD level. Obtained with kernels_get(); no globals. */
typedef struct {
    simd_level level;
    const char *name; /* "scalar", "avx2", "avx512" */
    float (*dot_f32)(const float *w, const float *x, size_t n);
    float (*dot_bf16)(const uint16_t *w, const float *x, size_t n);
    float (*dot_mxfp4)(const uint8_t *packed, const uint8_t *scales, const float *x, size_t n);
} kernels;

/* Best level the CPU supports (SIMD_AUTO), or the one asked for.
 * Returns NULL if the asked level is not supported by this CPU or build. */
const kernels *kernels_get(simd_level want);
/* Parses "auto|scalar|avx2|avx512"; returns -1 on anything else. */
int simd_level_parse(const char *s, simd_level *out);

/* y[t*W.rows + r] = W[r] . x[t*W.cols ...] for t < ntok. OpenMP over rows, in blocks
 * (K3_ROWBLOCK rows for one to three tokens, K3_GEMM_NR-row tiles from four; 96-row
 * panels at the AVX-512 level), with
 * schedule(runtime): the caller picks with omp_set_schedule. Static gives every thread
 * one contiguous share (a NUMA placement puts each share's rows on its node); dynamic
 * lets a running thread take the blocks of one the host has descheduled (a shared
 * machine); the MXFP4 drivers run a dynamic schedule as guided with the same chunk (long runs
 * of consecutive row blocks first, which the one-token kernels prefetch). Which thread
 * computes a row never changes its bits. */
void matmul_dense(const kernels *k, const dense_weight *W, const float *x, size_t ntok, float *y);
void matmul_mxfp4(const kernels *k, const mxfp4_weight *W, const float *x, size_t ntok, float *y);
/* n (<= K3_MATMUL_MANY_MAX) dense matmuls of ntok tokens in ONE parallel region, one
 * barrier: y[i] = W[i] x[i]; each y[i] has exactly the bits matmul_dense gives it. */
#define K3_MATMUL_MANY_MAX 8
void matmul_dense_many(const kernels *k, const dense_weight *W, const float *const *x, size_t ntok, float *const *y,
                       size_t n);
/* The same for MXFP4 weights (an expert's w1 and w3 on the same input: one region). */
void matmul_mxfp4_many(const kernels *k, const mxfp4_weight *W, const float *const *x, size_t ntok, float *const *y,
                       size_t n);

/* n (any number) MXFP4 matmuls, matrix i on ntok[i] tokens, in ONE parallel region (split
 * into regions of K3_MATMUL_LIST_MAX): y[i] = W[i] x[i]; each y[i] has exactly the bits
 * matmul_mxfp4 gives it. All routed experts of a decode step go through two of these. */
#define K3_MATMUL_LIST_MAX 64
void matmul_mxfp4_list(const kernels *k, const mxfp4_weight *W, const float *const *x, const size_t *ntok,
                       float *const *y, size_t n);
/* A one-token MXFP4 matmul takes x converted to double once per call (where the level has a
 * kernel for it, AVX-512) into a buffer of the calling thread, grown when a call needs more
 * (each distinct x of a call once, cols doubles each) and kept for the thread's life. This
 * reserves n doubles up front so that decode never allocates; 0, or -1 without memory (the
 * kernels then convert x per row block: the same bits). A lane-layout MXFP4 matrix
 * (mxfp4_weight.lanes) of two or three tokens takes cols doubles per token: a batched step may grow
 * the buffer once beyond this reserve. */
int matmul_reserve_x(size_t n);
/* The AVX-512 multi-token kernels work in a per-thread workspace of matmul_gemm_ws_bytes()
 * (600 KiB; 0 where there are none), allocated on a thread's first need and kept for its life.
 * matmul_reserve_gemm allocates it in every thread of a team of nthreads (engine start), so that
 * no pass allocates; 0, or -1 without memory (a thread without one computes its panels by row
 * blocks: the same bits). */
size_t matmul_gemm_ws_bytes(void);
int matmul_reserve_gemm(const kernels *k, int nthreads);

/* Whether this level's kernels run a one-token MXFP4 matmul of this width faster from the lane
 * layout: cols % 128 == 0 and the AVX-512 level where it chose the one-source lookup (Zen 4)
 * and has AVX512-VBMI. K3_MXFP4_LANES=0 says never, =1 always (any level: measurements and
 * tests). Only speed depends on it: matmul_mxfp4 gives either layout the same bits everywhere. */
int matmul_mxfp4_lanes_wanted(const kernels *k, size_t cols);
/* What the drivers chose for this CPU at this level, for reports (--json kernel_choice): e.g.
 * "bf16=shift mxfp4=pd lanes=0 gemm=double" at AVX-512 (one-token bf16 kernel shift|bytes, MXFP4
 * lookup pd|words, the lane layout for resident experts, the gemm's weights widen|double),
 * "none" at the other levels (no choice by CPU there). Writes at most n bytes with the NUL; returns buf. */
const char *kernels_choice_text(const kernels *k, char *buf, size_t n);
/* Rewrites rows x cols/2 release-layout codes in place into the lane layout (cols % 128 == 0;
 * the scales are unchanged): with vpermi2b where the CPU has AVX512-VBMI, else scalar. */
void mxfp4_repack_lanes(uint8_t *packed, size_t rows, size_t cols);

/* 0 if no scale byte of the weight is 255, else -1 and *bad_row set. */
int mxfp4_check_scales(const mxfp4_weight *W, size_t *bad_row);

/* E2M1 code (0..15) -> value. */
extern const float E2M1_VALUES[16];

static inline float bf16_to_f32(uint16_t b) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)b << 16;
    return v.f;
}

#endif
