/* fuzz_safetensors.c - libFuzzer harness for the safetensors header parser.
 *
 * The input is read as a whole safetensors file when its first 8 bytes (the
 * little-endian header length N) fit it: the JSON is bytes [8, 8+N) and the
 * data area is everything after. Otherwise the 8 bytes are taken as the size
 * of the data area (so huge sizes and offsets are reached too) and the rest of
 * the input is the JSON header. Either way safetensors_parse_header must
 * refuse with a message or return tensors that satisfy every promise of
 * safetensors.h; a broken promise aborts. The whole input is also opened as a
 * file through safetensors_open (via a memfd), which covers the length checks.
 * A custom mutator edits the header as JSON half of the time (shift a tensor's
 * offsets, reshape or retype it with a consistent span, clone it onto another
 * tensor's bytes, drop it, resize the data area): byte-level mutation alone
 * almost never produces offsets that are consistent yet overlapping.
 * Built by tests/fuzz/run_fuzz.sh with clang -fsanitize=fuzzer,address,undefined. */
#define _GNU_SOURCE
#include "common/safetensors.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "fuzz_safetensors: broken promise: %s (line %d)\n", #cond, \
                    __LINE__);                                                      \
            abort();                                                                \
        }                                                                           \
    } while (0)

static void check_result(int rc, const st_file *f, const k3_error *err, uint64_t data_start, uint64_t data_size) {
    if (rc != 0) {
        CHECK(rc == -1);
        CHECK(err->set && err->msg[0] != 0);
        CHECK(memchr(err->msg, 0, sizeof err->msg) != NULL);
        CHECK(f->n_tensors == 0 && f->tensors == NULL); /* freed on failure */
        return;
    }
    CHECK(!err->set);
    for (size_t i = 0; i < f->n_tensors; i++) {
        const st_tensor *t = &f->tensors[i];
        CHECK(t->name && t->name[0]);
        CHECK(t->dtype < ST_NDTYPES);
        CHECK(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS);
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            CHECK(t->shape[d] == 0 || numel <= UINT64_MAX / t->shape[d]);
            numel *= t->shape[d];
        }
        CHECK(numel <= UINT64_MAX / 8);
        CHECK(t->begin >= data_start && t->begin <= t->end);
        CHECK(t->end - data_start <= data_size);
        CHECK(t->end - t->begin == numel * st_dtype_size(t->dtype));
        if (i) {
            CHECK(f->tensors[i - 1].begin <= t->begin);  /* sorted */
            CHECK(f->tensors[i - 1].end <= t->begin);    /* no overlap */
        }
    }
}

static void parse_direct(const uint8_t *data, size_t size) {
    if (size < 8) return;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | data[i];
    const char *json;
    size_t len;
    uint64_t data_start, data_size;
    if (n <= size - 8) { /* a whole file */
        json = (const char *)data + 8;
        len = (size_t)n;
        data_start = 8 + n;
        data_size = size - 8 - n;
    } else {             /* the prefix is the data size */
        json = (const char *)data + 8;
        len = size - 8;
        data_start = 8 + len;
        data_size = n;
    }
    /* jansson reads exactly len bytes: copy to an exact-size buffer so ASan sees any over-read */
    char *buf = malloc(len ? len : 1);
    if (!buf) return;
    memcpy(buf, json, len);
    st_file f;
    k3_error err = {0};
    int rc = safetensors_parse_header(buf, len, data_start, data_size, "fuzz.safetensors", &f, &err);
    check_result(rc, &f, &err, data_start, data_size);
    safetensors_free(&f);
    free(buf);
}

static void parse_file(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("fuzz_safetensors", 0);
        if (fd < 0) return;
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) return;
    st_file f;
    k3_error err = {0};
    int rc = safetensors_open(path, &f, &err);
    if (rc == 0) {
        CHECK(f.file_size == size && f.data_start >= 10 && f.data_start <= size);
        CHECK(f.path && strcmp(f.path, path) == 0);
        check_result(rc, &f, &err, f.data_start, size - f.data_start);
    } else {
        CHECK(err.set && err.msg[0]);
    }
    safetensors_free(&f);
}


/* ---- structure-aware mutator ---- */

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);

