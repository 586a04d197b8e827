/* Job: the Kimi tokenizer (see tokenizer.h for the contract, docs/TOKENIZER.md for the design):
 * loading tiktoken.model + tokenizer_config.json, the Kimi wrapper's chunking, special-token cuts,
 * the hand-written Kimi pre-tokenisation split over the generated Unicode 16.0 class table
 * (unicode_classes.c; a port of shared/tools/tokenizer-oracle/refsplit.mjs), tiktoken rank BPE,
 * decoding, and the UTF-8 helpers (validation, streaming by complete code points). */
#include "coordinator/tokenizer.h"
#include "common/file_read.h"
#include "coordinator/unicode_classes.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RANK_NONE UINT32_MAX
#define MAX_SPECIAL 1024
#define BPE_LINEAR_MAX 128 /* pieces up to this many bytes use the quadratic scan */

/* ------------------------------------------------------------------ errors */

/* ------------------------------------------------------------------ UTF-8 */

/* Length of the well-formed sequence starting at s[i], or 0 if ill-formed (Unicode table 3-7). */
static inline size_t utf8_seq_len(const unsigned char *s, size_t i, size_t len)
{
    unsigned c = s[i];
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return (i + 1 < len && (s[i + 1] & 0xC0) == 0x80) ? 2 : 0;
    if (c < 0xF0) {
        if (i + 2 >= len) return 0;
        unsigned c1 = s[i + 1];
        unsigned lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        if (c1 < lo || c1 > hi || (s[i + 2] & 0xC0) != 0x80) return 0;
        return 3;
    }
    if (c < 0xF5) {
        if (i + 3 >= len) return 0;
        unsigned c1 = s[i + 1];
        unsigned lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        if (c1 < lo || c1 > hi || (s[i + 2] & 0xC0) != 0x80 || (s[i + 3] & 0xC0) != 0x80) return 0;
        return 4;
    }
    return 0;
}

size_t utf8_valid_prefix(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        /* ASCII fast path, 8 bytes at a time */
        while (i + 8 <= len) {
            uint64_t v;
            memcpy(&v, s + i, 8);
            if (v & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= len) break;
        size_t l = utf8_seq_len(s, i, len);
        if (l == 0) return i;
        i += l;
    }
    return len;
}

