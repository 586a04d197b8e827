/* fuzz_checkpoint.c - libFuzzer harness for a model directory's index (common/checkpoint:
 * model.safetensors.index.json cross-checked against the shards it names). The directory is
 * untrusted: an index may name missing shards, paths outside the directory, tensors in the wrong
 * shard, duplicates, or be no JSON at all.
 *
 * A private directory (under TMPDIR, else /tmp) holds two valid shards made at start,
 * "model-00001-of-00002.safetensors" (tensors "a.weight" F32 [2] and "b.weight" BF16 [3]) and
 * "model-00002-of-00002.safetensors" ("c.weight" F32 [1]), plus a stray "notes.txt". The input's
 * first byte picks a filter (bit 0: checkpoint_open_filtered keeping only names starting with
 * "a"); the rest is written as the index. A refusal must carry a message and free everything;
 * an accepted checkpoint must have its entries sorted by name without duplicates, each findable,
 * each in an open shard with its bytes readable (checkpoint_read of the whole tensor). Never a
 * crash, a leak or undefined behaviour. FUZZ_CHECKPOINT_SAY=1 build/fuzz/fuzz_checkpoint FILE says
 * what an input gave. */
#include "common/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/fuzz/fuzz_dir.h"


/* a safetensors file: 8-byte little-endian header length, the JSON header, the data */
static void write_shard(const char *name, const char *header, size_t data_bytes) {
    unsigned char buf[1024];
    const size_t hl = strlen(header);
    if (8 + hl + data_bytes > sizeof buf) abort();
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    memset(buf + 8 + hl, 0, data_bytes);
    fuzz_dir_write(name, buf, 8 + hl + data_bytes);
}

static int keep_a(const char *name, void *ctx) {
    (void)ctx;
    return name[0] == 'a';
}

static void init(void) {
    fuzz_dir_make("fuzz_checkpoint");
    write_shard("model-00001-of-00002.safetensors",
                "{\"a.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b.weight\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[8,14]}}",
                14);
    write_shard("model-00002-of-00002.safetensors",
                "{\"c.weight\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    fuzz_dir_write("notes.txt", "not a shard\n", 12);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!fuzz_dir[0]) init();
    const char *dir = fuzz_dir;
    if (size < 1) return 0;
    fuzz_dir_write("model.safetensors.index.json", data + 1, size - 1);
    checkpoint ck;
    k3_error err = {0};
    const int rc = (data[0] & 1) ? checkpoint_open_filtered(dir, keep_a, NULL, &ck, &err) : checkpoint_open(dir, &ck, &err);
    if (getenv("FUZZ_CHECKPOINT_SAY"))
        fprintf(stderr, rc ? "refused: %s\n" : "accepted: %s%zu tensors\n", rc ? err.msg : "", rc ? 0 : ck.n_entries);
    if (rc) {
        if (!err.msg[0]) abort(); /* a refusal always says why */
        checkpoint_close(&ck);
        return 0;
    }
    for (size_t i = 0; i < ck.n_entries; i++) {
        const ckpt_entry *e = &ck.entries[i];
        if (!e->name || !e->t || e->shard < 0 || e->shard >= ck.n_shards) abort();
        if (i && strcmp(ck.entries[i - 1].name, e->name) >= 0) abort();
        if (checkpoint_find(&ck, e->name) != e) abort();
        unsigned char buf[64];
        const size_t n = (size_t)(e->t->end - e->t->begin);
        if (n > sizeof buf || checkpoint_read(&ck, e, 0, buf, n, &err)) abort();
    }
    if (checkpoint_find(&ck, "no.such.tensor")) abort();
    checkpoint_close(&ck);
    return 0;
}
