/* test_sha256.c - common/sha256 against the FIPS 180-4 / NIST example vectors
 * ("abc", the empty message, the 448-bit two-block message, one million 'a'),
 * each also fed in odd-sized pieces so partial blocks are exercised, on the portable
 * path and, when the CPU has them, the SHA-NI path. */
#include "common/sha256.h"
#include "tests/unit/check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int use_shani;

static void check(const char *what, const void *msg, size_t len, size_t piece, size_t repeat, const char *want) {
    sha256_ctx c;
    sha256_init(&c);
    c.use_shani = use_shani;
    for (size_t r = 0; r < repeat; r++)
        for (size_t o = 0; o < len; o += piece) sha256_update(&c, (const char *)msg + o, len - o < piece ? len - o : piece);
    uint8_t d[32];
    char hex[65];
    sha256_final(&c, d);
    sha256_hex(d, hex);
    CHECK(!strcmp(hex, want), "%s (piece %zu, %s): %s, want %s", what, piece, use_shani ? "SHA-NI" : "portable", hex, want);
}

static void vectors(void) {
    static const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    static const char *four = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    size_t pieces[] = {1, 3, 55, 64, 1000};
    for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++) {
        size_t p = pieces[i];
        check("abc", "abc", 3, p, 1, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        check("empty", "", 0, p, 1, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        check("448 bits", two, strlen(two), p, 1, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
        check("896 bits", four, strlen(four), p, 1, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
    }
    static char a[1000];
    memset(a, 'a', sizeof a);
    check("million a", a, sizeof a, 1000, 1000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    check("million a", a, sizeof a, 7, 1000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

/* MB/s of one path over 64 MiB (printed, never asserted). */
static double rate(int shani) {
    size_t n = (size_t)64 << 20;
    unsigned char *buf = malloc(n);
    if (!buf) return 0;
    for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(i * 2654435761u >> 13);
    sha256_ctx c;
    uint8_t d[32];
    sha256_init(&c);
    c.use_shani = shani;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    sha256_update(&c, buf, n);
    sha256_final(&c, d);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    free(buf);
    double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    return s > 0 ? n / s / 1e6 : 0;
}

int main(void) {
    use_shani = 0;
    vectors();
    int have = sha256_cpu_has_shani();
    if (have) { use_shani = 1; vectors(); }
    if (check_failures) { printf("%d failures\n", check_failures); return 1; }
    printf("sha256: all FIPS 180-4 vectors pass (portable%s); portable %.0f MB/s", have ? " and SHA-NI" : "; no SHA-NI on this CPU", rate(0));
    if (have) printf(", SHA-NI %.0f MB/s", rate(1));
    printf(" (one thread, not asserted)\n");
    return 0;
}
