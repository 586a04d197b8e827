/* checkpoint.h - a model directory's safetensors shards as one name -> tensor map.
 *
 * checkpoint_open reads model.safetensors.index.json when present (its weight_map
 * is checked: every entry must exist in the shard it names) and otherwise every
 * *.safetensors file in the directory. Every shard header is validated
 * (safetensors.h); a tensor name found in two shards is refused. Shard data is
 * read with checkpoint_read (pread) or by the trunk / expert readers; the engine
 * never maps tensor data (checkpoint_data, a read-only mapping, is kept for tests
 * as an independent path), so a process touches only the
 * shards that hold what it asks for. Shard file names are never assumed. */
#ifndef K3_CHECKPOINT_H
#define K3_CHECKPOINT_H

#include "common/error.h"
#include "common/safetensors.h"

typedef struct {
    const char *name;      /* owned by the shard's st_file */
    const st_tensor *t;
    int shard;
} ckpt_entry;

typedef struct {
    st_file file;
    int fd;                /* -1 until opened for data */
    void *map;             /* NULL until mapped */
} ckpt_shard;

typedef struct {
    char *dir;
    int n_shards;
    ckpt_shard *shards;
    size_t n_entries;
    ckpt_entry *entries;   /* sorted by name */
    int has_index;
} checkpoint;

int checkpoint_open(const char *dir, checkpoint *ck, k3_error *err);
/* With an index, opens only the shards that hold at least one tensor for which
 * keep(name) is nonzero (an expert server opens only its experts' shards).
 * Without an index every shard must be opened to learn its names. */
int checkpoint_open_filtered(const char *dir, int (*keep)(const char *name, void *ctx), void *ctx, checkpoint *ck,
                             k3_error *err);
void checkpoint_close(checkpoint *ck);
/* NULL if absent. */
const ckpt_entry *checkpoint_find(const checkpoint *ck, const char *name);
/* Reads len bytes at byte offset off inside tensor e into dst (buffered pread);
 * a short read names the shard and offset. */
int checkpoint_read(checkpoint *ck, const ckpt_entry *e, uint64_t off, void *dst, size_t len, k3_error *err);
/* The one reader of small float tensors (norms, biases, conv kernels, A_log,
 * AttnRes vectors): reads ALL values of F32 or BF16 tensor e, refuses any NaN or
 * Inf naming the tensor and the element index, and returns the first n values
 * as floats in a new malloc'd array (n <= numel). NULL + err on failure. */
float *checkpoint_read_floats(checkpoint *ck, const ckpt_entry *e, size_t n, k3_error *err);
/* The check of the big F32/BF16 matrices (trunk units, lm_head chunks, embedding
 * rows), made where their bytes are read anyway: index of the first NaN or Inf
 * among the n values of dtype F32 or BF16 at p, or n when all are finite. */
size_t floats_first_nonfinite(const void *p, st_dtype dt, size_t n);
/* Pointer to the tensor's bytes (maps the shard on first use); NULL + err on failure. */
const void *checkpoint_data(checkpoint *ck, const ckpt_entry *e, k3_error *err);
/* The shard's path and an open read-only fd (for pread/O_DIRECT readers). */
int checkpoint_shard_fd(checkpoint *ck, int shard, k3_error *err);
/* A hint: bytes [off, off + len) of a tensor will be read soon (posix_fadvise WILLNEED on
 * its shard: the kernel starts reading them without waiting). Nothing if the range is
 * outside the tensor or the shard cannot be opened (the read that follows reports it). */
void checkpoint_willneed(checkpoint *ck, const ckpt_entry *e, uint64_t off, size_t len);

#endif
