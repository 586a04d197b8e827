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
 * Built by tests/fuzz/run_fuzz.sh with clang -fsanitize=fuzzer,address,undefined. */
#define _GNU_SOURCE
#include "common/safetensors.h"
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    parse_direct(data, size);
    parse_file(data, size);
    return 0;
}
