/* wire.c - msgpack encoding and validated decoding of control and ring messages. */
#include "common/wire.h"
#include <msgpack.h>
#include <stdio.h>
#include <string.h>

/* ---- encoding: pack into an sbuffer, copy out if it fits ---- */

static void pk_str(msgpack_packer *pk, const char *s) {
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}
static void pk_kv_int(msgpack_packer *pk, const char *k, int64_t v) { pk_str(pk, k); msgpack_pack_int64(pk, v); }
static void pk_kv_u64(msgpack_packer *pk, const char *k, uint64_t v) { pk_str(pk, k); msgpack_pack_uint64(pk, v); }
static void pk_kv_str(msgpack_packer *pk, const char *k, const char *v) { pk_str(pk, k); pk_str(pk, v); }

static long finish(msgpack_sbuffer *sb, void *buf, size_t cap) {
    long n = -1;
    if (sb->size <= cap) { memcpy(buf, sb->data, sb->size); n = (long)sb->size; }
    msgpack_sbuffer_destroy(sb);
    return n;
}

long wire_encode_hello(const wire_hello *h, void *buf, size_t cap) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 18 + (h->n_groups > 0 ? 2 : 0) + (h->preload ? 1 : 0));
    pk_kv_str(&pk, "type", "hello");
    pk_kv_int(&pk, "read_threads", h->read_threads);
    if (h->preload) pk_kv_int(&pk, "preload", h->preload);
    pk_kv_str(&pk, "model_dir", h->model_dir);
    pk_kv_int(&pk, "worker", h->worker);
    pk_kv_int(&pk, "n_workers", h->n_workers);
    if (h->n_groups > 0) { /* behind an MPI expert rank (absent: the one-level map) */
        pk_kv_int(&pk, "group", h->group);
        pk_kv_int(&pk, "n_groups", h->n_groups);
    }
    pk_kv_u64(&pk, "cache_bytes", h->cache_bytes);
    pk_kv_int(&pk, "threads", h->threads);
    pk_kv_int(&pk, "node", h->node);
    pk_kv_u64(&pk, "n_slots", h->n_slots);
    pk_kv_u64(&pk, "hdr_cap", h->hdr_cap);
    pk_kv_u64(&pk, "req_cap", h->req_cap);
    pk_kv_u64(&pk, "resp_cap", h->resp_cap);
    pk_kv_u64(&pk, "max_tokens", h->max_tokens);
    pk_kv_u64(&pk, "max_pairs", h->max_pairs);
    pk_kv_int(&pk, "life", h->life);
    pk_kv_str(&pk, "simd", h->simd);
    pk_kv_str(&pk, "policy", h->policy);
    pk_kv_str(&pk, "ownership", "layer-rotate");
    return finish(&sb, buf, cap);
}

long wire_encode_ready(const wire_ready *r, void *buf, size_t cap) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 7);
    pk_kv_str(&pk, "type", "ready");
    pk_str(&pk, "ok");
    r->ok ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk);
    pk_kv_str(&pk, "error", r->error);
    pk_kv_int(&pk, "experts", r->experts);
    pk_kv_int(&pk, "cache_slots", r->cache_slots);
    pk_kv_int(&pk, "node", r->node);
    pk_kv_int(&pk, "direct_io", r->direct_io);
    return finish(&sb, buf, cap);
}

long wire_encode_request(const wire_request *q, void *buf, size_t cap) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    int hint = q->kind == WIRE_REQ_EXPERTS && q->nhint > 0;
    msgpack_pack_map(&pk, hint ? 8 : 6);
    pk_kv_str(&pk, "type", q->kind == WIRE_REQ_SHUTDOWN ? "shutdown" : "req");
    pk_kv_u64(&pk, "id", q->id);
    pk_kv_int(&pk, "layer", q->layer);
    pk_kv_u64(&pk, "ntok", q->ntok);
    pk_kv_u64(&pk, "npairs", q->npairs);
    pk_str(&pk, "pairs");
    msgpack_pack_array(&pk, 2 * (size_t)q->npairs);
    for (uint32_t i = 0; q->kind == WIRE_REQ_EXPERTS && i < q->npairs; i++) {
        msgpack_pack_int32(&pk, q->pair_token[i]);
        msgpack_pack_int32(&pk, q->pair_expert[i]);
    }
    if (hint) {
        pk_kv_int(&pk, "hint_layer", q->hint_layer);
        pk_str(&pk, "hint");
        msgpack_pack_array(&pk, q->nhint);
        for (uint32_t i = 0; i < q->nhint; i++) msgpack_pack_int32(&pk, q->hint[i]);
    }
    return finish(&sb, buf, cap);
}

