/* test_wire_ring.c - the bytes another process writes: common/wire.c (msgpack hello / ready /
 * request / response) and common/ring.c (slot lengths, checksums, the control page).
 * Round trips; every truncation and every single-byte corruption of every message decoded
 * without a crash (refused, or values inside the documented ranges); encoders that do not fit
 * refuse; fields out of range, wrong types, wrong message types and trailing bytes refused;
 * ring_attach refuses a wrong magic (version) or geometry; ring_slot_lengths refuses a stale
 * sequence, a header length 0 or past the capacity, a payload past the capacity or not whole
 * floats; payload_checksum sees a one-bit flip. (tests/fuzz/fuzz_wire.c and fuzz_ring.c fuzz the
 * same decoders.) */
#include "common/ring.h"
#include "common/wire.h"
#include "tests/unit/check.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static wire_hello hello(void) {
    wire_hello h;
    memset(&h, 0, sizeof h);
    snprintf(h.model_dir, sizeof h.model_dir, "tests/models/m13");
    h.worker = 2;
    h.n_workers = 3;
    h.cache_bytes = 123456789;
    h.threads = 4;
    h.node = -1;
    h.n_slots = 2;
    h.hdr_cap = 4096;
    h.req_cap = 1 << 20;
    h.resp_cap = 1 << 19;
    h.max_tokens = 64;
    h.max_pairs = 1024;
    h.life = 1;
    snprintf(h.simd, sizeof h.simd, "avx2");
    snprintf(h.policy, sizeof h.policy, "phit");
    return h;
}

/* Every prefix and every byte corruption of buf: decode must not crash (ASan/UBSan in make asan)
 * and every prefix must be refused. */
typedef int (*decode_fn)(const void *, size_t, void *, k3_error *);
static int dec_hello(const void *b, size_t n, void *o, k3_error *e) { return wire_decode_hello(b, n, o, e); }
static int dec_ready(const void *b, size_t n, void *o, k3_error *e) { return wire_decode_ready(b, n, o, e); }
static int dec_resp(const void *b, size_t n, void *o, k3_error *e) { return wire_decode_response(b, n, o, e); }
static int32_t g_pt[8], g_pe[8], g_hint[16];
static int dec_req(const void *b, size_t n, void *o, k3_error *e) {
    wire_request *q = o;
    q->pair_token = g_pt;
    q->pair_expert = g_pe;
    q->hint = g_hint;
    return wire_decode_request(b, n, 8, q, e);
}

static void mangle(const char *what, decode_fn f, const unsigned char *buf, size_t len, void *out) {
    unsigned char *c = malloc(len + 1);
    int refused = 0;
    for (size_t n = 0; n < len; n++) {
        k3_error e = {0};
        unsigned char *exact = malloc(n ? n : 1); /* exactly n bytes, so ASan sees any over-read */
        memcpy(exact, buf, n);
        refused += f(exact, n, out, &e) == -1 && e.set;
        free(exact);
    }
    CHECK(refused == (int)len, "%s: %d of %zu truncations refused", what, refused, len);
    for (size_t i = 0; i < len; i++)
        for (int v = 0; v < 3; v++) {
            memcpy(c, buf, len);
            c[i] = v == 0 ? 0xff : v == 1 ? 0x00 : (unsigned char)(c[i] ^ 0x01);
            k3_error e = {0};
            int rc = f(c, len, out, &e);
            CHECK(rc == 0 || (rc == -1 && e.set), "%s: corruption at %zu: rc %d without a message", what, i, rc);
        }
    /* a trailing byte */
    memcpy(c, buf, len);
    c[len] = 0xc0;
    k3_error e = {0};
    CHECK(f(c, len + 1, out, &e) == -1 && strstr(e.msg, "not a msgpack map"), "%s: trailing byte accepted", what);
    free(c);
}

