/* verify.h - `bin/k3 --verify MODEL_DIR [--sha256] [--expect FILE] [--json FILE]`:
 * is every byte of a downloaded checkpoint right?
 *
 * Checks, collecting EVERY problem (never stopping at the first):
 *  - config.json parses (config.h);
 *  - the index (model.safetensors.index.json, when present) and the shards agree:
 *    every shard it names exists, every *.safetensors file is named by it, every
 *    tensor it maps is in the shard it names, every tensor of every shard is in
 *    it, no tensor is in two shards;
 *  - every shard header (safetensors.h: dtypes, shapes, offsets, truncation);
 *  - every tensor the layer schema (common/layer_schema.h) expects for the config
 *    (trunk, every routed expert's six MXFP4 tensors): each missing one (the first
 *    50 by name, then a count; not listed while a shard is unreadable) and each
 *    dtype or shape mismatch (ls_check, the loader's own check) is a problem;
 *    tensors the engine does not use are counted in a note. When nothing else is
 *    wrong, the engine's loader (model_load) must accept the directory too;
 *  - the data: every byte of every shard is read once (O_DIRECT when the file
 *    system accepts it, 8 MiB aligned reads, several threads in flight); every
 *    F32/BF16/F16/F64 element must be finite, every MXFP4 scale byte (U8 tensors
 *    named *weight_scale) must not be 255 (NaN in OCP MXFP4; the engine refuses
 *    it, docs/MODEL.md section 2); a read error names the shard and offset;
 *  - with sha256, each shard's SHA-256 (printed in sha256sum format); with
 *    expect_path (sha256sum format, implies sha256), each digest compared: a
 *    listed file that is missing or differs, and a shard with no listed digest,
 *    are problems. Listed non-shard files (config.json, tokenizer files) are
 *    hashed and compared too.
 * Problems name shard, tensor, element and file offset where they apply; a bad
 * tensor is one problem with the count and the first few elements.
 * Report on stdout (and as JSON in json_path); progress (GB/s, time left) on
 * stderr when it is a terminal. Returns the exit status: 0 all well, 2 problems
 * found (or a usage error: unreadable/malformed expect file), 1 run-time failure
 * (out of memory, cannot write the JSON). */
#ifndef K3_VERIFY_H
#define K3_VERIFY_H

typedef struct {
    const char *model_dir;
    int sha256;
    const char *expect_path;   /* NULL: none */
    const char *json_path;     /* NULL: none */
    int threads;               /* reader threads; 0 = default (max(4, 2 x cores), at most 16) */
    unsigned chunk_kib;        /* read size in KiB, a multiple of 4; 0 = default 8192 (tests use small ones) */
} verify_options;

int verify_run(const verify_options *o);

#endif
