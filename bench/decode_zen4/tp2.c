/* tp2.c - throughput of independent mixes (which pipes ops share). cc -O2 -march=native tp2.c */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
#define N 20000000L
static double ghz;
volatile long long seedv = 0x123456789abcdefLL;
#define DECL __m512i i0,i1,i2,i3,i4,i5,i6,i7,i8,i9,i10,i11; __m512d f0,f1,f2,f3,f4,f5,f6,f7,f8,f9,f10,f11; \
  { __m512i s_=_mm512_set1_epi64(seedv); i0=_mm512_add_epi64(s_,_mm512_set1_epi64(1)); i1=_mm512_add_epi64(s_,_mm512_set1_epi64(2)); i2=_mm512_add_epi64(s_,_mm512_set1_epi64(3)); i3=_mm512_add_epi64(s_,_mm512_set1_epi64(4)); i4=_mm512_add_epi64(s_,_mm512_set1_epi64(5)); i5=_mm512_add_epi64(s_,_mm512_set1_epi64(6)); i6=_mm512_add_epi64(s_,_mm512_set1_epi64(7)); i7=_mm512_add_epi64(s_,_mm512_set1_epi64(8)); i8=_mm512_add_epi64(s_,_mm512_set1_epi64(9)); i9=_mm512_add_epi64(s_,_mm512_set1_epi64(10)); i10=_mm512_add_epi64(s_,_mm512_set1_epi64(11)); i11=_mm512_add_epi64(s_,_mm512_set1_epi64(12)); \
    f0=_mm512_castsi512_pd(_mm512_srli_epi64(i0,12)); f1=_mm512_castsi512_pd(_mm512_srli_epi64(i1,12)); f2=_mm512_castsi512_pd(_mm512_srli_epi64(i2,12)); f3=_mm512_castsi512_pd(_mm512_srli_epi64(i3,12)); f4=_mm512_castsi512_pd(_mm512_srli_epi64(i4,12)); f5=_mm512_castsi512_pd(_mm512_srli_epi64(i5,12)); f6=_mm512_castsi512_pd(_mm512_srli_epi64(i6,12)); f7=_mm512_castsi512_pd(_mm512_srli_epi64(i7,12)); f8=_mm512_castsi512_pd(_mm512_srli_epi64(i8,12)); f9=_mm512_castsi512_pd(_mm512_srli_epi64(i9,12)); f10=_mm512_castsi512_pd(_mm512_srli_epi64(i10,12)); f11=_mm512_castsi512_pd(_mm512_srli_epi64(i11,12)); }
