/* fuzz_ring.c - libFuzzer harness for what a ring slot carries (common/ring.c + wire.c): the
 * input is a slot as the peer could write it (sequence, header length, payload length, header
 * bytes, payload bytes). ring_slot_lengths must refuse or return lengths inside this side's
 * capacities; the header is then decoded as a response within hdr_len and the payload checksummed
 * within payload_len. Every access stays inside the mapping (a SEGV or an ASan report fails). */
#include "common/ring.h"
#include "common/wire.h"
#include <stdlib.h>
#include <string.h>

#define CHECK(c) do { if (!(c)) abort(); } while (0)

static uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static ring r;
    static int made;
    enum { HDR = 256, REQ = 1024, RESP = 2048 };
    if (!made) {
        k3_error e = {0};
        if (ring_create(&r, 2, HDR, REQ, RESP, &e)) abort();
        made = 1;
    }
    if (size < 25) return 0;
    uint64_t seq = rd64(data), hl0 = rd64(data + 8), pl0 = rd64(data + 16);
    int resp = data[24] & 1;
    ring_slot_head *s = resp ? ring_resp_slot(&r, seq) : ring_req_slot(&r, seq);
    uint64_t cap = resp ? RESP : REQ;
    atomic_store(&s->seq, seq);
    s->hdr_len = hl0;
    s->payload_len = pl0;
    size_t rest = size - 25, hcopy = rest < HDR ? rest : HDR;
    memcpy(ring_slot_hdr(s), data + 25, hcopy);
    size_t pcopy = rest - hcopy < cap ? rest - hcopy : cap;
    memcpy(ring_slot_payload(&r, s), data + 25 + hcopy, pcopy);
    uint64_t hl, pl;
    k3_error e = {0};
    uint64_t want = data[24] & 2 ? seq : seq + 1;
    if (ring_slot_lengths(&r, s, want, cap, &hl, &pl, &e) == 0) {
        CHECK(want == seq && hl >= 1 && hl <= HDR && pl <= cap && pl % 4 == 0);
        uint8_t *h = malloc(hl); /* the header copied out, as the readers do */
        memcpy(h, ring_slot_hdr(s), hl);
        wire_response w;
        k3_error we = {0};
        CHECK(wire_decode_response(h, hl, &w, &we) == 0 || we.set);
        free(h);
        (void)payload_checksum(ring_slot_payload(&r, s), pl);
    } else CHECK(e.set);
    return 0;
}
