/* ports.c - which 512-bit operations issue beside one FMA a cycle on this CPU (ninth session,
 * AMD EPYC Zen 4 VM), outside the build:
 *   cc -O2 -mavx512f -mavx512bw -mavx512vbmi -mavx512vbmi2 -mavx512ifma bench/decode_zen4/ports.c -o /tmp/ports
 *   flock /work/bench.lock /tmp/ports
 * Each test is a loop of 8 independent FMAs (zmm0-7, four-cycle latency, so 8 cycles an iteration
 * when one FMA issues a cycle) plus 8 or more independent other operations (destinations
 * zmm16-31, sources never written): cycles an iteration at the clock given below (the FMA-only
 * loop measures it: 8 cycles). Inline assembly, so the compiler cannot merge the chains.
 * Results and what they mean for the exact kernels: docs/PERFORMANCE.md, "Zen 4's ports". */
#include <stdio.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define F "vfmadd231pd %%zmm8,%%zmm9,%%zmm0\n vfmadd231pd %%zmm8,%%zmm9,%%zmm1\n vfmadd231pd %%zmm8,%%zmm9,%%zmm2\n vfmadd231pd %%zmm8,%%zmm9,%%zmm3\n vfmadd231pd %%zmm8,%%zmm9,%%zmm4\n vfmadd231pd %%zmm8,%%zmm9,%%zmm5\n vfmadd231pd %%zmm8,%%zmm9,%%zmm6\n vfmadd231pd %%zmm8,%%zmm9,%%zmm7\n"
#define T(NAME, NF, OPS) static void NAME(void){ long n=20000000; static char buf[4096] __attribute__((aligned(64))); char*p=buf; double t=now(); \
  __asm__ volatile("vxorpd %%zmm0,%%zmm0,%%zmm0\n vxorpd %%zmm1,%%zmm1,%%zmm1\n vxorpd %%zmm2,%%zmm2,%%zmm2\n vxorpd %%zmm3,%%zmm3,%%zmm3\n vxorpd %%zmm4,%%zmm4,%%zmm4\n vxorpd %%zmm5,%%zmm5,%%zmm5\n vxorpd %%zmm6,%%zmm6,%%zmm6\n vxorpd %%zmm7,%%zmm7,%%zmm7\n vxorpd %%zmm8,%%zmm8,%%zmm8\n vxorpd %%zmm9,%%zmm9,%%zmm9\n vpxorq %%zmm10,%%zmm10,%%zmm10\n vpxorq %%zmm11,%%zmm11,%%zmm11\n kxnorq %%k1,%%k1,%%k1\n" \
  "1:\n" NF OPS "dec %0\n jnz 1b\n" : "+r"(n) : "r"(p) : "memory","xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm16","xmm17","xmm18","xmm19","xmm20","xmm21","xmm22","xmm23","xmm24","xmm25","xmm26","xmm27","xmm28","xmm29","xmm30","xmm31","k1","rax","rcx","rdx","rsi","rdi","r8","r9","r10"); \
  t=now()-t; printf("%-40s %.2f cycles/iter (at 3.62 GHz)\n", #NAME, t/20000000*1e9*3.62); }
#define Q8(op) op " %%zmm10,%%zmm11,%%zmm16\n" op " %%zmm10,%%zmm11,%%zmm17\n" op " %%zmm10,%%zmm11,%%zmm18\n" op " %%zmm10,%%zmm11,%%zmm19\n" op " %%zmm10,%%zmm11,%%zmm20\n" op " %%zmm10,%%zmm11,%%zmm21\n" op " %%zmm10,%%zmm11,%%zmm22\n" op " %%zmm10,%%zmm11,%%zmm23\n"
#define QI8(op) op " $3,%%zmm10,%%zmm16\n" op " $3,%%zmm10,%%zmm17\n" op " $3,%%zmm10,%%zmm18\n" op " $3,%%zmm10,%%zmm19\n" op " $3,%%zmm10,%%zmm20\n" op " $3,%%zmm10,%%zmm21\n" op " $3,%%zmm10,%%zmm22\n" op " $3,%%zmm10,%%zmm23\n"
#define QT8(op) op " $0xca,%%zmm10,%%zmm11,%%zmm16\n" op " $0xca,%%zmm10,%%zmm11,%%zmm17\n" op " $0xca,%%zmm10,%%zmm11,%%zmm18\n" op " $0xca,%%zmm10,%%zmm11,%%zmm19\n" op " $0xca,%%zmm10,%%zmm11,%%zmm20\n" op " $0xca,%%zmm10,%%zmm11,%%zmm21\n" op " $0xca,%%zmm10,%%zmm11,%%zmm22\n" op " $0xca,%%zmm10,%%zmm11,%%zmm23\n"
#define S8(op) op " %%zmm10,%%zmm11,%%zmm24\n" op " %%zmm10,%%zmm11,%%zmm25\n" op " %%zmm10,%%zmm11,%%zmm26\n" op " %%zmm10,%%zmm11,%%zmm27\n" op " %%zmm10,%%zmm11,%%zmm28\n" op " %%zmm10,%%zmm11,%%zmm29\n" op " %%zmm10,%%zmm11,%%zmm30\n" op " %%zmm10,%%zmm11,%%zmm31\n"
#define SI8(op) op " $3,%%zmm10,%%zmm24\n" op " $3,%%zmm10,%%zmm25\n" op " $3,%%zmm10,%%zmm26\n" op " $3,%%zmm10,%%zmm27\n" op " $3,%%zmm10,%%zmm28\n" op " $3,%%zmm10,%%zmm29\n" op " $3,%%zmm10,%%zmm30\n" op " $3,%%zmm10,%%zmm31\n"
#define LD "vmovdqu64 (%1),%%zmm16\n vmovdqu64 64(%1),%%zmm17\n"
#define BC "vbroadcasti32x4 (%1),%%zmm16\n vbroadcasti32x4 16(%1),%%zmm17\n vbroadcasti32x4 32(%1),%%zmm18\n vbroadcasti32x4 48(%1),%%zmm19\n vbroadcasti32x4 64(%1),%%zmm20\n vbroadcasti32x4 80(%1),%%zmm21\n vbroadcasti32x4 96(%1),%%zmm22\n vbroadcasti32x4 112(%1),%%zmm23\n"
#define R8(op,a,b) op " %%zmm10,%%zmm11,%%zmm" #a "\n" op " %%zmm10,%%zmm11,%%zmm" #b "\n"
#define RR(op) R8(op,16,17) R8(op,18,19) R8(op,20,21) R8(op,22,23)
#define U8(op,src,d) op " " src ",%%" d "16\n" op " " src ",%%" d "17\n" op " " src ",%%" d "18\n" op " " src ",%%" d "19\n" op " " src ",%%" d "20\n" op " " src ",%%" d "21\n" op " " src ",%%" d "22\n" op " " src ",%%" d "23\n"
#define I8(op,imm) op " $" #imm ",%%zmm10,%%zmm11,%%zmm16\n" op " $" #imm ",%%zmm10,%%zmm11,%%zmm17\n" op " $" #imm ",%%zmm10,%%zmm11,%%zmm18\n" op " $" #imm ",%%zmm10,%%zmm11,%%zmm19\n" op " $" #imm ",%%zmm10,%%zmm11,%%zmm20\n" op " $" #imm ",%%zmm10,%%zmm11,%%zmm21\n" op " $" #imm ",%%zmm10,%%zmm11,%%zmm22\n" op " $" #imm ",%%zmm10,%%zmm11,%%zmm23\n"
T(fma8_only, F, "")
T(ops_only_vpermb, "", Q8("vpermb"))
T(fma8_vpermb8, F, Q8("vpermb"))
T(ops_only_vpermi2b, "", Q8("vpermi2b"))
T(fma8_vpermi2b8, F, Q8("vpermi2b"))
T(ops_only_vpermt2b, "", Q8("vpermt2b"))
T(fma8_vpshufb8, F, Q8("vpshufb"))
T(ops_only_vpshufb, "", Q8("vpshufb"))
T(fma8_vpermw8, F, Q8("vpermw"))
T(fma8_vpermq8, F, Q8("vpermq"))
T(fma8_vpermi2q8, F, Q8("vpermi2q"))
T(fma8_vpermps8, F, Q8("vpermps"))
T(fma8_vpunpcklwd8, F, Q8("vpunpcklwd"))
T(fma8_vpsllq8, F, QI8("vpsllq"))
T(ops_only_vpsllq, "", QI8("vpsllq"))
T(fma8_vpsllw8, F, QI8("vpsllw"))
T(fma8_vpsrlvq8, F, Q8("vpsrlvq"))
T(fma8_vpsllvw8, F, Q8("vpsllvw"))
T(fma8_vprolq8, F, QI8("vprolq"))
T(fma8_vpandq8, F, Q8("vpandq"))
T(ops_only_vpandq, "", Q8("vpandq"))
T(fma8_vpternlogq8, F, QT8("vpternlogq"))
T(fma8_vpaddq8, F, Q8("vpaddq"))
T(fma8_vaddpd8, F, Q8("vaddpd"))
T(fma8_vmulpd8, F, Q8("vmulpd"))
T(fma8_vscalefpd8, F, Q8("vscalefpd"))
T(fma8_valignq8, F, QT8("valignq"))
T(fma8_vpmultishiftqb8, F, Q8("vpmultishiftqb"))
T(ops_only_vpmultishiftqb, "", Q8("vpmultishiftqb"))
T(fma8_vpmuludq8, F, Q8("vpmuludq"))
T(fma8_vpmadd52luq8, F, Q8("vpmadd52luq"))
T(fma8_vshufpd8, F, QT8("vshufpd"))
T(fma8_vpshufd8, F, QI8("vpshufd"))
T(fma8, F, "")
T(fma8_sllv8_srai8_and8, F, Q8("vpsllvq") SI8("vpsraq") S8("vpandq"))
T(fma8_sllv8_srai8, F, Q8("vpsllvq") SI8("vpsraq"))
T(fma8_sllv8_and8, F, Q8("vpsllvq") S8("vpandq"))
T(fma8_sllv16, F, Q8("vpsllvq") S8("vpsllvq"))
T(fma8_and16, F, Q8("vpandq") S8("vpandq"))
T(fma8_and24, F, Q8("vpandq") S8("vpandq") Q8("vpandq"))
T(fma8_unpck8_sllv8, F, Q8("vpunpcklwd") S8("vpsllvq"))
T(fma8_bcast8, F, BC)
T(fma8_bcast8_sllv8_srai8_and8, F, BC Q8("vpsllvq") SI8("vpsraq") S8("vpandq"))
T(fma8_ld2_vpermi2b8_sll_and, F, LD Q8("vpermi2b"))
T(sllv8_srai8_and8_only, "", Q8("vpsllvq") SI8("vpsraq") S8("vpandq"))
T(fma8_shufd8_and8, F, SI8("vpshufd") Q8("vpandq"))
T(fma8_srai8_and8, F, SI8("vpsraq") S8("vpandq"))
T(fma8_srai8_and8_add8, F, SI8("vpsraq") S8("vpandq") Q8("vpaddq"))
T(fma8_cvtps2pd_zmm, F, U8("vcvtps2pd","%%ymm10","zmm"))
T(fma8_cvtps2pd_ymm, F, U8("vcvtps2pd","%%xmm10","ymm"))
T(fma8_movzxwq_zmm, F, U8("vpmovzxwq","%%xmm10","zmm"))
T(fma8_movzxwd_zmm, F, U8("vpmovzxwd","%%ymm10","zmm"))
T(fma8_movzxwd_ymm, F, U8("vpmovzxwd","%%xmm10","ymm"))
T(fma8_movzxwq_mem, F, U8("vpmovzxwq","(%1)","zmm"))
T(fma8_movzxwd_mem_zmm, F, U8("vpmovzxwd","(%1)","zmm"))
T(fma8_slld_ymm, F, U8("vpslld $16,","%%ymm10","ymm"))
T(fma8_vpermilpd_var, F, RR("vpermilpd"))
T(fma8_vpermilps_var, F, RR("vpermilps"))
T(fma8_vpshldvq, F, RR("vpshldvq"))
T(fma8_vpshldvw, F, RR("vpshldvw"))
T(fma8_vpshldq_imm, F, I8("vpshldq",3))
T(fma8_vpshrdw_imm, F, I8("vpshrdw",3))
T(fma8_vpblendmq, F, RR("vpblendmq"))
T(fma8_vshufps, F, I8("vshufps",0x44))
T(fma8_vunpcklpd, F, RR("vunpcklpd"))
T(fma8_vpunpckhdq, F, RR("vpunpckhdq"))
T(fma8_vshufi64x2, F, I8("vshufi64x2",0x44))
T(fma8_valignd, F, I8("valignd",3))
T(fma8_vpsravw, F, RR("vpsravw"))
T(fma8_vpsraq, F, U8("vpsraq $3,","%%zmm10","zmm"))
T(fma8_vpsrad, F, U8("vpsrad $3,","%%zmm10","zmm"))
T(fma8_vpermt2w, F, RR("vpermt2w"))
/* the MXFP4 one-token kernel's loop body (tenth session): per 8 weights a broadcast load, a
 * vpsllvq and a zero-masked vpermw beside the FMA; and GPR spills (vmovq xmm -> GPR) */
#define BQD "vpbroadcastq (%1),%%zmm16\n vpbroadcastd 4(%1),%%zmm17\n vpbroadcastq 16(%1),%%zmm18\n vpbroadcastd 20(%1),%%zmm19\n vpbroadcastq 32(%1),%%zmm20\n vpbroadcastd 36(%1),%%zmm21\n vpbroadcastq 48(%1),%%zmm22\n vpbroadcastd 52(%1),%%zmm23\n"
#define PWZ(d) "vpermw %%zmm10,%%zmm11,%%zmm" #d "%{%%k1%}%{z%}\n"
#define PW8 PWZ(24) PWZ(25) PWZ(26) PWZ(27) PWZ(28) PWZ(29) PWZ(30) PWZ(31)
#define MQ "vmovq %%xmm12,%%rax\n vmovq %%xmm12,%%rcx\n vmovq %%xmm12,%%rdx\n vmovq %%xmm12,%%rsi\n vmovq %%xmm12,%%rdi\n vmovq %%xmm12,%%r8\n vmovq %%xmm12,%%r9\n vmovq %%xmm12,%%r10\n"
T(fma8_vpermwz8, F, PW8)
T(fma8_sllv8_vpermwz8, F, Q8("vpsllvq") PW8)
T(fma8_bcqd8, F, BQD)
T(fma8_bcqd8_sllv8_vpermwz8, F, BQD Q8("vpsllvq") PW8)
T(fma8_movq_gpr8, F, MQ)
int main(void) {
    fma8_only();
    ops_only_vpermb();
    fma8_vpermb8();
    ops_only_vpermi2b();
    fma8_vpermi2b8();
    ops_only_vpermt2b();
    fma8_vpshufb8();
    ops_only_vpshufb();
    fma8_vpermw8();
    fma8_vpermq8();
    fma8_vpermi2q8();
    fma8_vpermps8();
    fma8_vpunpcklwd8();
    fma8_vpsllq8();
    ops_only_vpsllq();
    fma8_vpsllw8();
    fma8_vpsrlvq8();
    fma8_vpsllvw8();
    fma8_vprolq8();
    fma8_vpandq8();
    ops_only_vpandq();
    fma8_vpternlogq8();
    fma8_vpaddq8();
    fma8_vaddpd8();
    fma8_vmulpd8();
    fma8_vscalefpd8();
    fma8_valignq8();
    fma8_vpmultishiftqb8();
    ops_only_vpmultishiftqb();
    fma8_vpmuludq8();
    fma8_vpmadd52luq8();
    fma8_vshufpd8();
    fma8_vpshufd8();
    fma8();
    fma8_sllv8_srai8_and8();
    fma8_sllv8_srai8();
    fma8_sllv8_and8();
    fma8_sllv16();
    fma8_and16();
    fma8_and24();
    fma8_unpck8_sllv8();
    fma8_bcast8();
    fma8_bcast8_sllv8_srai8_and8();
    fma8_ld2_vpermi2b8_sll_and();
    sllv8_srai8_and8_only();
    fma8_shufd8_and8();
    fma8_srai8_and8();
    fma8_srai8_and8_add8();
    fma8_cvtps2pd_zmm();
    fma8_cvtps2pd_ymm();
    fma8_movzxwq_zmm();
    fma8_movzxwd_zmm();
    fma8_movzxwd_ymm();
    fma8_movzxwq_mem();
    fma8_movzxwd_mem_zmm();
    fma8_slld_ymm();
    fma8_vpermilpd_var();
    fma8_vpermilps_var();
    fma8_vpshldvq();
    fma8_vpshldvw();
    fma8_vpshldq_imm();
    fma8_vpshrdw_imm();
    fma8_vpblendmq();
    fma8_vshufps();
    fma8_vunpcklpd();
    fma8_vpunpckhdq();
    fma8_vshufi64x2();
    fma8_valignd();
    fma8_vpsravw();
    fma8_vpsraq();
    fma8_vpsrad();
    fma8_vpermt2w();
    fma8_vpermwz8();
    fma8_sllv8_vpermwz8();
    fma8_bcqd8();
    fma8_bcqd8_sllv8_vpermwz8();
    fma8_movq_gpr8();
    return 0;
}
