/* hash64.h - XXH64 (Yann Collet's xxHash, 64-bit variant), one-shot and streaming.
 *
 * Used for the checksums and model fingerprint of state files (coordinator/state_file.h) and
 * the keys of prefix snapshots. Not cryptographic: it detects corruption and mismatched
 * inputs, not an adversary who forges a file. The value is the published XXH64 (test
 * vectors in tests/unit/test_state.c), independent of the host's alignment; the build
 * assumes a little-endian host (static assertion in hash64.c). */
#ifndef K3_HASH64_H
#define K3_HASH64_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t v[4];
    uint64_t total;
    uint8_t mem[32];
    size_t memsize;
    uint64_t seed;
} hash64_state;

void hash64_init(hash64_state *h, uint64_t seed);
void hash64_update(hash64_state *h, const void *data, size_t len);
uint64_t hash64_digest(const hash64_state *h);
uint64_t hash64(const void *data, size_t len, uint64_t seed);

#endif