static uint64_t rnd(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static const char *const DT_NAMES[] = {"BOOL", "U8", "I8", "F8_E4M3", "F8_E5M2", "I16", "U16", "F16",
                                       "BF16", "I32", "U32", "F32", "I64", "U64", "F64", "F4", "bf16"};
static const int DT_SIZES[] = {1, 1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 8, 8, 8, 1, 2};

/* Size of one element of the entry's dtype (1 if unknown) and its element count. */
static long long entry_bytes(json_t *e) {
    const char *dt = json_string_value(json_object_get(e, "dtype"));
    long long esz = 1, n = 1;
    for (size_t i = 0; dt && i < sizeof DT_NAMES / sizeof *DT_NAMES; i++)
        if (strcmp(dt, DT_NAMES[i]) == 0) esz = DT_SIZES[i];
    size_t i;
    json_t *d;
    json_array_foreach(json_object_get(e, "shape"), i, d) {
        long long v = json_integer_value(d);
        if (v < 0 || v > (1 << 20) || (v && n > (1LL << 40) / v)) return -1;
        n *= v;
    }
    return n * esz;
}

static void set_span(json_t *e, long long begin, long long bytes) {
    json_object_set_new(e, "data_offsets", json_pack("[I,I]", (json_int_t)begin, (json_int_t)(begin + bytes)));
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    uint64_t s = seed;
    if (rnd(&s) % 2 || size < 10) return LLVMFuzzerMutate(data, size, max_size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | data[i];
    if (n > size - 8) return LLVMFuzzerMutate(data, size, max_size);
    json_t *root = json_loadb((const char *)data + 8, (size_t)n, 0, NULL);
    if (!json_is_object(root) || json_object_size(root) == 0) {
        json_decref(root);
        return LLVMFuzzerMutate(data, size, max_size);
    }
    /* pick two entries (may be the same, may be __metadata__) */
    size_t cnt = json_object_size(root), pick = rnd(&s) % cnt, pick2 = rnd(&s) % cnt, k = 0;
    const char *key, *name = NULL, *name2 = NULL;
    json_t *v, *e = NULL, *o = NULL;
    json_object_foreach(root, key, v) {
        if (k == pick) { name = key; e = v; }
        if (k == pick2) { name2 = key; o = v; }
        k++;
    }
    uint64_t data_size = size - 8 - n;
    long long ob = json_integer_value(json_array_get(json_object_get(o, "data_offsets"), 0));
    long long oe = json_integer_value(json_array_get(json_object_get(o, "data_offsets"), 1));
    long long eb = json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 0));
    long long bytes = json_is_object(e) ? entry_bytes(e) : -1;
    char newname[300];
    switch (rnd(&s) % 8) {
    case 0: /* shift, keeping the span */
        if (json_is_object(e) && bytes >= 0) set_span(e, eb + (long long)(rnd(&s) % 33) - 16, bytes);
        break;
    case 1: /* move onto / next to / into another tensor */
        if (json_is_object(e) && bytes >= 0) {
            long long at = (long long)(rnd(&s) % 3);
            set_span(e, at == 0 ? ob : at == 1 ? oe : ob + (oe > ob ? (long long)(rnd(&s) % (uint64_t)(oe - ob)) : 0), bytes);
        }
        break;
    case 2: /* reshape one dim, consistent span */
        if (json_is_object(e) && json_is_array(json_object_get(e, "shape"))) {
            json_t *sh = json_object_get(e, "shape");
            size_t nd = json_array_size(sh);
            if (nd == 0 || rnd(&s) % 4 == 0) json_array_append_new(sh, json_integer((json_int_t)(rnd(&s) % 5)));
            else json_array_set_new(sh, rnd(&s) % nd, json_integer((json_int_t)(rnd(&s) % 9)));
            long long b2 = entry_bytes(e);
            if (b2 >= 0) set_span(e, eb, b2);
        }
        break;
    case 3: /* retype, consistent span */
        if (json_is_object(e)) {
            json_object_set_new(e, "dtype", json_string(DT_NAMES[rnd(&s) % (sizeof DT_NAMES / sizeof *DT_NAMES)]));
            long long b2 = entry_bytes(e);
            if (b2 >= 0) set_span(e, eb, b2);
        }
        break;
    case 4: /* clone an entry under a new (or the other's) name */
        if (e) {
            if (rnd(&s) % 2 && name2 && strcmp(name, name2) != 0) {
                json_object_set(root, name2, e);
            } else {
                snprintf(newname, sizeof newname, "%.280s.%u", name, (unsigned)(rnd(&s) % 100));
                json_object_set_new(root, newname, json_deep_copy(e));
            }
        }
        break;
    case 5: /* drop an entry */
        if (name) json_object_del(root, name);
        break;
    case 6: /* grow or shrink the data area */
        data_size = rnd(&s) % 2 ? data_size + rnd(&s) % 64 : data_size - (data_size ? rnd(&s) % (data_size + 1) : 0);
        break;
    default: /* lay every tensor out back to back from 0 (a valid file to start from) */
    {
        long long off = 0;
        json_object_foreach(root, key, v) {
            long long b2 = json_is_object(v) ? entry_bytes(v) : -1;
            if (b2 >= 0 && strcmp(key, "__metadata__") != 0) { set_span(v, off, b2); off += b2; }
        }
        if ((uint64_t)off < (1u << 16)) data_size = (uint64_t)off;
    }
    }
    char *hdr = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!hdr) return LLVMFuzzerMutate(data, size, max_size);
    size_t hl = strlen(hdr);
    if (8 + hl + data_size > max_size) {
        free(hdr);
        return LLVMFuzzerMutate(data, size, max_size);
    }
    /* data area: the old bytes (from the old data start), zero-extended */
    uint8_t *out = calloc(1, 8 + hl + data_size + 1);
    if (!out) { free(hdr); return size; }
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(out + 8, hdr, hl);
    uint64_t old = size - 8 - n;
    memcpy(out + 8 + hl, data + 8 + n, old < data_size ? old : data_size);
    size_t total = 8 + hl + (size_t)data_size;
    memcpy(data, out, total);
    free(out);
    free(hdr);
    return total;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    parse_direct(data, size);
    parse_file(data, size);
    return 0;
}
