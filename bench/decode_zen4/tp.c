/* tp.c - instruction throughput on this core (register operands, 8 independent chains).
 * Outside the build: cc -O2 -march=native tp.c -o /tmp/tp */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
#define N 20000000L
#define LOOP8(BODY) for (long i = 0; i < N; i++) { BODY(a0) BODY(a1) BODY(a2) BODY(a3) BODY(a4) BODY(a5) BODY(a6) BODY(a7) BODY(a8) BODY(a9) BODY(a10) BODY(a11) }
#define T(name, TY, init, BODY, sink) { TY a0,a1,a2,a3,a4,a5,a6,a7,a8,a9,a10,a11; { volatile TY v[12]; for(int k_=0;k_<12;k_++){TY t_=init; ((char*)&t_)[k_]^=(char)(k_+1); v[k_]=t_;} a0=v[0];a1=v[1];a2=v[2];a3=v[3];a4=v[4];a5=v[5];a6=v[6];a7=v[7];a8=v[8];a9=v[9];a10=v[10];a11=v[11]; } double t0=now(); LOOP8(BODY) double t=now()-t0; \
  __asm__ volatile(""::"v"(a0),"v"(a1),"v"(a2),"v"(a3),"v"(a4),"v"(a5),"v"(a6),"v"(a7),"v"(a8),"v"(a9),"v"(a10),"v"(a11)); printf("%-28s %.3f ns/instr  %.2f cyc\n", name, t/(N*12.0)*1e9*(BODYN), t/(N*12.0)*1e9*(BODYN)*ghz); }
double ghz=1;
int main(void){
  /* clock: dependent add chain */
  { long x=1; double t0=now(); for (long i=0;i<N*4;i++) __asm__ volatile("add $1, %0\n add $1, %0\n add $1, %0\n add $1, %0":"+r"(x)); double t=now()-t0; ghz = N*16.0/t/1e9; printf("clock ~%.2f GHz\n", ghz); }
  __m512d d = _mm512_set1_pd(1.0000001), e=_mm512_set1_pd(0.999999);
  __m256d dy = _mm256_set1_pd(1.0000001), ey=_mm256_set1_pd(0.999999);
  __m512i iz = _mm512_set1_epi64(0x123456789abcdefLL), sh=_mm512_setr_epi64(0,4,8,12,16,20,24,28);
  __m256i iy = _mm256_set1_epi64x(0x123456789abcdefLL), shy=_mm256_setr_epi64x(0,4,8,12);
  __m512i tab = _mm512_set1_epi64(3);
  __m256i taby = _mm256_set1_epi64x(3);
#define BODYN 1
#define FMA(a) a=_mm512_fmadd_pd(a,d,e);
  T("fma zmm", __m512d, d, FMA, 0)
#define FMAY(a) a=_mm256_fmadd_pd(a,dy,ey);
  T("fma ymm", __m256d, dy, FMAY, 0)
#define PERMW(a) a=_mm512_maskz_permutexvar_epi16(0x88888888u,a,a);
  T("vpermw zmm maskz", __m512i, iz, PERMW, 0)
#define PERMWY(a) a=_mm256_maskz_permutexvar_epi16(0x8888u,a,a);
  T("vpermw ymm maskz", __m256i, iy, PERMWY, 0)
#define PERMI2PD(a) a=_mm512_castpd_si512(_mm512_permutex2var_pd(_mm512_castsi512_pd(tab),a,_mm512_castsi512_pd(tab)));
  T("vpermi2pd zmm", __m512i, iz, PERMI2PD, 0)
#define PERMI2PDY(a) a=_mm256_castpd_si256(_mm256_permutex2var_pd(_mm256_castsi256_pd(taby),a,_mm256_castsi256_pd(taby)));
  T("vpermi2pd ymm", __m256i, iy, PERMI2PDY, 0)
#define SRLV(a) a=_mm512_srlv_epi64(a,sh);
  T("vpsrlvq zmm", __m512i, iz, SRLV, 0)
#define SRLVY(a) a=_mm256_srlv_epi64(a,shy);
  T("vpsrlvq ymm", __m256i, iy, SRLVY, 0)
#define SRAI(a) a=_mm512_srai_epi64(a,3);
  T("vpsraq zmm imm", __m512i, iz, SRAI, 0)
#define SRAIY(a) a=_mm256_srai_epi64(a,3);
  T("vpsraq ymm imm", __m256i, iy, SRAIY, 0)
#define AND(a) a=_mm512_and_si512(a,sh);
  T("vpandq zmm", __m512i, iz, AND, 0)
#define SHUFB(a) a=_mm512_shuffle_epi8(a,sh);
  T("vpshufb zmm", __m512i, iz, SHUFB, 0)
#define SHUFBY(a) a=_mm256_shuffle_epi8(a,shy);
  T("vpshufb ymm", __m256i, iy, SHUFBY, 0)
#define PERMB(a) a=_mm512_permutexvar_epi8(a,a);
  T("vpermb zmm", __m512i, iz, PERMB, 0)
#define MSH(a) a=_mm512_multishift_epi64_epi8(sh,a);
  T("vpmultishiftqb zmm", __m512i, iz, MSH, 0)
#define MSHY(a) a=_mm256_multishift_epi64_epi8(shy,a);
  T("vpmultishiftqb ymm", __m256i, iy, MSHY, 0)
#define CVT(a) a=_mm512_cvtps_pd(_mm512_cvtpd_ps(a));
  T("cvtpd2ps+cvtps2pd zmm (pair)", __m512d, d, CVT, 0)
#define CVTY(a) a=_mm256_cvtps_pd(_mm256_cvtpd_ps(a));
  T("cvtpd2ps+cvtps2pd ymm (pair)", __m256d, dy, CVTY, 0)
#define MOVZX(a) a=_mm512_cvtepu16_epi64(_mm512_castsi512_si128(a));
  T("vpmovzxwq zmm", __m512i, iz, MOVZX, 0)
#define TERN(a) a=_mm512_ternarylogic_epi64(a,sh,iz,0xe4);
  T("vpternlogq zmm", __m512i, iz, TERN, 0)
  /* pairs */
#undef BODYN
#define BODYN 2
#define P1(a) a=_mm512_srlv_epi64(a,sh); a=_mm512_castpd_si512(_mm512_permutex2var_pd(_mm512_castsi512_pd(tab),a,_mm512_castsi512_pd(tab)));
  T("pair srlv+permi2pd zmm (/2)", __m512i, iz, P1, 0)
#define P2(a) a=_mm512_maskz_permutexvar_epi16(0x88888888u,a,a); a=_mm512_srai_epi64(a,3);
  T("pair permw+srai zmm (/2)", __m512i, iz, P2, 0)
#define P3(a) a=_mm512_shuffle_epi8(a,sh); a=_mm512_srai_epi64(a,3);
  T("pair shufb+srai zmm (/2)", __m512i, iz, P3, 0)
#define P4(a) a=_mm512_multishift_epi64_epi8(sh,a); a=_mm512_castpd_si512(_mm512_permutex2var_pd(_mm512_castsi512_pd(tab),a,_mm512_castsi512_pd(tab)));
  T("pair mshift+permi2pd zmm (/2)", __m512i, iz, P4, 0)
  return 0;
}
