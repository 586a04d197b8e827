/* test_trunk.c - the trunk streamer: a single streaming slot is refused (it would
 * be overwritten while in use); 2 or 3 slots at any pinned prefix give the bits
 * of an all-pinned trunk; the walk order is enforced; the embedding is read on
 * demand. Uses tests/models/m13 (run from the repository root). */
#include "coordinator/experts_local.h"
#include "coordinator/generate.h"
#include "coordinator/trunk.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/unit/check.h"


static const int32_t PROMPT[] = {5, 17, 300, 42, 7, 99, 256, 1};
#define NP (sizeof PROMPT / sizeof PROMPT[0])

/* Logits of every prompt position with the given trunk configuration. */
static float *run(k3_model *m, const kernels *k, trunk_config tc, size_t chunk) {
    k3_error err = {0};
    trunk *t = trunk_create(m, &tc, &err);
    if (!t) { printf("trunk_create: %s\n", err.msg); return NULL; }
    expert_backend eb;
    if (experts_local_create(&eb, m, k, 1 << 20, CACHE_POLICY_LRU, &err)) { trunk_free(t); return NULL; }
    engine en = {.model = m, .trunk = t, .k = k, .experts = &eb};
    if (engine_init(&en, chunk, 64, 2, &err)) { printf("engine_init: %s\n", err.msg); eb.destroy(&eb); trunk_free(t); return NULL; }
    seq_state st;
    size_t V = (size_t)m->cfg.vocab_size;
    float *logits = malloc(NP * V * sizeof *logits);
    int ok = logits && seq_state_init(&st, &m->cfg, &err) == 0;
    /* two passes over the prompt (the reader wraps around its cycle) */
    for (int pass = 0; ok && pass < 2; pass++) {
        seq_state_reset(&st, &m->cfg);
        ok = feed_tokens(&en, &st, PROMPT, NP, chunk, 0, logits, &err) == 0;
    }
    if (!ok) printf("forward: %s\n", err.msg);
    seq_state_free(&st);
    engine_free(&en);
    eb.destroy(&eb);
    trunk_free(t);
    if (!ok) { free(logits); return NULL; }
    return logits;
}

int main(void) {
    k3_model m;
    k3_error err = {0};
    if (model_load("tests/models/m13", &m, &err)) { printf("cannot load tests/models/m13: %s\n", err.msg); return 1; }
    const kernels *k = kernels_get(SIMD_AUTO);
    size_t V = (size_t)m.cfg.vocab_size, rows = (size_t)m.cfg.vocab_size / 3 + 1;
    int walk = trunk_walk_units(&m, rows);

    trunk_config one = {0, 1, rows, 0, 0};
    trunk *t = trunk_create(&m, &one, &err);
    CHECK(t == NULL && strstr(err.msg, "at least 2 slots"), "a single streaming slot must be refused (got '%s')", err.msg);
    trunk_free(t);

    float *ref = run(&m, k, (trunk_config){walk, 0, rows, 0, 0}, 64);
    CHECK(ref != NULL, "all-pinned run failed");
    /* the fourth field: reads in flight (the dr_pool's threads; 0: one pread at a time); the
     * fifth: the pinned units mapped from the checkpoint (--mmap) instead of read */
    const trunk_config variants[] = {{0, 2, rows, 0, 0},    {0, 3, rows, 3, 0}, {1, 2, rows, 0, 0},   {walk / 2, 2, rows, 4, 0},
                                     {walk - 1, 2, rows, 1, 0}, {0, 2, rows, 2, 0}, {walk, 0, rows, 2, 0}, {walk, 0, rows, 0, 1},
                                     {walk / 2, 2, rows, 2, 1}, {1, 2, rows, 0, 1}};
    for (size_t i = 0; ref && i < sizeof variants / sizeof variants[0]; i++)
        for (size_t chunk = 1; chunk <= 64; chunk *= 8) {
            float *got = run(&m, k, variants[i], chunk);
            CHECK(got && memcmp(got, ref, NP * V * sizeof *got) == 0, "pinned %d, %d slots, mapped %d, chunk %zu: logits differ",
                  variants[i].n_pinned_units, variants[i].n_slots, variants[i].map_pinned, chunk);
            free(got);
        }

    /* the walk order is enforced: asking for the second unit first is an error, not a wrong weight */
    trunk_config two = {0, 2, rows, 0, 0};
    t = trunk_create(&m, &two, &err);
    CHECK(t != NULL, "2-slot trunk: %s", err.msg);
    if (t) {
        k3_error e2 = {0};
        trunk_pass p;
        dense_weight view;
        trunk_pass_begin(t, &p);
        CHECK(trunk_get(&p, m.units[1].w[0], &view, &e2) != 0 && strstr(e2.msg, "out of order"), "out-of-order acquire not refused");
        e2 = (k3_error){0};
        CHECK(trunk_get(&p, m.units[0].w[0], &view, &e2) == 0, "in-order acquire failed: %s", e2.msg);
        CHECK(view.data != NULL, "acquired unit has no data");
        CHECK(m.units[0].w[0]->data == NULL, "a pass wrote a pointer into the model");
        trunk_pass_end(&p, 1); /* abandoned half way: the next pass starts at the walk's start */
        trunk_pass_begin(t, &p);
        e2 = (k3_error){0};
        CHECK(trunk_get(&p, m.units[0].w[0], &view, &e2) == 0, "first unit after an abandoned pass: %s", e2.msg);
        trunk_pass_end(&p, 1);
        float row[4096];
        CHECK((size_t)m.cfg.hidden_size <= 4096 && trunk_embed_row(t, 3, row, &e2) == 0, "embedding row: %s", e2.msg);
        CHECK(trunk_embed_row(t, m.cfg.vocab_size, row, &e2) != 0, "an out-of-vocabulary embedding row must fail");
        { /* the read-ahead hint changes no row, and ignores ids outside the vocabulary */
            static float row2[4096];
            const int32_t toks[4] = {3, -1, m.cfg.vocab_size, m.cfg.vocab_size - 1};
            e2 = (k3_error){0};
            trunk_embed_prefetch(t, toks, 4);
            CHECK(trunk_embed_row(t, 3, row2, &e2) == 0 && memcmp(row, row2, (size_t)m.cfg.hidden_size * sizeof *row) == 0,
                  "embedding row after trunk_embed_prefetch differs: %s", e2.msg);
        }
        trunk_free(t);
    }
    free(ref);
    model_free(&m);
    if (check_report("test_trunk")) return 1;
    printf("test_trunk: ok\n");
    return 0;
}