long wire_encode_response(const wire_response *r, void *buf, size_t cap) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 7);
    pk_kv_str(&pk, "type", "resp");
    pk_kv_u64(&pk, "id", r->id);
    pk_kv_int(&pk, "layer", r->layer);
    pk_kv_u64(&pk, "npairs", r->npairs);
    pk_str(&pk, "ok");
    r->ok ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk);
    pk_kv_str(&pk, "error", r->error);
    pk_kv_u64(&pk, "checksum", r->checksum);
    return finish(&sb, buf, cap);
}

/* ---- decoding ---- */

typedef struct {
    msgpack_unpacked up;
    const msgpack_object_map *map;
    const char *what;
    k3_error *err;
} reader;

/* Walks the first msgpack object of buf without allocating and checks that no container claims
 * more items than there are bytes left (each item takes at least one byte). msgpack-c sizes its
 * object arrays from the claimed counts BEFORE reading them, so a 10-byte message claiming 2^32
 * items would make it ask for 100+ GB (found by tests/fuzz/fuzz_wire.c). 0 if sane, -1 if not. */
static int mp_bounded(const unsigned char *p, size_t len) {
    size_t at = 0;
    uint64_t pending = 1; /* items still to read */
    while (pending) {
        if (at >= len || pending > len - at) return -1;
        unsigned b = p[at++];
        pending--;
        uint64_t skip = 0, count = 0;
        int nlen = 0; /* bytes of a big-endian length that follows */
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) skip = 0;
        else if (b <= 0x8f) count = 2 * (uint64_t)(b & 0x0f);
        else if (b <= 0x9f) count = b & 0x0f;
        else if (b <= 0xbf) skip = b & 0x1f;
        else switch (b) {
            case 0xc4: case 0xd9: nlen = 1; break;             /* bin8, str8 */
            case 0xc5: case 0xda: nlen = 2; break;             /* bin16, str16 */
            case 0xc6: case 0xdb: nlen = 4; break;             /* bin32, str32 */
            case 0xc7: nlen = 1; skip = 1; break;              /* ext8: length, type */
            case 0xc8: nlen = 2; skip = 1; break;
            case 0xc9: nlen = 4; skip = 1; break;
            case 0xca: skip = 4; break;
            case 0xcb: skip = 8; break;
            case 0xcc: case 0xd0: skip = 1; break;
            case 0xcd: case 0xd1: skip = 2; break;
            case 0xce: case 0xd2: skip = 4; break;
            case 0xcf: case 0xd3: skip = 8; break;
            case 0xd4: skip = 2; break;                        /* fixext 1, 2, 4, 8, 16 (+ type) */
            case 0xd5: skip = 3; break;
            case 0xd6: skip = 5; break;
            case 0xd7: skip = 9; break;
            case 0xd8: skip = 17; break;
            case 0xdc: case 0xde: nlen = 2; break;             /* array16, map16 */
            case 0xdd: case 0xdf: nlen = 4; break;             /* array32, map32 */
            default: return -1;                                /* 0xc1: never used */
            }
        uint64_t n = 0;
        if (nlen) {
            if (len - at < (size_t)nlen) return -1;
            for (int i = 0; i < nlen; i++) n = n << 8 | p[at++];
            if (b == 0xdc || b == 0xdd) count = n;
            else if (b == 0xde || b == 0xdf) count = 2 * n;
            else skip += n;
        }
        if (skip > len - at) return -1;
        at += (size_t)skip;
        pending += count;
    }
    return 0;
}

static int rd_open(reader *rd, const void *buf, size_t len, const char *what, k3_error *err) {
    rd->what = what;
    rd->err = err;
    if (mp_bounded(buf, len)) return k3_fail(err, "%s: not a msgpack map (malformed or truncated)", what);
    msgpack_unpacked_init(&rd->up);
    size_t off = 0;
    if (msgpack_unpack_next(&rd->up, buf, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len ||
        rd->up.data.type != MSGPACK_OBJECT_MAP) {
        msgpack_unpacked_destroy(&rd->up);
        return k3_fail(err, "%s: not a msgpack map", what);
    }
    rd->map = &rd->up.data.via.map;
    return 0;
}

static const msgpack_object *rd_get(reader *rd, const char *key) {
    size_t kl = strlen(key);
    for (uint32_t i = 0; i < rd->map->size; i++) {
        const msgpack_object *k = &rd->map->ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == kl && memcmp(k->via.str.ptr, key, kl) == 0)
            return &rd->map->ptr[i].val;
    }
    return NULL;
}

