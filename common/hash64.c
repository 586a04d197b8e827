/* hash64.c - XXH64 (see hash64.h). */
#include "common/hash64.h"
#include <string.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "k3 assumes a little-endian host");

#define P1 11400714785074694791ULL
#define P2 14029467366897019727ULL
#define P3 1609587929392839161ULL
#define P4 9650029242287828579ULL
#define P5 2870177450012600261ULL

static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t round64(uint64_t acc, uint64_t in) { acc += in * P2; acc = rotl(acc, 31); return acc * P1; }
static uint64_t merge64(uint64_t acc, uint64_t v) { acc ^= round64(0, v); return acc * P1 + P4; }

void hash64_init(hash64_state *h, uint64_t seed) {
    memset(h, 0, sizeof *h);
    h->seed = seed;
    h->v[0] = seed + P1 + P2;
    h->v[1] = seed + P2;
    h->v[2] = seed;
    h->v[3] = seed - P1;
}

static void stripe(hash64_state *h, const uint8_t *p) {
    h->v[0] = round64(h->v[0], rd64(p));
    h->v[1] = round64(h->v[1], rd64(p + 8));
    h->v[2] = round64(h->v[2], rd64(p + 16));
    h->v[3] = round64(h->v[3], rd64(p + 24));
}

void hash64_update(hash64_state *h, const void *data, size_t len) {
    const uint8_t *p = data;
    h->total += len;
    if (h->memsize + len < 32) {
        if (len) memcpy(h->mem + h->memsize, p, len);
        h->memsize += len;
        return;
    }
    if (h->memsize) {
        size_t take = 32 - h->memsize;
        memcpy(h->mem + h->memsize, p, take);
        stripe(h, h->mem);
        p += take;
        len -= take;
        h->memsize = 0;
    }
    while (len >= 32) {
        stripe(h, p);
        p += 32;
        len -= 32;
    }
    if (len) memcpy(h->mem, p, len);
    h->memsize = len;
}

uint64_t hash64_digest(const hash64_state *h) {
    uint64_t a;
    if (h->total >= 32) {
        a = rotl(h->v[0], 1) + rotl(h->v[1], 7) + rotl(h->v[2], 12) + rotl(h->v[3], 18);
        for (int i = 0; i < 4; i++) a = merge64(a, h->v[i]);
    } else a = h->seed + P5;
    a += h->total;
    const uint8_t *p = h->mem;
    size_t n = h->memsize;
    while (n >= 8) {
        a ^= round64(0, rd64(p));
        a = rotl(a, 27) * P1 + P4;
        p += 8;
        n -= 8;
    }
    if (n >= 4) {
        a ^= (uint64_t)rd32(p) * P1;
        a = rotl(a, 23) * P2 + P3;
        p += 4;
        n -= 4;
    }
    while (n--) {
        a ^= (*p++) * P5;
        a = rotl(a, 11) * P1;
    }
    a ^= a >> 33;
    a *= P2;
    a ^= a >> 29;
    a *= P3;
    a ^= a >> 32;
    return a;
}

uint64_t hash64(const void *data, size_t len, uint64_t seed) {
    hash64_state h;
    hash64_init(&h, seed);
    hash64_update(&h, data, len);
    return hash64_digest(&h);
}
