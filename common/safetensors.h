/* safetensors.h - parse and validate one safetensors file.
 *
 * Layout: 8-byte little-endian header length N, N bytes of JSON
 * {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
 * then the data; offsets are relative to byte 8+N.
 * safetensors_parse_header validates everything it can see without the data:
 * known dtype, shape sane, end-begin == numel*elemsize (no overflow), offsets
 * inside the data area, no overlaps, no duplicate names. It is the fuzz target.
 * Returned tensor offsets are ABSOLUTE file offsets. */
#ifndef K3_SAFETENSORS_H
#define K3_SAFETENSORS_H

#include "common/error.h"
#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (100u << 20) /* the safetensors format's own limit */

typedef enum {
    ST_BOOL, ST_U8, ST_I8, ST_F8_E4M3, ST_F8_E5M2, ST_I16, ST_U16, ST_F16, ST_BF16,
    ST_I32, ST_U32, ST_F32, ST_I64, ST_U64, ST_F64, ST_NDTYPES
} st_dtype;

typedef struct {
    char *name;
    st_dtype dtype;
    int ndim;
    uint64_t shape[ST_MAX_DIMS];
    uint64_t begin, end; /* absolute file offsets */
} st_tensor;

typedef struct {
    char *path;
    uint64_t file_size;
    uint64_t data_start; /* 8 + N */
    size_t n_tensors;
    st_tensor *tensors;  /* sorted by begin offset */
} st_file;

const char *st_dtype_name(st_dtype d);
size_t st_dtype_size(st_dtype d);

/* Parses the JSON header (json, len bytes) of a file whose data area is
 * data_size bytes and starts at absolute offset data_start. On success fills
 * f->tensors / f->n_tensors. path is for messages. */
int safetensors_parse_header(const char *json, size_t len, uint64_t data_start, uint64_t data_size,
                             const char *path, st_file *f, k3_error *err);
/* Opens path, reads and validates its header. The file is not kept open. */
int safetensors_open(const char *path, st_file *f, k3_error *err);
void safetensors_free(st_file *f);

#endif