#define SINK __asm__ volatile(""::"v"(i0),"v"(i1),"v"(i2),"v"(i3),"v"(i4),"v"(i5),"v"(i6),"v"(i7),"v"(i8),"v"(i9),"v"(i10),"v"(i11)); __asm__ volatile(""::"v"(f0),"v"(f1),"v"(f2),"v"(f3),"v"(f4),"v"(f5),"v"(f6),"v"(f7),"v"(f8),"v"(f9),"v"(f10),"v"(f11));
#define RUN(name, nops, BODY) { DECL double t0=now(); for (long it=0; it<N; it++) { BODY } double t=now()-t0; SINK printf("%-40s %.2f cyc per round of %d ops\n", name, t/N*1e9*ghz , nops); }
int main(void){
  { long x=1; double t0=now(); for (long i=0;i<N*4;i++) __asm__ volatile("add $1, %0\n add $1, %0\n add $1, %0\n add $1, %0":"+r"(x)); double t=now()-t0; ghz = N*16.0/t/1e9; printf("clock ~%.2f GHz\n", ghz); }
  const __m512d d = _mm512_set1_pd(1.0000001), e=_mm512_set1_pd(1e-300);
  const __m512i sh=_mm512_setr_epi64(0,4,8,12,16,20,24,28); const __m512d tab=_mm512_set1_pd(1.0);
  static double mbuf[256] __attribute__((aligned(64))); for (int k=0;k<256;k++) mbuf[k]=1e-300*k; const double *mp = mbuf;
  const __m512i keep = _mm512_set1_epi64((long long)0x8fffffffffffffffull);
#define FM(f) f=_mm512_fmadd_pd(f,d,e);
#define PI(i) i=_mm512_castpd_si512(_mm512_permutex2var_pd(tab,i,tab));
#define SV(i) i=_mm512_srlv_epi64(i,sh);
#define SR(i) i=_mm512_srai_epi64(i,3);
#define PW(i) i=_mm512_maskz_permutexvar_epi16(0x88888888u,i,i);
#define AN(i) i=_mm512_and_si512(i,keep);
#define SB(i) i=_mm512_shuffle_epi8(i,sh);
#define MS(i) i=_mm512_multishift_epi64_epi8(sh,i);
#define PB(i) i=_mm512_permutexvar_epi8(sh,i);
#define RV(i) i=_mm512_rolv_epi64(i,sh);
#define FMM(f) f=_mm512_fmadd_pd(f,d,_mm512_loadu_pd(mp + 8*(__COUNTER__ % 12)));
#define PIM(i) i=_mm512_castpd_si512(_mm512_permutex2var_pd(tab,i,_mm512_loadu_pd(mp + 96 + 8*(__COUNTER__ % 12))));
#define PQ(i) i=_mm512_permutex2var_epi64(sh,i,sh);
#define P2B(i) i=_mm512_maskz_permutex2var_epi8(0xE0E0E0E0E0E0E0E0ull,sh,i,keep);
#define SW(i) i=_mm512_slli_epi16(i,5);
#define AD(f) f=_mm512_add_pd(f,e);
#define ALL12(OP, p) OP(p##0) OP(p##1) OP(p##2) OP(p##3) OP(p##4) OP(p##5) OP(p##6) OP(p##7) OP(p##8) OP(p##9) OP(p##10) OP(p##11)
#define HALF(OP, p) OP(p##0) OP(p##1) OP(p##2) OP(p##3) OP(p##4) OP(p##5)
#define HALF2(OP, p) OP(p##6) OP(p##7) OP(p##8) OP(p##9) OP(p##10) OP(p##11)
  /* each round: 12 ops; printed: cycles per 12 ops * nops/12 ... simpler: cycles per round normalised to 'per op-group' */
  RUN("12 fma", 12, ALL12(FM, f))
  RUN("12 permi2pd", 12, ALL12(PI, i))
  RUN("12 srlv", 12, ALL12(SV, i))
  RUN("12 and", 12, ALL12(AN, i))
  RUN("12 fma + 12 permi2pd", 24, ALL12(FM, f) ALL12(PI, i))
  RUN("12 fma + 12 srlv", 24, ALL12(FM, f) ALL12(SV, i))
  RUN("12 fma + 12 permw", 24, ALL12(FM, f) ALL12(PW, i))
  RUN("12 fma + 12 shufb", 24, ALL12(FM, f) ALL12(SB, i))
  RUN("12 fma + 12 and", 24, ALL12(FM, f) ALL12(AN, i))
  RUN("6 srlv + 6 permi2pd", 12, HALF(SV, i) HALF2(PI, i))
  RUN("6 permw + 6 srai", 12, HALF(PW, i) HALF2(SR, i))
  RUN("6 shufb + 6 srai", 12, HALF(SB, i) HALF2(SR, i))
  RUN("6 shufb + 6 permi2pd", 12, HALF(SB, i) HALF2(PI, i))
  RUN("6 mshift + 6 permi2pd", 12, HALF(MS, i) HALF2(PI, i))
  RUN("6 permb + 6 permi2pd", 12, HALF(PB, i) HALF2(PI, i))
  RUN("12 fma(mem) + 12 permi2pd", 24, __asm__ volatile("" : "+r"(mp)); ALL12(FMM, f) ALL12(PI, i))
  RUN("12 fma(mem) + 12 permi2pd(mem)", 24, __asm__ volatile("" : "+r"(mp)); ALL12(FMM, f) ALL12(PIM, i))
  RUN("12 srlv + 12 permi2pd + 12 fma(mem)", 36, __asm__ volatile("" : "+r"(mp)); ALL12(SV, i) ALL12(PI, i) ALL12(FMM, f))
  RUN("12 srlv + 12 permi2pd(mem) + 12 fma(mem)", 36, __asm__ volatile("" : "+r"(mp)); ALL12(SV, i) ALL12(PIM, i) ALL12(FMM, f))
  RUN("12 rolv", 12, ALL12(RV, i))
  RUN("12 rolv + 12 fma", 24, ALL12(RV, i) ALL12(FM, f))
  RUN("12 permw", 12, ALL12(PW, i))
  RUN("6 rolv + 6 permw", 12, HALF(RV, i) HALF2(PW, i))
  RUN("6 srlv + 6 permw", 12, HALF(SV, i) HALF2(PW, i))
  RUN("12 srlv + 12 permw + 12 fma", 36, ALL12(SV, i) ALL12(PW, i) ALL12(FM, f))
  RUN("12 rolv + 12 permw + 12 fma", 36, ALL12(RV, i) ALL12(PW, i) ALL12(FM, f))
  RUN("12 rolv + 12 permw + 12 fma(mem)", 36, __asm__ volatile("" : "+r"(mp)); ALL12(RV, i) ALL12(PW, i) ALL12(FMM, f))
  RUN("12 permi2q", 12, ALL12(PQ, i))
  RUN("12 permi2b", 12, ALL12(P2B, i))
  RUN("12 fma + 12 permi2q", 24, ALL12(FM, f) ALL12(PQ, i))
  RUN("12 fma + 12 permi2b", 24, ALL12(FM, f) ALL12(P2B, i))
  RUN("12 fma + 12 psllw", 24, ALL12(FM, f) ALL12(SW, i))
  RUN("12 fma + 12 srai", 24, ALL12(FM, f) ALL12(SR, i))
  RUN("12 fma + 12 addpd", 24, ALL12(FM, f) ALL12(AD, f))
  RUN("6 srlv + 6 permi2q", 12, HALF(SV, i) HALF2(PQ, i))
  RUN("6 srlv +6 permi2q + 12 fma", 24, HALF(SV, i) HALF2(PQ, i) ALL12(FM, f))
  RUN("12 srlv + 12 permi2q + 12 fma", 36, ALL12(SV, i) ALL12(PQ, i) ALL12(FM, f))
  RUN("12 srlv + 12 permi2pd + 12 fma", 36, ALL12(SV, i) ALL12(PI, i) ALL12(FM, f))
  RUN("12 permi2b + 12 fma + 3 sh", 27, ALL12(P2B, i) ALL12(FM, f) SW(i0) SR(i1) SW(i2))
  RUN("6 srlv +6 permi2pd + 12 fma (mxfp4)", 24, HALF(SV, i) HALF2(PI, i) ALL12(FM, f))
  RUN("6 permw+6 srai+12 and+12 fma (xs)", 36, HALF(PW, i) HALF2(SR, i) ALL12(AN,i) ALL12(FM, f))
  return 0;
}