static void test_wire(void) {
    unsigned char buf[8192];
    k3_error e = {0};
    /* hello */
    wire_hello h = hello(), h2;
    long n = wire_encode_hello(&h, buf, sizeof buf);
    CHECK(n > 0 && wire_decode_hello(buf, (size_t)n, &h2, &e) == 0 && !memcmp(&h, &h2, sizeof h), "hello round trip: %s", e.msg);
    for (long cap = 0; cap < n; cap += 7) CHECK(wire_encode_hello(&h, buf, (size_t)cap) == -1, "hello fits in %ld", cap);
    n = wire_encode_hello(&h, buf, sizeof buf);
    mangle("hello", dec_hello, buf, (size_t)n, &h2);
    h.worker = 3; /* worker must be < n_workers */
    n = wire_encode_hello(&h, buf, sizeof buf);
    k3_error_clear(&e);
    CHECK(wire_decode_hello(buf, (size_t)n, &h2, &e) == -1 && strstr(e.msg, "'worker'"), "worker 3 of 3: %s", e.msg);
    h = hello(); /* behind an MPI expert rank: group / n_groups round trip, group < n_groups */
    h.group = 1;
    h.n_groups = 3;
    n = wire_encode_hello(&h, buf, sizeof buf);
    k3_error_clear(&e);
    CHECK(n > 0 && wire_decode_hello(buf, (size_t)n, &h2, &e) == 0 && !memcmp(&h, &h2, sizeof h), "grouped hello: %s", e.msg);
    h.group = 3;
    n = wire_encode_hello(&h, buf, sizeof buf);
    k3_error_clear(&e);
    CHECK(wire_decode_hello(buf, (size_t)n, &h2, &e) == -1 && strstr(e.msg, "'group'"), "group 3 of 3: %s", e.msg);
    for (int l = 1; l < 5; l++) /* every expert has one group; one group is the one-level map */
        for (int x = 0; x < 16; x++) {
            int n_own = 0;
            for (int g = 0; g < 3; g++) n_own += expert_owner_in(l, x, g, 3, 2) >= 0;
            CHECK(n_own == 1 && expert_owner_in(l, x, 0, 1, 2) == expert_owner(l, x, 2), "owner of %d/%d", l, x);
        }
    h = hello(); /* --preload-experts: the optional preload key round-trips (with a group too) and is 0 or 1 */
    h.preload = 1;
    h.group = 1;
    h.n_groups = 2;
    n = wire_encode_hello(&h, buf, sizeof buf);
    k3_error_clear(&e);
    CHECK(n > 0 && wire_decode_hello(buf, (size_t)n, &h2, &e) == 0 && !memcmp(&h, &h2, sizeof h), "preload hello: %s", e.msg);
    mangle("hello with preload", dec_hello, buf, (size_t)n, &h2);
    h.preload = 2;
    n = wire_encode_hello(&h, buf, sizeof buf);
    k3_error_clear(&e);
    CHECK(wire_decode_hello(buf, (size_t)n, &h2, &e) == -1 && strstr(e.msg, "'preload'"), "preload 2: %s", e.msg);
    h = hello();
    h.n_slots = 65;
    n = wire_encode_hello(&h, buf, sizeof buf);
    k3_error_clear(&e);
    CHECK(wire_decode_hello(buf, (size_t)n, &h2, &e) == -1 && strstr(e.msg, "n_slots"), "65 slots: %s", e.msg);

    /* ready, and a ready decoded as a hello (message type) */
    wire_ready r = {1, "", 96, 256, 0, 1}, r2;
    n = wire_encode_ready(&r, buf, sizeof buf);
    k3_error_clear(&e);
    CHECK(n > 0 && wire_decode_ready(buf, (size_t)n, &r2, &e) == 0 && !memcmp(&r, &r2, sizeof r), "ready round trip: %s", e.msg);
    k3_error_clear(&e);
    CHECK(wire_decode_hello(buf, (size_t)n, &h2, &e) == -1, "a ready message accepted as hello");
    mangle("ready", dec_ready, buf, (size_t)n, &r2);
    r.direct_io = 2;
    n = wire_encode_ready(&r, buf, sizeof buf);
    k3_error_clear(&e);
    CHECK(wire_decode_ready(buf, (size_t)n, &r2, &e) == -1 && strstr(e.msg, "direct_io"), "direct_io 2: %s", e.msg);

    /* request */
    int32_t pt[4] = {0, 1, 1, 2}, pe[4] = {5, 7, 9, 0}, qt[8], qe[8];
    wire_request q = {WIRE_REQ_EXPERTS, 42, 3, 3, 4, pt, pe, 0, 0, NULL}, q2 = {0, 0, 0, 0, 0, qt, qe, 0, 0, NULL};
    n = wire_encode_request(&q, buf, sizeof buf);
    k3_error_clear(&e);
    CHECK(n > 0 && wire_decode_request(buf, (size_t)n, 8, &q2, &e) == 0 && q2.kind == q.kind && q2.id == 42 &&
              q2.layer == 3 && q2.ntok == 3 && q2.npairs == 4 && !memcmp(qt, pt, sizeof pt) && !memcmp(qe, pe, sizeof pe),
          "request round trip: %s", e.msg);
    k3_error_clear(&e);
    CHECK(wire_decode_request(buf, (size_t)n, 3, &q2, &e) == -1 && strstr(e.msg, "npairs"), "4 pairs over max 3: %s", e.msg);
    mangle("request", dec_req, buf, (size_t)n, &q2);
    q.ntok = 2; /* pair 3 names token 2 of 2 */
    n = wire_encode_request(&q, buf, sizeof buf);
    k3_error_clear(&e);
    q2.pair_token = qt;
    q2.pair_expert = qe;
    CHECK(wire_decode_request(buf, (size_t)n, 8, &q2, &e) == -1 && strstr(e.msg, "token 2 of 2"), "token past ntok: %s", e.msg);
    int32_t neg[1] = {-1};
    wire_request qn = {WIRE_REQ_EXPERTS, 1, 0, 1, 1, pt, neg, 0, 0, NULL};
    n = wire_encode_request(&qn, buf, sizeof buf);
    k3_error_clear(&e);
    q2.pair_token = qt;
    q2.pair_expert = qe;
    CHECK(n < 0 || (wire_decode_request(buf, (size_t)n, 8, &q2, &e) == -1 && strstr(e.msg, "pairs[1]")),
          "negative expert id: %s", e.msg);
    wire_request qs = {WIRE_REQ_SHUTDOWN, 9, 0, 0, 0, pt, pe, 0, 0, NULL};
    n = wire_encode_request(&qs, buf, sizeof buf);
    k3_error_clear(&e);
    q2.pair_token = qt;
    q2.pair_expert = qe;
    CHECK(wire_decode_request(buf, (size_t)n, 8, &q2, &e) == 0 && q2.kind == WIRE_REQ_SHUTDOWN, "shutdown: %s", e.msg);

    /* a request with a prefetch hint (the next MoE layer's predicted experts) */
    int32_t hint[17], hq[16];
    for (int i = 0; i < 17; i++) hint[i] = 100 + 3 * i;
    wire_request qh = {WIRE_REQ_EXPERTS, 43, 3, 3, 4, pt, pe, 5, 6, hint}, qh2 = {0, 0, 0, 0, 0, qt, qe, 0, 0, hq};
    n = wire_encode_request(&qh, buf, sizeof buf);
    k3_error_clear(&e);
    CHECK(n > 0 && wire_decode_request(buf, (size_t)n, 8, &qh2, &e) == 0 && qh2.hint_layer == 5 && qh2.nhint == 6 &&
              !memcmp(hq, hint, 6 * sizeof *hint) && qh2.npairs == 4 && !memcmp(qe, pe, sizeof pe),
          "hinted request round trip: %s", e.msg);
    CHECK(wire_hint_max(8) == 16 && wire_hint_max(1024) == 256, "wire_hint_max");
    mangle("hinted request", dec_req, buf, (size_t)n, &qh2);
    qh2.hint = NULL; /* no room for a hint: refused */
    k3_error_clear(&e);
    CHECK(wire_decode_request(buf, (size_t)n, 8, &qh2, &e) == -1 && strstr(e.msg, "'hint'"), "hint without room: %s", e.msg);
    qh.nhint = 17; /* over wire_hint_max(8) = 16 */
    n = wire_encode_request(&qh, buf, sizeof buf);
    qh2.hint = hq;
    k3_error_clear(&e);
    CHECK(wire_decode_request(buf, (size_t)n, 8, &qh2, &e) == -1 && strstr(e.msg, "at most 16"), "17 hinted: %s", e.msg);
    qh.nhint = 2;
    qh.hint_layer = -1; /* a negative layer */
    n = wire_encode_request(&qh, buf, sizeof buf);
    k3_error_clear(&e);
    CHECK(wire_decode_request(buf, (size_t)n, 8, &qh2, &e) == -1 && strstr(e.msg, "hint_layer"), "hint_layer -1: %s", e.msg);
    int32_t bad_hint[2] = {3, -4};
    qh.hint_layer = 2;
    qh.hint = bad_hint;
    n = wire_encode_request(&qh, buf, sizeof buf);
    k3_error_clear(&e);
    CHECK(wire_decode_request(buf, (size_t)n, 8, &qh2, &e) == -1 && strstr(e.msg, "hint[1]"), "negative hinted id: %s", e.msg);
    bad_hint[1] = 1 << 20;
    n = wire_encode_request(&qh, buf, sizeof buf);
    k3_error_clear(&e);
    CHECK(wire_decode_request(buf, (size_t)n, 8, &qh2, &e) == -1 && strstr(e.msg, "hint[1]"), "hinted id 2^20: %s", e.msg);

    /* response with its checksum */
    float pay[6] = {1, -2, 3.5f, 0, 1e-30f, -0.0f};
    wire_response s = {42, 3, 4, 1, "", payload_checksum(pay, sizeof pay)}, s2;
    n = wire_encode_response(&s, buf, sizeof buf);
    k3_error_clear(&e);
    CHECK(n > 0 && wire_decode_response(buf, (size_t)n, &s2, &e) == 0 && !memcmp(&s, &s2, sizeof s), "response round trip: %s", e.msg);
    mangle("response", dec_resp, buf, (size_t)n, &s2);
    k3_error_clear(&e);
    CHECK(wire_decode_response("\x80", 1, &s2, &e) == -1 && strstr(e.msg, "'type'"), "empty map: %s", e.msg);
    /* containers claiming more items than there are bytes (msgpack-c would size 100+ GB for them) */
    const char *huge[] = {"\xdd\xff\xff\xff\xff", "\xdf\xff\xff\xff\xff\xa0", "\x81\xa4type\xdd\x7f\xff\xff\xff\x01",
                          "\xde\x00\x03\x01\x02", "\xc1"};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        k3_error_clear(&e);
        size_t hl = i == 2 ? 12 : strlen(huge[i]) ? strlen(huge[i]) : 1;
        CHECK(wire_decode_response(huge[i], hl, &s2, &e) == -1 && strstr(e.msg, "malformed"), "claim %zu: %s", i, e.msg);
    }
}

