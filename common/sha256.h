/* sha256.h - SHA-256 (FIPS 180-4), for `bin/k3 --verify --sha256`.
 *
 * Hand-written (about 100 lines) instead of linking OpenSSL's libcrypto, which
 * is not otherwise a dependency of k3; tests/unit/test_sha256.c checks it
 * against the FIPS 180-4 / NIST example vectors (including a message that
 * crosses block boundaries when fed in odd-sized pieces). No global state: the
 * caller owns the context. sha256_update may be called with any lengths.
 * On x86 CPUs with the SHA extensions (CPUID, checked by sha256_init) the blocks
 * are compressed with SHA-NI (sha256_shani.c, about 8x the portable C); the
 * portable path is used otherwise, or when a caller clears ctx.use_shani. */
#ifndef K3_SHA256_H
#define K3_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t h[8];
    uint64_t bytes;      /* message length so far */
    uint8_t buf[64];     /* a partial block */
    size_t n;            /* bytes in buf */
    int use_shani;       /* set by sha256_init from CPUID; 0 forces the portable path */
} sha256_ctx;

void sha256_init(sha256_ctx *c);
void sha256_update(sha256_ctx *c, const void *data, size_t len);
void sha256_final(sha256_ctx *c, uint8_t out[32]);
/* 64 lowercase hex digits + NUL. */
void sha256_hex(const uint8_t d[32], char out[65]);
/* 1 if this CPU has SHA-NI (and SSSE3, SSE4.1). */
int sha256_cpu_has_shani(void);
/* The SHA-NI compression of nblocks 64-byte blocks (internal; sha256.c calls it). */
void sha256_blocks_shani(uint32_t h[8], const uint8_t *p, size_t nblocks, const uint32_t k[64]);

#endif