static int rd_i64(reader *rd, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    const msgpack_object *o = rd_get(rd, key);
    int64_t v;
    if (!o) return k3_fail(rd->err, "%s: field '%s' missing", rd->what, key);
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX) v = (int64_t)o->via.u64;
    else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) v = o->via.i64;
    else return k3_fail(rd->err, "%s: field '%s' is not an integer", rd->what, key);
    if (v < lo || v > hi) return k3_fail(rd->err, "%s: field '%s' = %lld out of range", rd->what, key, (long long)v);
    *out = v;
    return 0;
}

static int rd_u64(reader *rd, const char *key, uint64_t *out) {
    const msgpack_object *o = rd_get(rd, key);
    if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) return k3_fail(rd->err, "%s: field '%s' missing or not unsigned", rd->what, key);
    *out = o->via.u64;
    return 0;
}

static int rd_str(reader *rd, const char *key, char *out, size_t cap) {
    const msgpack_object *o = rd_get(rd, key);
    if (!o || o->type != MSGPACK_OBJECT_STR) return k3_fail(rd->err, "%s: field '%s' missing or not a string", rd->what, key);
    if (o->via.str.size >= cap) return k3_fail(rd->err, "%s: field '%s' too long", rd->what, key);
    memcpy(out, o->via.str.ptr, o->via.str.size);
    out[o->via.str.size] = 0;
    return 0;
}

static int rd_bool(reader *rd, const char *key, int *out) {
    const msgpack_object *o = rd_get(rd, key);
    if (!o || o->type != MSGPACK_OBJECT_BOOLEAN) return k3_fail(rd->err, "%s: field '%s' missing or not a boolean", rd->what, key);
    *out = o->via.boolean;
    return 0;
}

static int rd_type(reader *rd, const char *want) {
    char t[32];
    if (rd_str(rd, "type", t, sizeof t)) return -1;
    if (strcmp(t, want)) return k3_fail(rd->err, "%s: type '%s', expected '%s'", rd->what, t, want);
    return 0;
}

#define I64(rd, key, lo, hi, dst) (rd_i64(rd, key, lo, hi, &tmp) ? -1 : ((dst) = tmp, 0))

int wire_decode_hello(const void *buf, size_t len, wire_hello *h, k3_error *err) {
    reader rd;
    if (rd_open(&rd, buf, len, "hello", err)) return -1;
    memset(h, 0, sizeof *h);
    int64_t tmp;
    char own[32];
    int rc = (rd_type(&rd, "hello") || rd_str(&rd, "model_dir", h->model_dir, sizeof h->model_dir) ||
              I64(&rd, "n_workers", 1, 4096, h->n_workers) || I64(&rd, "worker", 0, h->n_workers - 1, h->worker) ||
              rd_u64(&rd, "cache_bytes", &h->cache_bytes) || I64(&rd, "threads", 1, 4096, h->threads) ||
              I64(&rd, "node", -1, 4095, h->node) || I64(&rd, "n_slots", 1, 64, h->n_slots) ||
              rd_u64(&rd, "hdr_cap", &h->hdr_cap) || rd_u64(&rd, "req_cap", &h->req_cap) ||
              rd_u64(&rd, "resp_cap", &h->resp_cap) || I64(&rd, "max_tokens", 1, 1 << 20, h->max_tokens) ||
              I64(&rd, "max_pairs", 1, 1 << 26, h->max_pairs) || I64(&rd, "life", 0, 1 << 20, h->life) ||
              rd_str(&rd, "simd", h->simd, sizeof h->simd) || rd_str(&rd, "policy", h->policy, sizeof h->policy) ||
              rd_str(&rd, "ownership", own, sizeof own) || I64(&rd, "read_threads", 0, 256, h->read_threads))
                 ? -1 : 0;
    if (!rc && strcmp(own, "layer-rotate")) rc = k3_fail(err, "hello: unknown ownership scheme '%s'", own);
    /* group / n_groups: optional (absent: 0, the one-level map) */
    if (!rc && (rd_get(&rd, "n_groups") || rd_get(&rd, "group")))
        rc = I64(&rd, "n_groups", 1, 4096, h->n_groups) || I64(&rd, "group", 0, h->n_groups - 1, h->group) ? -1 : 0;
    if (!rc && rd_get(&rd, "preload")) rc = I64(&rd, "preload", 0, 1, h->preload) ? -1 : 0; /* optional: absent 0 */
    msgpack_unpacked_destroy(&rd.up);
    return rc;
}

