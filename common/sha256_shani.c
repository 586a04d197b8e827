/* sha256_shani.c - SHA-256 compression with the x86 SHA extensions (SHA-NI).
 * Compiled with -msha -msse4.1 -mssse3 (Makefile: files named *_shani.c); called only
 * when sha256_init found the instructions (CPUID). Same results as the portable
 * block function in sha256.c: tests/unit/test_sha256.c runs the vectors on both. */
#include "common/sha256.h"
#include <immintrin.h>

void sha256_blocks_shani(uint32_t h[8], const uint8_t *p, size_t nblocks, const uint32_t k[64]) {
    const __m128i MASK = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i tmp = _mm_loadu_si128((const __m128i *)&h[0]);
    __m128i s1 = _mm_loadu_si128((const __m128i *)&h[4]);
    tmp = _mm_shuffle_epi32(tmp, 0xB1);        /* CDAB */
    s1 = _mm_shuffle_epi32(s1, 0x1B);          /* EFGH */
    __m128i s0 = _mm_alignr_epi8(tmp, s1, 8);  /* ABEF */
    s1 = _mm_blend_epi16(s1, tmp, 0xF0);       /* CDGH */
    for (; nblocks; nblocks--, p += 64) {
        __m128i abef = s0, cdgh = s1, w[4];
        for (int g = 0; g < 16; g++) {
            __m128i x;
            if (g < 4) x = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * g)), MASK);
            else {
                __m128i t = _mm_sha256msg1_epu32(w[g & 3], w[(g - 3) & 3]);       /* W[g-4], W[g-3] */
                t = _mm_add_epi32(t, _mm_alignr_epi8(w[(g - 1) & 3], w[(g - 2) & 3], 4));
                x = _mm_sha256msg2_epu32(t, w[(g - 1) & 3]);
            }
            w[g & 3] = x;
            __m128i m = _mm_add_epi32(x, _mm_loadu_si128((const __m128i *)&k[4 * g]));
            s1 = _mm_sha256rnds2_epu32(s1, s0, m);
            s0 = _mm_sha256rnds2_epu32(s0, s1, _mm_shuffle_epi32(m, 0x0E));
        }
        s0 = _mm_add_epi32(s0, abef);
        s1 = _mm_add_epi32(s1, cdgh);
    }
    tmp = _mm_shuffle_epi32(s0, 0x1B);         /* FEBA */
    s1 = _mm_shuffle_epi32(s1, 0xB1);          /* DCHG */
    s0 = _mm_blend_epi16(tmp, s1, 0xF0);       /* DCBA */
    s1 = _mm_alignr_epi8(s1, tmp, 8);          /* ABEF */
    _mm_storeu_si128((__m128i *)&h[0], s0);
    _mm_storeu_si128((__m128i *)&h[4], s1);
}
