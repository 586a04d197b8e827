/* safetensors.c - safetensors header parsing and validation (see safetensors.h). */
#include "common/safetensors.h"
#include "common/file_read.h"
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct { const char *name; size_t size; } DTYPES[ST_NDTYPES] = {
    [ST_BOOL] = {"BOOL", 1}, [ST_U8] = {"U8", 1},   [ST_I8] = {"I8", 1},     [ST_F8_E4M3] = {"F8_E4M3", 1},
    [ST_F8_E5M2] = {"F8_E5M2", 1}, [ST_I16] = {"I16", 2}, [ST_U16] = {"U16", 2}, [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2}, [ST_I32] = {"I32", 4}, [ST_U32] = {"U32", 4}, [ST_F32] = {"F32", 4},
    [ST_I64] = {"I64", 8},  [ST_U64] = {"U64", 8}, [ST_F64] = {"F64", 8},
};

const char *st_dtype_name(st_dtype d) { return d < ST_NDTYPES ? DTYPES[d].name : "?"; }
size_t st_dtype_size(st_dtype d) { return d < ST_NDTYPES ? DTYPES[d].size : 0; }

static int cmp_begin(const void *a, const void *b) {
    const st_tensor *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

void safetensors_free(st_file *f) {
    if (!f) return;
    for (size_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->path);
    memset(f, 0, sizeof *f);
}

static int parse_entry(const char *path, const char *name, json_t *v, uint64_t data_start, uint64_t data_size,
                       st_tensor *t, k3_error *err) {
    if (!json_is_object(v)) return k3_fail(err, "%s: tensor '%s': header entry is not an object", path, name);
    json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
           *offs = json_object_get(v, "data_offsets");
    if (!json_is_string(dt)) return k3_fail(err, "%s: tensor '%s': missing or non-string 'dtype'", path, name);
    int d;
    for (d = 0; d < ST_NDTYPES; d++)
        if (strcmp(DTYPES[d].name, json_string_value(dt)) == 0) break;
    if (d == ST_NDTYPES) return k3_fail(err, "%s: tensor '%s': unknown dtype '%s'", path, name, json_string_value(dt));
    t->dtype = (st_dtype)d;
    if (!json_is_array(shape)) return k3_fail(err, "%s: tensor '%s': missing or non-array 'shape'", path, name);
    if (json_array_size(shape) > ST_MAX_DIMS)
        return k3_fail(err, "%s: tensor '%s': %zu dimensions (at most %d)", path, name, json_array_size(shape), ST_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        json_t *s = json_array_get(shape, (size_t)i);
        if (!json_is_integer(s) || json_integer_value(s) < 0)
            return k3_fail(err, "%s: tensor '%s': shape[%d] is not a non-negative integer", path, name, i);
        uint64_t dim = (uint64_t)json_integer_value(s);
        t->shape[i] = dim;
        if (dim && numel > UINT64_MAX / dim) return k3_fail(err, "%s: tensor '%s': shape overflows", path, name);
        numel *= dim;
    }
    if (numel > UINT64_MAX / 8) return k3_fail(err, "%s: tensor '%s': shape overflows", path, name);
    if (!json_is_array(offs) || json_array_size(offs) != 2 || !json_is_integer(json_array_get(offs, 0)) ||
        !json_is_integer(json_array_get(offs, 1)))
        return k3_fail(err, "%s: tensor '%s': 'data_offsets' must be [begin, end] integers", path, name);
    json_int_t b = json_integer_value(json_array_get(offs, 0)), e = json_integer_value(json_array_get(offs, 1));
    if (b < 0 || e < b) return k3_fail(err, "%s: tensor '%s': data_offsets [%lld, %lld] are invalid", path, name, (long long)b, (long long)e);
    uint64_t bytes = numel * DTYPES[d].size;
    if ((uint64_t)(e - b) != bytes)
        return k3_fail(err, "%s: tensor '%s': data_offsets span %llu bytes but dtype %s x shape needs %llu", path, name,
                       (unsigned long long)(e - b), DTYPES[d].name, (unsigned long long)bytes);
    if ((uint64_t)e > data_size)
        return k3_fail(err, "%s: tensor '%s': data ends at %lld, past the end of the data area (%llu bytes): truncated file?",
                       path, name, (long long)e, (unsigned long long)data_size);
    t->begin = data_start + (uint64_t)b;
    t->end = data_start + (uint64_t)e;
    t->name = strdup(name);
    if (!t->name) return k3_fail(err, "out of memory");
    return 0;
}

int safetensors_parse_header(const char *json, size_t len, uint64_t data_start, uint64_t data_size, const char *path,
                             st_file *f, k3_error *err) {
    memset(f, 0, sizeof *f);
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return k3_fail(err, "%s: header is not valid JSON (line %d col %d: %s)", path, jerr.line, jerr.column, jerr.text);
    int rc = -1;
    if (!json_is_object(root)) { k3_fail(err, "%s: header is not a JSON object", path); goto out; }
    size_t n = json_object_size(root);
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    if (!f->tensors) { k3_fail(err, "out of memory"); goto out; }
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v) {
        if (strcmp(name, "__metadata__") == 0) {
            if (!json_is_object(v)) { k3_fail(err, "%s: '__metadata__' is not an object", path); goto out; }
            continue;
        }
        if (name[0] == 0) { k3_fail(err, "%s: a tensor has an empty name", path); goto out; }
        if (parse_entry(path, name, v, data_start, data_size, &f->tensors[f->n_tensors], err)) goto out;
        f->n_tensors++;
    }
    qsort(f->tensors, f->n_tensors, sizeof *f->tensors, cmp_begin);
    for (size_t i = 1; i < f->n_tensors; i++)
        if (f->tensors[i].begin < f->tensors[i - 1].end) {
            k3_fail(err, "%s: tensors '%s' and '%s' overlap", path, f->tensors[i - 1].name, f->tensors[i].name);
            goto out;
        }
    rc = 0;
out:
    json_decref(root);
    if (rc) safetensors_free(f);
    return rc;
}

int safetensors_open(const char *path, st_file *f, k3_error *err) {
    memset(f, 0, sizeof *f);
    int fd = file_open_regular(path, 0, err); /* a FIFO, directory or device is refused by name */
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) { close(fd); return k3_fail(err, "%s: cannot stat: %s", path, strerror(errno)); }
    uint64_t size = (uint64_t)st.st_size;
    unsigned char lenbuf[8];
    if (size < 8 || pread(fd, lenbuf, 8, 0) != 8) { close(fd); return k3_fail(err, "%s: shorter than the 8-byte header length", path); }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | lenbuf[i];
    if (n < 2 || n > ST_MAX_HEADER) { close(fd); return k3_fail(err, "%s: header length %llu is not sane", path, (unsigned long long)n); }
    if (8 + n > size) { close(fd); return k3_fail(err, "%s: header length %llu runs past the end of the file (%llu bytes): truncated?", path, (unsigned long long)n, (unsigned long long)size); }
    char *hdr = malloc(n);
    if (!hdr) { close(fd); return k3_fail(err, "out of memory"); }
    ssize_t r = pread(fd, hdr, n, 8);
    close(fd);
    if (r != (ssize_t)n) { free(hdr); return k3_fail(err, "%s: short read of the header", path); }
    int rc = safetensors_parse_header(hdr, n, 8 + n, size - 8 - n, path, f, err);
    free(hdr);
    if (rc) return rc;
    f->file_size = size;
    f->data_start = 8 + n;
    f->path = strdup(path);
    if (!f->path) { safetensors_free(f); return k3_fail(err, "out of memory"); }
    return 0;
}
