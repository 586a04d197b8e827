/* fuzz_state.c - libFuzzer harness for the state-file loader (coordinator/state_file.c).
 *
 * The input is a whole state file. The config is tests/models/m13/config.json (run from the
 * repository root, as run_fuzz.sh does) and the fingerprint a fixed one, FUZZ_FP, that the seed
 * in tests/fuzz/seeds/state/ was written with (`fuzz_state --make-seed FILE` writes it).
 * state_file_load_mem must either refuse with a non-empty message (nothing leaked) or return a
 * history whose every id is inside the vocabulary, pos <= n_ids <= max_positions, settings that
 * sampler_config_check accepts, and MLA caches with room for pos rows (touched here, so ASan
 * sees any short allocation). The input's last byte is a mode, not part of the file: odd = the
 * header and section checksums are recomputed before loading (to reach the checks behind them). */
#include "common/hash64.h"
#include "coordinator/state_file.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "fuzz_state: broken promise: %s (line %d)\n", #cond, __LINE__); \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

/* sampler.c's greedy path calls generate.c's arg-max; the loader never samples, and linking
 * generate.c would pull in the whole engine */
int32_t argmax_logits(const float *logits, size_t n);
__attribute__((weak)) int32_t argmax_logits(const float *logits, size_t n) {
    (void)logits;
    (void)n;
    abort();
}

static const state_fingerprint FUZZ_FP = {1, 2, 3, 4, 5};
static k3_config cfg;
static int have_cfg;

static void load_cfg(void) {
    if (have_cfg) return;
    k3_error err = {0};
    if (config_load("tests/models/m13", &cfg, &err)) {
        fprintf(stderr, "fuzz_state: %s (run from the repository root)\n", err.msg);
        abort();
    }
    have_cfg = 1;
}

/* Recomputes the header and every section checksum in place, so that mutations reach the
 * checks behind the checksums (lengths, counts, ids, settings). */
static void fix_checksums(uint8_t *b, size_t n) {
    if (n < 24) return;
    uint64_t h = hash64(b, 16, 0);
    memcpy(b + 16, &h, 8);
    size_t o = 24;
    while (o + 24 <= n) {
        uint64_t len;
        memcpy(&len, b + o + 8, 8);
        if (len > n - o - 24) return;
        hash64_state hs;
        hash64_init(&hs, 0);
        hash64_update(&hs, b + o, 16);
        hash64_update(&hs, b + o + 24, (size_t)len);
        h = hash64_digest(&hs);
        memcpy(b + o + 16, &h, 8);
        o += 24 + (size_t)len;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    load_cfg();
    /* the last byte selects: odd = checksums recomputed first; it is not part of the file */
    int fix = size > 0 && (data[size - 1] & 1);
    if (size > 0) size--;
    uint8_t *buf = malloc(size ? size : 1); /* exact size: ASan catches any read past len */
    if (!buf) return 0;
    memcpy(buf, data, size);
    if (fix) fix_checksums(buf, size);
    seq_state st;
    k3_error err = {0};
    if (seq_state_init(&st, &cfg, &err)) abort();
    state_loaded ld;
    size_t maxp = 256;
    int rc = state_file_load_mem(buf, size, "fuzz", &FUZZ_FP, &cfg, maxp, &st, &ld, &err);
    if (rc) {
        CHECK(rc == -1 && err.set && err.msg[0]);
        CHECK(ld.ids == NULL && ld.run.stop_ids == NULL);
    } else {
        CHECK(st.pos <= ld.n_ids && ld.n_ids <= maxp);
        for (size_t i = 0; i < ld.n_ids; i++) CHECK(ld.ids[i] >= 0 && ld.ids[i] < cfg.vocab_size);
        for (size_t i = 0; i < ld.run.n_stop_ids; i++) CHECK(ld.run.stop_ids[i] >= 0 && ld.run.stop_ids[i] < cfg.vocab_size);
        CHECK(sampler_config_check(&ld.run.sampling, NULL) == 0);
        CHECK(ld.run.n_prompt <= ld.n_ids);
        size_t row = (size_t)cfg.kv_lora_rank + cfg.qk_rope_head_dim;
        volatile float sink = 0;
        for (int l = 0; l < cfg.num_hidden_layers; l++)
            if (cfg.layer_is_mla[l] && st.pos) {
                CHECK(st.mla[l].cap >= st.pos);
                sink += st.mla[l].cache[st.pos * row - 1];
            }
        (void)sink;
        state_loaded_free(&ld);
    }
    seq_state_free(&st);
    free(buf);
    return 0;
}

#ifdef FUZZ_STATE_MAIN
/* cc -DFUZZ_STATE_MAIN ... : writes the seed file (a 3-position history, 1 fed... 3 fed). */
int main(int argc, char **argv) {
    if (argc != 3 || strcmp(argv[1], "--make-seed")) return 2;
    load_cfg();
    seq_state st;
    k3_error err = {0};
    if (seq_state_init(&st, &cfg, &err) || seq_state_reserve(&st, &cfg, 3, &err)) return 1;
    st.pos = 2;
    int32_t ids[3] = {1, 2, 3}, stops[1] = {510};
    state_run run = {.kind = STATE_KIND_RUN, .gen_target = 4, .n_prompt = 2, .stop_ids = stops, .n_stop_ids = 1};
    sampler_config_default(&run.sampling);
    k3_rng_seed(&run.rng, 0);
    if (state_file_save(argv[2], &FUZZ_FP, &cfg, ids, 3, &st, &run, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    return 0;
}
#endif