/* Decodes the (known well-formed) sequence at s. */
static inline uint32_t utf8_decode(const unsigned char *s, size_t *l)
{
    unsigned c = s[0];
    if (c < 0x80) { *l = 1; return c; }
    if (c < 0xE0) { *l = 2; return ((c & 0x1Fu) << 6) | (s[1] & 0x3Fu); }
    if (c < 0xF0) { *l = 3; return ((c & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu); }
    *l = 4;
    return ((c & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
}

void utf8_stream_init(utf8_stream *s, int replace_invalid)
{
    memset(s, 0, sizeof *s);
    s->replace_invalid = replace_invalid;
}

/* Writes the held bytes as an ill-formed subpart. */
static size_t stream_bad(utf8_stream *s, const unsigned char *bytes, unsigned n, char *out)
{
    s->npend = 0;
    s->need = 0;
    if (s->replace_invalid) {
        memcpy(out, "\xEF\xBF\xBD", 3);
        return 3;
    }
    memcpy(out, bytes, n);
    return n;
}

size_t utf8_stream_push(utf8_stream *s, const void *in, size_t len, char *out)
{
    const unsigned char *p = in;
    size_t w = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned b = p[i];
        if (s->npend) {
            unsigned lead = s->pend[0], lo = 0x80, hi = 0xBF;
            if (s->npend == 1) {
                if (lead == 0xE0) lo = 0xA0;
                else if (lead == 0xED) hi = 0x9F;
                else if (lead == 0xF0) lo = 0x90;
                else if (lead == 0xF4) hi = 0x8F;
            }
            if (b >= lo && b <= hi) {
                s->pend[s->npend++] = (unsigned char)b;
                if (s->npend == s->need) {
                    memcpy(out + w, s->pend, s->npend);
                    w += s->npend;
                    s->npend = 0;
                    s->need = 0;
                }
                continue;
            }
            unsigned char held[4];
            unsigned nh = s->npend;
            memcpy(held, s->pend, nh);
            w += stream_bad(s, held, nh, out + w);
            /* fall through: b starts afresh */
        }
        if (b < 0x80) {
            out[w++] = (char)b;
        } else if (b >= 0xC2 && b <= 0xF4) {
            s->pend[0] = (unsigned char)b;
            s->npend = 1;
            s->need = b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
        } else {
            unsigned char one = (unsigned char)b;
            w += stream_bad(s, &one, 1, out + w);
        }
    }
    return w;
}

size_t utf8_stream_flush(utf8_stream *s, char *out)
{
    if (!s->npend) return 0;
    unsigned char held[4];
    unsigned nh = s->npend;
    memcpy(held, s->pend, nh);
    return stream_bad(s, held, nh, out);
}

void utf8_stream_write_token(utf8_stream *s, const tokenizer *tok, int32_t id, FILE *out)
{
    const char *b;
    size_t len;
    if (tokenizer_token_bytes(tok, id, &b, &len) != 0) return;
    char buf[UTF8_STREAM_MAX_OUT(256)];
    while (len > 0) {
        size_t n = len < 256 ? len : 256;
        fwrite(buf, 1, utf8_stream_push(s, b, n, buf), out);
        b += n;
        len -= n;
    }
    fflush(out);
}

void utf8_stream_write_end(utf8_stream *s, FILE *out)
{
    char buf[UTF8_STREAM_MAX_OUT(0)];
    fwrite(buf, 1, utf8_stream_flush(s, buf), out);
    fflush(out);
}

/* ------------------------------------------------------------------ hash table */

/* Open addressing, linear probing. A slot holds the first 8 bytes of the key, so tokens of up to 8
 * bytes (nearly every BPE pair lookup) are matched without touching the token blob. */
typedef struct {
    uint64_t k8;  /* first min(len, 8) key bytes, zero padded */
    uint32_t id1; /* id + 1; 0 = empty */
    uint32_t meta; /* (hash tag << 8) | min(len, 255) */
} hslot;

typedef struct {
    hslot *slots;
    size_t mask;
} htab;

struct tokenizer {
    size_t n_base, n_special, n_total;
    char *blob;       /* all token bytes, base then special */
    uint32_t *off;    /* per id */
    uint32_t *len;    /* per id */
    htab ranks;       /* base tokens */
    htab specials;    /* special texts */
    int32_t *pair2;   /* rank of every 2-byte string (or -1), indexed by b0 << 8 | b1 */
    uint8_t special_first[32];    /* bitmap of first bytes of special texts */
    size_t special_lens[MAX_SPECIAL]; /* distinct special text lengths, descending */
    size_t n_special_lens;
    size_t blob_base; /* bytes of base tokens in blob */
};

static inline uint64_t load_k8(const unsigned char *p, size_t n)
{
    uint64_t v = 0;
    memcpy(&v, p, n < 8 ? n : 8);
    return v;
}

static inline uint64_t hash_bytes(const unsigned char *p, size_t n, uint64_t k8)
{
    uint64_t h = (k8 ^ ((uint64_t)n * 0xD6E8FEB86659FD93ull)) * 0x9E3779B97F4A7C15ull;
    for (size_t i = 8; i < n; i += 8) {
        size_t l = n - i < 8 ? n - i : 8;
        uint64_t v = 0;
        memcpy(&v, p + i, l);
        h = (h ^ (h >> 29) ^ v) * 0xFF51AFD7ED558CCDull;
    }
    h ^= h >> 32;
    h *= 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    return h;
}

static int htab_init(htab *h, size_t n)
{
    size_t cap = 16;
    while (cap < n + n / 4 + 16) cap <<= 1;
    h->slots = calloc(cap, sizeof *h->slots);
    if (!h->slots) return -1;
    h->mask = cap - 1;
    return 0;
}

static inline uint32_t slot_meta(uint64_t hv, size_t n)
{
    return ((uint32_t)(hv >> 32) & 0xFFFFFF00u) | (uint32_t)(n < 255 ? n : 255);
}

static inline int32_t htab_get(const tokenizer *t, const htab *h, const unsigned char *p, size_t n)
{
    uint64_t k8 = load_k8(p, n), hv = hash_bytes(p, n, k8);
    uint32_t meta = slot_meta(hv, n);
    size_t i = (size_t)hv & h->mask;
    for (;;) {
        const hslot *s = &h->slots[i];
        if (!s->id1) return -1;
        if (s->meta == meta && s->k8 == k8) {
            uint32_t id = s->id1 - 1;
            if (n <= 8) return (int32_t)id;
            if (t->len[id] == n && memcmp(t->blob + t->off[id] + 8, p + 8, n - 8) == 0) return (int32_t)id;
        }
        i = (i + 1) & h->mask;
    }
}

/* Inserts id (whose bytes are already in blob); returns the id already holding the same bytes, or -1. */
static int32_t htab_put(tokenizer *t, htab *h, uint32_t id)
{
    const unsigned char *p = (const unsigned char *)t->blob + t->off[id];
    size_t n = t->len[id];
    int32_t old = htab_get(t, h, p, n);
    if (old >= 0) return old;
    uint64_t k8 = load_k8(p, n), hv = hash_bytes(p, n, k8);
    size_t i = (size_t)hv & h->mask;
    while (h->slots[i].id1) i = (i + 1) & h->mask;
    h->slots[i] = (hslot){ k8, id + 1, slot_meta(hv, n) };
    return -1;
}

/* ------------------------------------------------------------------ loading */

static char *read_file(const char *path, size_t *len, k3_error *err)
{
    k3_error e = {0};
    char *buf = file_read_all(path, (size_t)1 << 31, len, &e);
    if (!buf) k3_refuse(err, "%s", e.msg);
    return buf;
}

static int b64val(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Strict standard base64 (length a multiple of 4, '=' padding only at the end). Returns the decoded
 * length or -1. out needs 3 * n / 4 bytes. */
static long b64_decode(const char *in, size_t n, unsigned char *out)
{
    if (n == 0 || n % 4) return -1;
    size_t pad = 0;
    if (in[n - 1] == '=') pad++;
    if (in[n - 2] == '=') pad++;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int k = 0; k < 4; k++) {
            unsigned char c = (unsigned char)in[i + (size_t)k];
            if (c == '=' && i + 4 == n && (size_t)k >= 4 - pad) v[k] = 0;
            else if ((v[k] = b64val(c)) < 0) return -1;
        }
        uint32_t w = ((uint32_t)v[0] << 18) | ((uint32_t)v[1] << 12) | ((uint32_t)v[2] << 6) | (uint32_t)v[3];
        out[o++] = (unsigned char)(w >> 16);
        if (i + 4 < n || pad < 2) out[o++] = (unsigned char)(w >> 8);
        if (i + 4 < n || pad < 1) out[o++] = (unsigned char)w;
    }
    return (long)o;
}

static int is_blank_line(const char *p, const char *e)
{
    for (; p < e; p++)
        if (*p != ' ' && *p != '\t' && *p != '\r') return 0;
    return 1;
}

static int load_ranks(tokenizer *t, const char *path, k3_error *err)
{
    size_t flen;
    char *data = read_file(path, &flen, err);
    if (!data) return -1;
    int rc = -1;
    size_t nlines = 0;
    for (const char *p = data, *end = data + flen; p < end;) {
        const char *e = memchr(p, '\n', (size_t)(end - p));
        if (!e) e = end;
        if (!is_blank_line(p, e)) nlines++;
        p = e + 1;
    }
    if (nlines == 0) {
        k3_refuse(err, "%s: no tokens", path);
        goto out;
    }
    if (nlines > (size_t)INT32_MAX - 2 * MAX_SPECIAL || flen >= UINT32_MAX / 2) {
        k3_refuse(err, "%s: too large", path);
        goto out;
    }
    t->n_base = nlines;
    /* room for the specials too; their count is known only later, so allocate the maximum */
    t->off = malloc((nlines + MAX_SPECIAL) * sizeof *t->off);
    t->len = malloc((nlines + MAX_SPECIAL) * sizeof *t->len);
    t->blob = malloc(flen + 1);
    unsigned char *seen = calloc(nlines, 1);
    if (!t->off || !t->len || !t->blob || !seen || htab_init(&t->ranks, nlines)) {
        free(seen);
        k3_nomem(err, "%s: out of memory", path);
        goto out;
    }
    size_t blob_n = 0, lineno = 0;
    for (const char *p = data, *end = data + flen; p < end;) {
        const char *e = memchr(p, '\n', (size_t)(end - p));
        if (!e) e = end;
        lineno++;
        const char *line = p;
        p = e + 1;
        if (is_blank_line(line, e)) continue;
        while (e > line && (e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t')) e--;
        const char *sp = line;
        while (sp < e && *sp != ' ' && *sp != '\t') sp++;
        const char *r = sp;
        while (r < e && (*r == ' ' || *r == '\t')) r++;
        if (sp == line || r == e || r == sp) {
            k3_refuse(err, "%s:%zu: corrupt line (expected \"base64 rank\")", path, lineno);
            free(seen);
            goto out;
        }
        uint64_t rank = 0;
        for (const char *q = r; q < e; q++) {
            if (*q < '0' || *q > '9' || rank > (uint64_t)INT32_MAX) {
                k3_refuse(err, "%s:%zu: corrupt line (bad rank \"%.*s\")", path, lineno,
                        (int)(e - r > 40 ? 40 : e - r), r);
                free(seen);
                goto out;
            }
            rank = rank * 10 + (uint64_t)(*q - '0');
        }
        if (rank >= nlines) {
            k3_refuse(err, "%s:%zu: rank %llu out of range (ranks must be 0..%zu, one per line)",
                    path, lineno, (unsigned long long)rank, nlines - 1);
            free(seen);
            goto out;
        }
        if (seen[rank]) {
            k3_refuse(err, "%s:%zu: duplicate rank %llu", path, lineno, (unsigned long long)rank);
            free(seen);
            goto out;
        }
        long bl = b64_decode(line, (size_t)(sp - line), (unsigned char *)t->blob + blob_n);
        if (bl < 0) {
            k3_refuse(err, "%s:%zu: bad base64 \"%.*s\"", path, lineno,
                    (int)(sp - line > 40 ? 40 : sp - line), line);
            free(seen);
            goto out;
        }
        if (bl == 0) {
            k3_refuse(err, "%s:%zu: empty token", path, lineno);
            free(seen);
            goto out;
        }
        seen[rank] = 1;
        t->off[rank] = (uint32_t)blob_n;
        t->len[rank] = (uint32_t)bl;
        blob_n += (size_t)bl;
        int32_t dup = htab_put(t, &t->ranks, (uint32_t)rank);
        if (dup >= 0) {
            k3_refuse(err, "%s:%zu: duplicate token (same bytes as rank %d)", path, lineno, dup);
            free(seen);
            goto out;
        }
    }
    free(seen);
    t->blob_base = blob_n;
    if (!(t->pair2 = malloc(65536 * sizeof *t->pair2))) {
        k3_nomem(err, "%s: out of memory", path);
        goto out;
    }
    for (unsigned k = 0; k < 65536; k++) {
        unsigned char two[2] = { (unsigned char)(k >> 8), (unsigned char)k };
        t->pair2[k] = htab_get(t, &t->ranks, two, 2);
    }
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        if (htab_get(t, &t->ranks, &c, 1) < 0) {
            k3_refuse(err, "%s: byte 0x%02X is not a token (every single byte must be)", path, b);
            goto out;
        }
    }
    rc = 0;
out:
    free(data);
    return rc;
}

static int load_config(tokenizer *t, const char *path, k3_error *err)
{
    size_t flen;
    char *data = read_file(path, &flen, err);
    if (!data) return -1;
    json_error_t je;
    json_t *root = json_loadb(data, flen, 0, &je);
    free(data);
    if (!root) {
        k3_refuse(err, "%s:%d:%d: %s", path, je.line, je.column, je.text);
        return -1;
    }
    int rc = -1;
    char *names[MAX_SPECIAL] = {0};
    size_t name_len[MAX_SPECIAL] = {0};
    size_t n_special = 256;
    json_t *atd = json_is_object(root) ? json_object_get(root, "added_tokens_decoder") : NULL;
    if (!json_is_object(atd)) {
        k3_refuse(err, "%s: no \"added_tokens_decoder\" object", path);
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(atd, key, val) {
        char *endp;
        errno = 0;
        long long id = strtoll(key, &endp, 10);
        if (!*key || *endp || errno) {
            k3_refuse(err, "%s: added_tokens_decoder key \"%s\" is not an id", path, key);
            goto out;
        }
        if (id < (long long)t->n_base || id >= (long long)(t->n_base + MAX_SPECIAL)) {
            k3_refuse(err,
                    "%s: added token id %lld outside the special range %zu..%zu (tiktoken.model has %zu ranks)",
                    path, id, t->n_base, t->n_base + MAX_SPECIAL - 1, t->n_base);
            goto out;
        }
        json_t *content = json_is_object(val) ? json_object_get(val, "content") : NULL;
        if (!json_is_string(content) || json_string_length(content) == 0 ||
            strlen(json_string_value(content)) != json_string_length(content)) {
            k3_refuse(err, "%s: added token %lld has no usable \"content\" string", path, id);
            goto out;
        }
        size_t k = (size_t)(id - (long long)t->n_base);
        free(names[k]);
        names[k] = strdup(json_string_value(content));
        if (!names[k]) {
            k3_nomem(err, "%s: out of memory", path);
            goto out;
        }
        name_len[k] = strlen(names[k]);
        if (k + 1 > n_special) n_special = k + 1;
    }
    size_t total = 0;
    for (size_t k = 0; k < n_special; k++) {
        if (!names[k]) {
            char buf[64];
            int l = snprintf(buf, sizeof buf, "<|reserved_token_%zu|>", t->n_base + k);
            names[k] = strdup(buf);
            if (!names[k]) {
                k3_nomem(err, "%s: out of memory", path);
                goto out;
            }
            name_len[k] = (size_t)l;
        }
        total += name_len[k];
    }
    size_t blob_n = t->blob_base;
    char *nb = realloc(t->blob, blob_n + total + 1);
    if (!nb || htab_init(&t->specials, n_special)) {
        if (nb) t->blob = nb;
        k3_nomem(err, "%s: out of memory", path);
        goto out;
    }
    t->blob = nb;
    t->n_special = n_special;
    t->n_total = t->n_base + n_special;
    for (size_t k = 0; k < n_special; k++) {
        size_t id = t->n_base + k;
        memcpy(t->blob + blob_n, names[k], name_len[k]);
        t->off[id] = (uint32_t)blob_n;
        t->len[id] = (uint32_t)name_len[k];
        blob_n += name_len[k];
        int32_t dup = htab_put(t, &t->specials, (uint32_t)id);
        if (dup >= 0) {
            k3_refuse(err, "%s: special tokens %d and %zu have the same text \"%s\"", path, dup, id,
                    names[k]);
            goto out;
        }
        unsigned char fb = (unsigned char)names[k][0];
        t->special_first[fb >> 3] |= (uint8_t)(1u << (fb & 7));
        size_t j = 0;
        while (j < t->n_special_lens && t->special_lens[j] > name_len[k]) j++;
        if (j == t->n_special_lens || t->special_lens[j] != name_len[k]) {
            memmove(t->special_lens + j + 1, t->special_lens + j, (t->n_special_lens - j) * sizeof(size_t));
            t->special_lens[j] = name_len[k];
            t->n_special_lens++;
        }
    }
    rc = 0;
out:
    for (size_t k = 0; k < MAX_SPECIAL; k++) free(names[k]);
    json_decref(root);
    return rc;
}

tokenizer *tokenizer_load(const char *dir, k3_error *err)
{
    if (!dir) {
        k3_refuse(err, "tokenizer: no directory given");
        return NULL;
    }
    tokenizer *t = calloc(1, sizeof *t);
    size_t plen = strlen(dir) + 64;
    char *path = malloc(plen);
    if (!t || !path) {
        free(t);
        free(path);
        k3_nomem(err, "tokenizer: out of memory");
        return NULL;
    }
    snprintf(path, plen, "%s/tiktoken.model", dir);
    if (load_ranks(t, path, err)) goto fail;
    snprintf(path, plen, "%s/tokenizer_config.json", dir);
    if (load_config(t, path, err)) goto fail;
    free(path);
    return t;
fail:
    free(path);
    tokenizer_free(t);
    return NULL;
}

void tokenizer_free(tokenizer *t)
{
    if (!t) return;
    free(t->blob);
    free(t->off);
    free(t->len);
    free(t->ranks.slots);
    free(t->pair2);
    free(t->specials.slots);
    free(t);
}

size_t tokenizer_vocab_size(const tokenizer *t) { return t->n_total; }
size_t tokenizer_n_base(const tokenizer *t) { return t->n_base; }
size_t tokenizer_n_special(const tokenizer *t) { return t->n_special; }

int tokenizer_special_id(const tokenizer *t, const char *content)
{
    if (!content) return -1;
    return htab_get(t, &t->specials, (const unsigned char *)content, strlen(content));
}

int tokenizer_is_special(const tokenizer *t, int32_t id)
{
    return id >= 0 && (size_t)id >= t->n_base && (size_t)id < t->n_total;
}

int tokenizer_token_bytes(const tokenizer *t, int32_t id, const char **bytes, size_t *len)
{
    if (id < 0 || (size_t)id >= t->n_total) return -1;
    *bytes = t->blob + t->off[id];
    *len = t->len[id];
    return 0;
}

/* ------------------------------------------------------------------ encoding state */

typedef struct {
    uint64_t key; /* (rank << 32) | start */
    uint32_t end;
} heap_ent;

typedef struct {
    const tokenizer *t;
    int32_t *ids;
    size_t n, cap;
    /* BPE scratch */
    uint32_t *pstart, *prank; /* linear: parts */
    uint32_t *nxt, *prv;      /* heap: linked parts */
    heap_ent *heap;
    size_t scratch_cap, heap_cap;
} enc_ctx;

static void enc_free(enc_ctx *c)
{
    free(c->pstart);
    free(c->prank);
    free(c->nxt);
    free(c->prv);
    free(c->heap);
}

static inline int emit(enc_ctx *c, int32_t id)
{
    if (c->n == c->cap) {
        size_t nc = c->cap ? 2 * c->cap : 256;
        int32_t *ni = realloc(c->ids, nc * sizeof *ni);
        if (!ni) return -1;
        c->ids = ni;
        c->cap = nc;
    }
    c->ids[c->n++] = id;
    return 0;
}

static int scratch_reserve(enc_ctx *c, size_t n)
{
    if (n <= c->scratch_cap) return 0;
    size_t nc = c->scratch_cap ? c->scratch_cap : 256;
    while (nc < n) nc *= 2;
    uint32_t *a = realloc(c->pstart, nc * sizeof *a);
    if (!a) return -1;
    c->pstart = a;
    a = realloc(c->prank, nc * sizeof *a);
    if (!a) return -1;
    c->prank = a;
    a = realloc(c->nxt, nc * sizeof *a);
    if (!a) return -1;
    c->nxt = a;
    a = realloc(c->prv, nc * sizeof *a);
    if (!a) return -1;
    c->prv = a;
    c->scratch_cap = nc;
    return 0;
}

static inline uint32_t rank_of(const tokenizer *t, const unsigned char *p, size_t n)
{
    int32_t r = n == 2 ? t->pair2[(unsigned)p[0] << 8 | p[1]] : htab_get(t, &t->ranks, p, n);
    return r < 0 ? RANK_NONE : (uint32_t)r;
}

/* tiktoken's _byte_pair_merge, literally: O(n^2), fastest for short pieces. */
static int bpe_linear(enc_ctx *c, const unsigned char *p, size_t len)
{
    const tokenizer *t = c->t;
    if (scratch_reserve(c, len + 1)) return -1;
    uint32_t *ps = c->pstart, *pr = c->prank;
    size_t np = len + 1;
    uint32_t min_r = RANK_NONE;
    size_t min_i = 0;
    for (size_t i = 0; i + 1 < len; i++) {
        uint32_t r = rank_of(t, p + i, 2);
        if (r < min_r) { min_r = r; min_i = i; }
        ps[i] = (uint32_t)i;
        pr[i] = r;
    }
    ps[len - 1] = (uint32_t)(len - 1);
    pr[len - 1] = RANK_NONE;
    ps[len] = (uint32_t)len;
    pr[len] = RANK_NONE;
    while (min_r != RANK_NONE) {
        size_t i = min_i;
        if (i > 0)
            pr[i - 1] = i + 2 < np ? rank_of(t, p + ps[i - 1], ps[i + 2] - ps[i - 1]) : RANK_NONE;
        pr[i] = i + 3 < np ? rank_of(t, p + ps[i], ps[i + 3] - ps[i]) : RANK_NONE;
        memmove(ps + i + 1, ps + i + 2, (np - i - 2) * sizeof *ps);
        memmove(pr + i + 1, pr + i + 2, (np - i - 2) * sizeof *pr);
        np--;
        min_r = RANK_NONE;
        for (size_t k = 0; k + 1 < np; k++)
            if (pr[k] < min_r) { min_r = pr[k]; min_i = k; }
    }
    for (size_t k = 0; k + 1 < np; k++) {
        int32_t id = htab_get(t, &t->ranks, p + ps[k], ps[k + 1] - ps[k]);
        if (emit(c, id)) return -1;
    }
    return 0;
}

static inline int heap_less(const heap_ent *a, const heap_ent *b) { return a->key < b->key; }

static int heap_push(enc_ctx *c, size_t *hn, uint32_t rank, uint32_t start, uint32_t end)
{
    if (*hn == c->heap_cap) {
        size_t nc = c->heap_cap ? 2 * c->heap_cap : 256;
        heap_ent *nh = realloc(c->heap, nc * sizeof *nh);
        if (!nh) return -1;
        c->heap = nh;
        c->heap_cap = nc;
    }
    heap_ent *h = c->heap;
    heap_ent e = { ((uint64_t)rank << 32) | start, end };
    size_t i = (*hn)++;
    while (i > 0) {
        size_t par = (i - 1) / 2;
        if (!heap_less(&e, &h[par])) break;
        h[i] = h[par];
        i = par;
    }
    h[i] = e;
    return 0;
}

static heap_ent heap_pop(enc_ctx *c, size_t *hn)
{
    heap_ent *h = c->heap, top = h[0], last = h[--*hn];
    size_t n = *hn, i = 0;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= n) break;
        if (l + 1 < n && heap_less(&h[l + 1], &h[l])) l++;
        if (!heap_less(&h[l], &last)) break;
        h[i] = h[l];
        i = l;
    }
    if (n) h[i] = last;
    return top;
}

/* Same result as bpe_linear (global minimum (rank, start) each step), O(n log n). */
static int bpe_heap(enc_ctx *c, const unsigned char *p, size_t len)
{
    const tokenizer *t = c->t;
    if (len >= UINT32_MAX / 2) return -1;
    if (scratch_reserve(c, len + 1)) return -1;
    uint32_t *nxt = c->nxt, *prv = c->prv;
    const uint32_t L = (uint32_t)len, NONE = UINT32_MAX;
    size_t hn = 0;
    for (uint32_t i = 0; i < L; i++) {
        nxt[i] = i + 1;
        prv[i] = i ? i - 1 : NONE;
    }
    nxt[L] = NONE;
    for (uint32_t i = 0; i + 1 < L; i++) {
        uint32_t r = rank_of(t, p + i, 2);
        if (r != RANK_NONE && heap_push(c, &hn, r, i, i + 2)) return -1;
    }
    while (hn) {
        heap_ent e = heap_pop(c, &hn);
        uint32_t i = (uint32_t)e.key, j = nxt[i];
        if (j == NONE || j >= L || nxt[j] != e.end || prv[j] != i) continue; /* stale */
        /* merge part j into part i */
        nxt[i] = nxt[j];
        if (nxt[j] < L) prv[nxt[j]] = i;
        nxt[j] = NONE;
        prv[j] = NONE;
        uint32_t k = nxt[i];
        if (k < L) {
            uint32_t r = rank_of(t, p + i, nxt[k] - i);
            if (r != RANK_NONE && heap_push(c, &hn, r, i, nxt[k])) return -1;
        }
        uint32_t h = prv[i];
        if (h != NONE) {
            uint32_t r = rank_of(t, p + h, k - h);
            if (r != RANK_NONE && heap_push(c, &hn, r, h, k)) return -1;
        }
    }
    for (uint32_t i = 0; i < L; i = nxt[i])
        if (emit(c, htab_get(t, &t->ranks, p + i, nxt[i] - i))) return -1;
    return 0;
}

static int bpe_piece(enc_ctx *c, const unsigned char *p, size_t len, int method)
{
    int32_t whole = htab_get(c->t, &c->t->ranks, p, len);
    if (whole >= 0) return emit(c, whole);
    if (method == 1 || (method == 0 && len <= BPE_LINEAR_MAX)) return bpe_linear(c, p, len);
    return bpe_heap(c, p, len);
}

/* ------------------------------------------------------------------ the Kimi split */

/* One segment: code point k has class cls[k] and bytes text[off[k] .. off[k+1]); n code points. */
typedef struct {
    const unsigned char *text;
    const uint8_t *cls;
    const uint32_t *off;
    size_t n;
} seg;

#define IS_HAN(k) (s->cls[k] & UC_HAN)
#define IS_U(k) (s->cls[k] & UC_U)
#define IS_W(k) (s->cls[k] & UC_W)
#define IS_N(k) (s->cls[k] & UC_N)
#define IS_WS(k) (s->cls[k] & UC_WS)
#define BYTE(k) (s->text[s->off[k]])
#define IS_RN(k) (BYTE(k) == '\r' || BYTE(k) == '\n')
/* [^\r\n\p{L}\p{N}] */
#define IS_PREFIX(k) (!(s->cls[k] & (UC_L | UC_N)) && !IS_RN(k))
/* [^\s\p{L}\p{N}] */
#define IS_PUNCT(k) (!(s->cls[k] & (UC_WS | UC_L | UC_N)))

/* [U]*[W]+ from i: end or -1 */
static inline long alt2(const seg *s, size_t i)
{
    size_t u = i;
    while (u < s->n && IS_U(u)) u++;
    size_t w = u;
    while (w < s->n && IS_W(w)) w++;
    if (w > u) return (long)w;
    for (size_t k = u; k > i; k--)
        if (IS_W(k - 1)) return (long)k; /* backtrack U* to the last W */
    return -1;
}

/* [U]+[W]* from i: end or -1 */
static inline long alt3(const seg *s, size_t i)
{
    size_t u = i;
    while (u < s->n && IS_U(u)) u++;
    if (u == i) return -1;
    while (u < s->n && IS_W(u)) u++;
    return (long)u;
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d) at k: length matched (0, 2 or 3). Only ASCII letters and U+017F fold. */
static inline int lower_at(const seg *s, size_t k)
{
    unsigned b = BYTE(k);
    if (b >= 'A' && b <= 'Z') return (int)(b + 32);
    if (b < 0x80) return (int)b;
    if (b == 0xC5 && s->text[s->off[k] + 1] == 0xBF) return 's'; /* U+017F LATIN SMALL LETTER LONG S */
    return -1;
}

static inline size_t contraction(const seg *s, size_t k)
{
    if (k + 1 >= s->n || BYTE(k) != '\'') return 0;
    int a = lower_at(s, k + 1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (k + 2 < s->n) {
        int b = lower_at(s, k + 2);
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    }
    return 0;
}

/* End (code point index) of the piece starting at i < n. */
static size_t kimi_next(const seg *s, size_t i)
{
    const size_t n = s->n;
    if (IS_HAN(i)) { /* [\p{Han}]+ */
        size_t e = i + 1;
        while (e < n && IS_HAN(e)) e++;
        return e;
    }
    /* the two letter alternatives, each with the optional prefix tried first */
    int pre = IS_PREFIX(i) && i + 1 < n;
    long e = -1;
    if (pre) e = alt2(s, i + 1);
    if (e < 0) e = alt2(s, i);
    if (e < 0 && pre) e = alt3(s, i + 1);
    if (e < 0) e = alt3(s, i);
    if (e >= 0) return (size_t)e + contraction(s, (size_t)e);
    if (IS_N(i)) { /* \p{N}{1,3} */
        size_t e2 = i + 1;
        while (e2 < n && e2 - i < 3 && IS_N(e2)) e2++;
        return e2;
    }
    { /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
        size_t st = i;
        if (BYTE(i) == ' ' && i + 1 < n && IS_PUNCT(i + 1)) st = i + 1;
        if (IS_PUNCT(st)) {
            size_t e2 = st + 1;
            while (e2 < n && IS_PUNCT(e2)) e2++;
            while (e2 < n && IS_RN(e2)) e2++;
            return e2;
        }
    }
    size_t w = i, last_rn = SIZE_MAX;
    while (w < n && IS_WS(w)) {
        if (IS_RN(w)) last_rn = w;
        w++;
    }
    if (last_rn != SIZE_MAX) return last_rn + 1; /* \s*[\r\n]+ */
    if (w - i >= 2 && w < n) return w - 1;      /* \s+(?!\S) not at the end */
    if (w > i) return w;                         /* \s+(?!\S) at the end, or \s+ */
    return i + 1;                                /* unreachable: every class is covered above */
}

#undef IS_HAN
#undef IS_U
#undef IS_W
#undef IS_N
#undef IS_WS
#undef BYTE
#undef IS_RN
#undef IS_PREFIX
#undef IS_PUNCT

static int encode_segment(enc_ctx *c, const seg *s)
{
    for (size_t i = 0; i < s->n;) {
        size_t e = kimi_next(s, i);
        int rc = bpe_piece(c, s->text + s->off[i], s->off[e] - s->off[i], 0);
        if (rc) return rc;
        i = e;
    }
    return 0;
}

/* Finds the leftmost (then longest) special text within text[from, to); returns its id or -1. */
static int32_t find_special(const tokenizer *t, const unsigned char *text, size_t from, size_t to, size_t *at)
{
    for (size_t p = from; p < to; p++) {
        unsigned char b = text[p];
        if (!(t->special_first[b >> 3] & (1u << (b & 7)))) continue;
        for (size_t j = 0; j < t->n_special_lens; j++) {
            size_t l = t->special_lens[j];
            if (l > to - p) continue;
            int32_t id = htab_get(t, &t->specials, text + p, l);
            if (id >= 0) {
                *at = p;
                return id;
            }
        }
    }
    return -1;
}

/* One piece of the wrapper's chunking: code points [a, b) of the current slice. */
static int encode_piece(enc_ctx *c, const unsigned char *text, const uint8_t *cls, const uint32_t *off,
                        size_t a, size_t b, int allow_special)
{
    const tokenizer *t = c->t;
    while (a < b) {
        size_t at = 0, seg_end = b;
        int32_t sid = -1;
        if (allow_special) {
            sid = find_special(t, text, off[a], off[b], &at);
            if (sid >= 0) {
                seg_end = a;
                while (off[seg_end] < at) seg_end++;
            }
        }
        seg s = { text, cls + a, off + a, seg_end - a };
        int rc = encode_segment(c, &s);
        if (rc) return rc;
        if (sid < 0) break;
        if ((rc = emit(c, sid))) return rc;
        size_t stop = at + t->len[sid];
        a = seg_end;
        while (a < b && off[a] < stop) a++;
    }
    return 0;
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int allow_special, int32_t **ids,
                     size_t *n, k3_error *err)
{
    *ids = NULL;
    *n = 0;
    const unsigned char *u = (const unsigned char *)text;
    size_t bad = utf8_valid_prefix(text, len);
    if (bad != len) {
        k3_refuse(err, "invalid UTF-8 at byte offset %zu (byte 0x%02X)", bad, u[bad]);
        return -1;
    }
    enc_ctx c = { .t = t };
    size_t ncp = 0;
    for (size_t i = 0; i < len; i++) ncp += (u[i] & 0xC0) != 0x80;
    size_t slice = ncp < TOK_MAX_ENCODE_CHARS ? ncp : TOK_MAX_ENCODE_CHARS;
    uint8_t *cls = malloc(slice + 1);
    uint32_t *off = malloc((slice + 1) * sizeof *off);
    int rc = 0;
    if (!cls || !off) rc = -1;
    else {
        c.cap = len / 3 + 16 < ((size_t)1 << 22) ? len / 3 + 16 : ((size_t)1 << 22); /* grows as needed */
        if (!(c.ids = malloc(c.cap * sizeof *c.ids))) rc = -1;
    }
    /* off[] is relative to the slice start, so slices of any input fit in 32 bits */
    for (size_t pos = 0; rc == 0 && pos < len;) {
        const unsigned char *base = u + pos;
        size_t k = 0, bp = 0;
        while (pos + bp < len && k < TOK_MAX_ENCODE_CHARS) {
            size_t l;
            uint32_t cp = utf8_decode(base + bp, &l);
            off[k] = (uint32_t)bp;
            cls[k] = (uint8_t)uc_class(cp);
            bp += l;
            k++;
        }
        off[k] = (uint32_t)bp;
        pos += bp;
        /* tokenization_kimi.py _split_whitespaces_or_nonwhitespaces */
        size_t start = 0, run = 0;
        int sp = (cls[0] & UC_PYSPACE) != 0;
        for (size_t i = 0; i < k && rc == 0; i++) {
            int now = (cls[i] & UC_PYSPACE) != 0;
            if (now != sp) {
                run = 1;
                sp = now;
            } else if (++run > TOK_MAX_SAME_CLASS_RUN) {
                rc = encode_piece(&c, base, cls, off, start, i, allow_special);
                start = i;
                run = 1;
            }
        }
        if (rc == 0) rc = encode_piece(&c, base, cls, off, start, k, allow_special);
    }
    free(cls);
    free(off);
    enc_free(&c);
    if (rc != 0) {
        free(c.ids);
        return k3_nomem(err, "tokenizer: out of memory");
    }
    *ids = c.ids;
    *n = c.n;
    return 0;
}

int tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *out_len, k3_error *err)
{
    *out = NULL;
    *out_len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (size_t)ids[i] >= t->n_total) {
            k3_refuse(err, "token id %ld at position %zu is out of range (vocabulary has %zu ids)",
                    (long)ids[i], i, t->n_total);
            return -1;
        }
        total += t->len[ids[i]];
    }
    char *buf = malloc(total + 1);
    if (!buf) {
        k3_nomem(err, "tokenizer: out of memory");
        return -1;
    }
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(buf + w, t->blob + t->off[ids[i]], t->len[ids[i]]);
        w += t->len[ids[i]];
    }
    buf[w] = 0;
    *out = buf;
    *out_len = w;
    return 0;
}

