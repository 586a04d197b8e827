/* fuzz_wire.c - libFuzzer harness for the msgpack decoders of common/wire.c (the bytes an expert
 * server or the coordinator sends). The first byte picks the decoder (hello, ready, request,
 * response); the rest is the message. A decoder must refuse with a message or accept values inside
 * its documented ranges; an accepted message re-encodes and decodes to the same values. */
#include "common/wire.h"
#include <stdlib.h>
#include <string.h>

#define CHECK(c) do { if (!(c)) abort(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int which = data[0] % 4;
    size_t n = size - 1;
    uint8_t *m = malloc(n ? n : 1); /* exactly the message: ASan sees any over-read */
    memcpy(m, data + 1, n);
    static unsigned char out[1 << 17];
    k3_error e = {0};
    switch (which) {
    case 0: {
        wire_hello h, h2;
        if (wire_decode_hello(m, n, &h, &e) == 0) {
            CHECK(h.n_workers >= 1 && h.worker >= 0 && h.worker < h.n_workers && h.n_slots >= 1 && h.n_slots <= 64);
            CHECK(memchr(h.model_dir, 0, sizeof h.model_dir) && memchr(h.simd, 0, sizeof h.simd));
            long k = wire_encode_hello(&h, out, sizeof out);
            CHECK(k > 0 && wire_decode_hello(out, (size_t)k, &h2, &e) == 0 && !memcmp(&h, &h2, sizeof h));
        } else CHECK(e.set);
        break;
    }
    case 1: {
        wire_ready r, r2;
        if (wire_decode_ready(m, n, &r, &e) == 0) {
            CHECK(r.direct_io == 0 || r.direct_io == 1);
            long k = wire_encode_ready(&r, out, sizeof out);
            CHECK(k > 0 && wire_decode_ready(out, (size_t)k, &r2, &e) == 0 && !memcmp(&r, &r2, sizeof r));
        } else CHECK(e.set);
        break;
    }
    case 2: {
        enum { MAXP = 64 };
        int32_t pt[MAXP], pe[MAXP], pt2[MAXP], pe2[MAXP], hi[MAXP], hi2[MAXP];
        wire_request q = {0, 0, 0, 0, 0, pt, pe, 0, 0, hi}, q2 = {0, 0, 0, 0, 0, pt2, pe2, 0, 0, hi2};
        if (wire_decode_request(m, n, MAXP, &q, &e) == 0) {
            CHECK(q.npairs <= MAXP && q.nhint <= wire_hint_max(MAXP) && q.hint_layer >= 0 && q.hint_layer <= (1 << 20));
            for (uint32_t i = 0; i < q.npairs; i++) CHECK(pt[i] >= 0 && (uint32_t)pt[i] < q.ntok && pe[i] >= 0);
            for (uint32_t i = 0; i < q.nhint; i++) CHECK(hi[i] >= 0 && hi[i] < (1 << 20));
            long k = wire_encode_request(&q, out, sizeof out);
            CHECK(k > 0 && wire_decode_request(out, (size_t)k, MAXP, &q2, &e) == 0);
            CHECK(q2.kind == q.kind && q2.id == q.id && q2.npairs == q.npairs);
            /* a shutdown carries no hint; a request keeps its hint */
            CHECK(q.kind != WIRE_REQ_EXPERTS || (q2.nhint == q.nhint && (!q.nhint || q2.hint_layer == q.hint_layer) &&
                                                 !memcmp(hi, hi2, q.nhint * sizeof *hi)));
        } else CHECK(e.set);
        break;
    }
    default: {
        wire_response r, r2;
        if (wire_decode_response(m, n, &r, &e) == 0) {
            CHECK(memchr(r.error, 0, sizeof r.error));
            long k = wire_encode_response(&r, out, sizeof out);
            CHECK(k > 0 && wire_decode_response(out, (size_t)k, &r2, &e) == 0 && !memcmp(&r, &r2, sizeof r));
        } else CHECK(e.set);
    }
    }
    free(m);
    return 0;
}