static void test_checksum(void) {
    unsigned char p[1000];
    for (size_t i = 0; i < sizeof p; i++) p[i] = (unsigned char)(i * 37 + 11);
    uint64_t c = payload_checksum(p, sizeof p);
    CHECK(c == payload_checksum(p, sizeof p), "checksum not deterministic");
    int same = 0;
    for (size_t i = 0; i < sizeof p; i += 13)
        for (int b = 0; b < 8; b++) {
            p[i] ^= (unsigned char)(1 << b);
            same += payload_checksum(p, sizeof p) == c;
            p[i] ^= (unsigned char)(1 << b);
        }
    CHECK(same == 0, "%d one-bit flips keep the checksum", same);
    CHECK(payload_checksum(p, 0) == payload_checksum(p + 1, 0), "empty payloads differ");
    CHECK(payload_checksum(p, 999) != c, "a truncated payload keeps the checksum");
}

static void test_ring(void) {
    ring r, w;
    k3_error e = {0};
    const uint64_t hdr = 512, req = 4096, resp = 8192;
    CHECK(ring_create(&r, 2, hdr, req, resp, &e) == 0, "ring_create: %s", e.msg);
    if (e.set) return;
    /* the worker's view through the inherited descriptor */
    int fd = dup(r.fd);
    CHECK(ring_attach(&w, fd, hdr, req, resp, 2, &e) == 0, "ring_attach: %s", e.msg);
    ring_close(&w);
    k3_error_clear(&e);
    CHECK(ring_attach(&w, dup(r.fd), hdr, req, resp, 3, &e) == -1 && e.set, "3 slots accepted for 2");
    k3_error_clear(&e);
    CHECK(ring_attach(&w, dup(r.fd), hdr, req * 2, resp, 2, &e) == -1 && e.set, "wrong request cap accepted");
    uint64_t magic = r.ctl->magic;
    r.ctl->magic ^= 1; /* another version of the layout */
    k3_error_clear(&e);
    CHECK(ring_attach(&w, dup(r.fd), hdr, req, resp, 2, &e) == -1 && strstr(e.msg, "control page"), "wrong magic: %s", e.msg);
    r.ctl->magic = magic;

    /* slots lie inside the mapping, one per sequence number modulo n_slots */
    for (uint64_t seq = 1; seq < 6; seq++) {
        unsigned char *a = (unsigned char *)ring_req_slot(&r, seq), *b = (unsigned char *)ring_resp_slot(&r, seq);
        unsigned char *pa = ring_slot_payload(&r, (ring_slot_head *)a), *pb = ring_slot_payload(&r, (ring_slot_head *)b);
        CHECK(a > r.base && pa + req <= r.base + r.size && b > r.base && pb + resp <= r.base + r.size,
              "slot %llu outside the mapping", (unsigned long long)seq);
        CHECK(ring_req_slot(&r, seq) == ring_req_slot(&r, seq + 2) && ring_req_slot(&r, seq) != ring_req_slot(&r, seq + 1),
              "slot of seq %llu", (unsigned long long)seq);
        CHECK(ring_slot_hdr((ring_slot_head *)a) + hdr <= pa, "header overlaps the payload");
    }

    /* lengths written by the peer */
    ring_slot_head *s = ring_resp_slot(&r, 7);
    uint64_t hl, pl;
    struct { uint64_t seq, want, h, p; int ok; const char *msg; } cases[] = {
        {7, 7, 100, 400, 1, NULL},
        {7, 7, hdr, resp, 1, NULL},
        {6, 7, 100, 400, 0, "sequence 6, expected 7"},
        {7, 7, 0, 400, 0, "header length 0"},
        {7, 7, hdr + 1, 400, 0, "header length"},
        {7, 7, UINT64_MAX, 400, 0, "header length"},
        {7, 7, 100, resp + 4, 0, "payload length"},
        {7, 7, 100, 402, 0, "payload length 402"},
        {7, 7, 100, UINT64_MAX - 3, 0, "payload length"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        atomic_store(&s->seq, cases[i].seq);
        s->hdr_len = cases[i].h;
        s->payload_len = cases[i].p;
        k3_error_clear(&e);
        int rc = ring_slot_lengths(&r, s, cases[i].want, resp, &hl, &pl, &e);
        if (cases[i].ok) CHECK(rc == 0 && hl == cases[i].h && pl == cases[i].p, "case %zu refused: %s", i, e.msg);
        else CHECK(rc == -1 && strstr(e.msg, cases[i].msg), "case %zu: rc %d '%s'", i, rc, e.msg);
    }
    ring_close(&r);
    CHECK(ring_cleanup_stale() >= 0, "ring_cleanup_stale");
}

int main(void) {
    test_wire();
    test_checksum();
    test_ring();
    return check_report("test_wire_ring");
}