/* ------------------------------------------------------------------ test hooks */

int tokenizer_pretokenize(const char *text, size_t len, size_t **ends, size_t *n, k3_error *err)
{
    *ends = NULL;
    *n = 0;
    const unsigned char *u = (const unsigned char *)text;
    size_t bad = utf8_valid_prefix(text, len);
    if (bad != len) {
        k3_refuse(err, "invalid UTF-8 at byte offset %zu (byte 0x%02X)", bad, u[bad]);
        return -1;
    }
    if (len >= UINT32_MAX) return k3_refuse(err, "text of %zu bytes is too long to pre-tokenize", len);
    uint8_t *cls = malloc(len + 1);
    uint32_t *off = malloc((len + 1) * sizeof *off);
    size_t *e = malloc((len + 1) * sizeof *e);
    if (!cls || !off || !e) {
        free(cls);
        free(off);
        free(e);
        k3_nomem(err, "tokenizer: out of memory");
        return -1;
    }
    size_t k = 0;
    for (size_t bp = 0; bp < len;) {
        size_t l;
        uint32_t cp = utf8_decode(u + bp, &l);
        off[k] = (uint32_t)bp;
        cls[k++] = (uint8_t)uc_class(cp);
        bp += l;
    }
    off[k] = (uint32_t)len;
    seg s = { u, cls, off, k };
    size_t np = 0;
    for (size_t i = 0; i < k;) {
        size_t j = kimi_next(&s, i);
        e[np++] = off[j];
        i = j;
    }
    free(cls);
    free(off);
    *ends = e;
    *n = np;
    return 0;
}

int tokenizer_bpe_piece(const tokenizer *t, const void *bytes, size_t len, int method, int32_t **ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    if (len == 0) return -1;
    enc_ctx c = { .t = t };
    int rc;
    if (method == 0) {
        rc = bpe_piece(&c, bytes, len, 0);
    } else {
        /* no whole-piece shortcut: exercise the merge loop itself */
        rc = method == 1 ? bpe_linear(&c, bytes, len) : bpe_heap(&c, bytes, len);
    }
    enc_free(&c);
    if (rc) {
        free(c.ids);
        return rc;
    }
    if (!c.ids && !(c.ids = malloc(sizeof *c.ids))) return -1;
    *ids = c.ids;
    *n = c.n;
    return 0;
}
