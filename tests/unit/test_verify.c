/* test_verify.c - coordinator/verify with small reads (12 KiB chunks, 3 threads) so
 * every shard of tests/models/m13 spans many chunks: the per-shard SHA-256, fed
 * chunk by chunk in order by whichever thread holds the shard, equals the digest
 * of the whole file; NaNs poked into BF16 elements that straddle a chunk boundary
 * (data shifted to odd offsets) are all found, with their element numbers; the good copy passes.
 * Run from the repository root. */
#include "common/safetensors.h"
#include "common/sha256.h"
#include "coordinator/verify.h"
#include "tests/unit/check.h"
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *FILES[] = {"config.json", "model.safetensors.index.json", "model-00001-of-00003.safetensors",
                              "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"};
#define CHUNK 12288u

static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*len ? *len : 1);
    if (b && fread(b, 1, *len, f) != *len) { free(b); b = NULL; }
    fclose(f);
    return b;
}

static int spit(const char *path, const unsigned char *b, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int bad = fwrite(b, 1, len, f) != len;
    return fclose(f) || bad ? -1 : 0;
}

static json_t *run(const char *dir, const char *json_path, int *rc) {
    verify_options o = {.model_dir = dir, .sha256 = 1, .json_path = json_path, .threads = 3, .chunk_kib = CHUNK / 1024};
    fflush(stdout);
    *rc = verify_run(&o);
    json_error_t je;
    return json_load_file(json_path, 0, &je);
}

int main(void) {
    char dir[] = "/tmp/k3_test_verify.XXXXXX", path[512], json_path[600];
    if (!mkdtemp(dir)) { printf("mkdtemp failed\n"); return 1; }
    snprintf(json_path, sizeof json_path, "%s/report.json", dir);
    for (size_t i = 0; i < sizeof FILES / sizeof *FILES; i++) {
        size_t len;
        snprintf(path, sizeof path, "tests/models/m13/%s", FILES[i]);
        unsigned char *b = slurp(path, &len);
        snprintf(path, sizeof path, "%s/%s", dir, FILES[i]);
        CHECK(b && spit(path, b, len) == 0, "copy %s", FILES[i]);
        free(b);
    }
    /* good copy: ok, and each digest is the whole file's */
    int rc;
    json_t *j = run(dir, json_path, &rc);
    CHECK(rc == 0 && j && json_is_true(json_object_get(j, "ok")), "good copy: rc %d", rc);
    json_t *shards = json_object_get(j, "shards");
    for (size_t i = 0; i < json_array_size(shards); i++) {
        json_t *s = json_array_get(shards, i);
        size_t len;
        snprintf(path, sizeof path, "%s/%s", dir, json_string_value(json_object_get(s, "name")));
        unsigned char *b = slurp(path, &len);
        sha256_ctx c;
        uint8_t d[32];
        char hex[65];
        sha256_init(&c);
        sha256_update(&c, b, len);
        sha256_final(&c, d);
        sha256_hex(d, hex);
        const char *got = json_string_value(json_object_get(s, "sha256"));
        CHECK(got && !strcmp(got, hex), "%s: chunked digest %s, whole-file %s (%zu chunks)", path, got ? got : "none", hex, len / CHUNK + 1);
        free(b);
    }
    json_decref(j);

    /* shift the data of shard 1 by one byte (one more space in its JSON header) so
     * every BF16 element sits at an odd offset and the ones at a chunk boundary
     * straddle it; then poison the BF16 element holding the first byte of each
     * boundary, in every BF16 tensor that spans one */
    const char *shard = "model-00001-of-00003.safetensors";
    snprintf(path, sizeof path, "%s/%s", dir, shard);
    {
        size_t ol;
        unsigned char *o = slurp(path, &ol), *nb = o ? malloc(ol + 1) : NULL;
        CHECK(nb != NULL, "read %s", path);
        if (nb) {
            uint64_t hn = 0;
            for (int i = 7; i >= 0; i--) hn = hn << 8 | o[i];
            for (int i = 0; i < 8; i++) nb[i] = (unsigned char)((hn + 1) >> (8 * i));
            memcpy(nb + 8, o + 8, (size_t)hn);
            nb[8 + hn] = ' ';
            memcpy(nb + 9 + hn, o + 8 + hn, ol - 8 - (size_t)hn);
            CHECK(spit(path, nb, ol + 1) == 0, "write shifted shard");
        }
        free(o);
        free(nb);
    }
    st_file f;
    k3_error err = {0};
    CHECK(safetensors_open(path, &f, &err) == 0, "%s", err.msg);
    size_t len;
    unsigned char *b = slurp(path, &len);
    int poked = 0, straddling = 0;
    char want[64][256];
    for (size_t t = 0; b && t < f.n_tensors && poked < 64; t++) {
        const st_tensor *T = &f.tensors[t];
        if (T->dtype != ST_BF16) continue;
        uint64_t B = (T->begin / CHUNK + 1) * CHUNK;
        if (B >= T->end) continue;
        uint64_t el = (B - T->begin) / 2, at = T->begin + 2 * el;
        straddling += at < B;
        b[at] = 0xc0; b[at + 1] = 0x7f; /* NaN */
        snprintf(want[poked++], sizeof want[0], "%s %llu", T->name, (unsigned long long)el);
    }
    CHECK(poked >= 3 && straddling >= 1, "poked %d tensors (%d straddling): the model layout changed?", poked, straddling);
    CHECK(b && spit(path, b, len) == 0, "write poisoned shard");
    free(b);
    safetensors_free(&f);
    j = run(dir, json_path, &rc);
    json_t *pr = json_object_get(j, "problems");
    CHECK(rc == 2 && json_array_size(pr) == (size_t)poked, "poisoned: rc %d, %zu problems, %d poked", rc, json_array_size(pr), poked);
    for (int k = 0; k < poked; k++) {
        int found = 0;
        for (size_t i = 0; i < json_array_size(pr); i++) {
            json_t *p = json_array_get(pr, i);
            char have[256];
            snprintf(have, sizeof have, "%s %lld", json_string_value(json_object_get(p, "tensor")), (long long)json_integer_value(json_object_get(p, "element")));
            found |= !strcmp(have, want[k]);
        }
        CHECK(found, "poisoned element '%s' not reported", want[k]);
    }
    json_decref(j);
    for (size_t i = 0; i < sizeof FILES / sizeof *FILES; i++) { snprintf(path, sizeof path, "%s/%s", dir, FILES[i]); unlink(path); }
    unlink(json_path);
    rmdir(dir);
    if (check_failures) { printf("%d failures\n", check_failures); return 1; }
    printf("verify: chunked digests and chunk-boundary elements right (%d boundaries, %d straddling)\n", poked, straddling);
    return 0;
}
