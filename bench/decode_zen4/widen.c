/* widen.c - the prefill gemm's 4-row x 6-token micro-kernel (kernels_gemm_avx512.c's shape, KC 256)
 * with everything in L1, one variant per way of widening the weights to double (ninth session,
 * Zen 4 VM), outside the build:
 *   cc -O3 -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx2 -mfma bench/decode_zen4/widen.c -o /tmp/widen
 *   flock /work/bench.lock /tmp/widen
 * FMAs a cycle at 3.62 GHz. Measured: every variant 0.95-1.0 (the current bf16 widening with
 * vcvtps2pd 0.95, f32 0.99, doubles from L1 1.0): the widening is not what holds the gemm at
 * 84-88 % of the peak alone and 71-79 % in the engine. */
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <time.h>
#include <string.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define KC 256
static uint16_t wb[4][KC] __attribute__((aligned(64)));
static float wf[4][KC] __attribute__((aligned(64)));
static uint16_t wt[4][KC] __attribute__((aligned(64))); /* transposed double-top words */
static double xd[6][KC] __attribute__((aligned(64)));
static double acc[4*6*8] __attribute__((aligned(64)));
typedef __m512d V;
#define MK(NAME, DECODE) \
static void NAME(long reps){ \
  for(long rep=0;rep<reps;rep++){ \
   V a[4][6]; for(int r=0;r<4;r++)for(int t=0;t<6;t++)a[r][t]=_mm512_load_pd(acc+(r*6+t)*8); \
   _Pragma("GCC unroll 4") for(int s=0;s<KC/8;s++){ \
     V x0=_mm512_load_pd(&xd[0][s*8]),x1=_mm512_load_pd(&xd[1][s*8]),x2=_mm512_load_pd(&xd[2][s*8]),x3=_mm512_load_pd(&xd[3][s*8]),x4=_mm512_load_pd(&xd[4][s*8]),x5=_mm512_load_pd(&xd[5][s*8]); \
     _Pragma("GCC unroll 4") for(int r=0;r<4;r++){ V w; DECODE; \
       a[r][0]=_mm512_fmadd_pd(w,x0,a[r][0]);a[r][1]=_mm512_fmadd_pd(w,x1,a[r][1]);a[r][2]=_mm512_fmadd_pd(w,x2,a[r][2]); \
       a[r][3]=_mm512_fmadd_pd(w,x3,a[r][3]);a[r][4]=_mm512_fmadd_pd(w,x4,a[r][4]);a[r][5]=_mm512_fmadd_pd(w,x5,a[r][5]);} } \
   for(int r=0;r<4;r++)for(int t=0;t<6;t++)_mm512_store_pd(acc+(r*6+t)*8,a[r][t]); } }
/* current bf16: zx words->dwords, <<16, cvtps2pd */
MK(cur_bf16, w=_mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_load_si128((const __m128i*)&wb[r][s*8])),16))))
/* current MXFP4 sub-tile in f32 */
MK(cur_f32, w=_mm512_cvtps_pd(_mm256_load_ps(&wf[r][s*8])))
/* free-op bf16 (x scaled by 2^896): zx words->qwords, <<48, srai 3, and */
MK(new_bf16, { __m512i q=_mm512_slli_epi64(_mm512_cvtepu16_epi64(_mm_load_si128((const __m128i*)&wb[r][s*8])),48); \
   w=_mm512_castsi512_pd(_mm512_and_si512(_mm512_srai_epi64(q,3),_mm512_set1_epi64((long long)0x8FFFE00000000000ull))); })
/* double-top words, transposed per 32 columns: word 4p+k = col 8k+p; step s -> k = s%4 of block s/4 */
MK(new_tw, { __m512i v=_mm512_load_si512((const void*)&wt[r][(s/4)*32]); int k=s&3; \
   __m512i q = k==3 ? _mm512_and_si512(v,_mm512_set1_epi64((long long)0xFFFF000000000000ull)) : k==0 ? _mm512_slli_epi64(v,48) : \
     _mm512_and_si512(_mm512_slli_epi64(v,48-16*k),_mm512_set1_epi64((long long)0xFFFF000000000000ull)); w=_mm512_castsi512_pd(q); })
/* double-top words natural order: zx words->qwords, <<48 */
MK(new_zw, w=_mm512_castsi512_pd(_mm512_slli_epi64(_mm512_cvtepu16_epi64(_mm_load_si128((const __m128i*)&wt[r][s*8])),48)))
/* pure doubles from L1 (wd) */
static double wdd[4][KC] __attribute__((aligned(64)));
MK(wd_dbl, w=_mm512_load_pd(&wdd[r][s*8]))
int main(void){ for(int r=0;r<4;r++)for(int c=0;c<KC;c++){wb[r][c]=0x3f80;wf[r][c]=1;wt[r][c]=0x3ff0;wdd[r][c]=1;} for(int t=0;t<6;t++)for(int c=0;c<KC;c++)xd[t][c]=1e-30;
 long reps=400000; struct {const char*n; void(*f)(long);} v[]={{"cur_bf16",cur_bf16},{"cur_f32",cur_f32},{"new_bf16",new_bf16},{"new_tw",new_tw},{"new_zw",new_zw},{"wd_dbl",wd_dbl}};
 for(int pass=0;pass<2;pass++) for(int i=0;i<6;i++){ double t=now(); v[i].f(reps); t=now()-t; double fmas=reps*32.0*24; printf("%-10s %.3f FMA/cycle at 3.62GHz (%.0f%% of peak)\n",v[i].n,fmas/(t*3.62e9),100*fmas/(t*3.62e9)); }
 double s=0; for(int i=0;i<192;i++)s+=acc[i]; printf("%g\n",s); return 0;}