int wire_decode_ready(const void *buf, size_t len, wire_ready *r, k3_error *err) {
    reader rd;
    if (rd_open(&rd, buf, len, "ready", err)) return -1;
    memset(r, 0, sizeof *r);
    int64_t tmp;
    int rc = (rd_type(&rd, "ready") || rd_bool(&rd, "ok", &r->ok) || rd_str(&rd, "error", r->error, sizeof r->error) ||
              I64(&rd, "experts", 0, INT32_MAX, r->experts) || I64(&rd, "cache_slots", 0, INT32_MAX, r->cache_slots) ||
              I64(&rd, "node", -1, 4095, r->node) || I64(&rd, "direct_io", 0, 1, r->direct_io))
                 ? -1 : 0;
    msgpack_unpacked_destroy(&rd.up);
    return rc;
}

int wire_decode_request(const void *buf, size_t len, uint32_t max_pairs, wire_request *q, k3_error *err) {
    reader rd;
    if (rd_open(&rd, buf, len, "request", err)) return -1;
    int32_t *pt = q->pair_token, *pe = q->pair_expert, *hi = q->hint;
    memset(q, 0, sizeof *q);
    q->pair_token = pt;
    q->pair_expert = pe;
    q->hint = hi;
    int64_t tmp;
    char type[32];
    int rc = -1;
    if (rd_str(&rd, "type", type, sizeof type)) goto out;
    if (!strcmp(type, "shutdown")) q->kind = WIRE_REQ_SHUTDOWN;
    else if (!strcmp(type, "req")) q->kind = WIRE_REQ_EXPERTS;
    else { k3_fail(err, "request: unknown type '%s'", type); goto out; }
    if (rd_u64(&rd, "id", &q->id) || I64(&rd, "layer", 0, 1 << 20, q->layer) || I64(&rd, "ntok", 0, 1 << 20, q->ntok) ||
        I64(&rd, "npairs", 0, max_pairs, q->npairs))
        goto out;
    const msgpack_object *p = rd_get(&rd, "pairs");
    if (!p || p->type != MSGPACK_OBJECT_ARRAY || p->via.array.size != 2 * q->npairs) {
        k3_fail(err, "request: 'pairs' must be an array of 2*npairs integers");
        goto out;
    }
    for (uint32_t i = 0; i < 2 * q->npairs; i++) {
        const msgpack_object *o = &p->via.array.ptr[i];
        if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > INT32_MAX) {
            k3_fail(err, "request: pairs[%u] is not a non-negative int32", i);
            goto out;
        }
        if (i % 2 == 0) {
            if (o->via.u64 >= q->ntok) { k3_fail(err, "request: pair %u names token %llu of %u", i / 2, (unsigned long long)o->via.u64, q->ntok); goto out; }
            pt[i / 2] = (int32_t)o->via.u64;
        } else pe[i / 2] = (int32_t)o->via.u64;
    }
    /* hint_layer / hint: optional, both or neither */
    const msgpack_object *h = rd_get(&rd, "hint");
    if (h || rd_get(&rd, "hint_layer")) {
        if (!h || I64(&rd, "hint_layer", 0, 1 << 20, q->hint_layer)) {
            if (!h) k3_fail(err, "request: 'hint_layer' without 'hint'");
            goto out;
        }
        if (h->type != MSGPACK_OBJECT_ARRAY || h->via.array.size > wire_hint_max(max_pairs) || !hi) {
            k3_fail(err, "request: 'hint' must be an array of at most %u expert ids", wire_hint_max(max_pairs));
            goto out;
        }
        for (uint32_t i = 0; i < h->via.array.size; i++) {
            const msgpack_object *o = &h->via.array.ptr[i];
            if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 >= (1u << 20)) {
                k3_fail(err, "request: hint[%u] is not an expert id", i);
                goto out;
            }
            hi[i] = (int32_t)o->via.u64;
        }
        q->nhint = h->via.array.size;
    }
    rc = 0;
out:
    msgpack_unpacked_destroy(&rd.up);
    return rc;
}

int wire_decode_response(const void *buf, size_t len, wire_response *r, k3_error *err) {
    reader rd;
    if (rd_open(&rd, buf, len, "response", err)) return -1;
    memset(r, 0, sizeof *r);
    int64_t tmp;
    int rc = (rd_type(&rd, "resp") || rd_u64(&rd, "id", &r->id) || I64(&rd, "layer", 0, 1 << 20, r->layer) ||
              I64(&rd, "npairs", 0, 1 << 26, r->npairs) || rd_bool(&rd, "ok", &r->ok) ||
              rd_str(&rd, "error", r->error, sizeof r->error) || rd_u64(&rd, "checksum", &r->checksum))
                 ? -1 : 0;
    msgpack_unpacked_destroy(&rd.up);
    return rc;
}
