/* harness.h - what several unit tests need besides CHECK (check.h): each tests/unit/test_*.c is
 * one program and includes this once.
 *   die(msg)                 prints "fatal: msg" on stderr and exits 2 (set-up that cannot go on)
 *   test_tmpdir_make(name)   makes a fresh directory NAME.XXXXXX under $K3_TEST_TMP, else $TMPDIR,
 *                            else /tmp, into test_tmpdir (dies if it cannot)
 *   test_tmpdir_remove()     removes test_tmpdir and everything in it
 *   test_engine_open(te, d, rows, ctx)  model d (planned for `rows` rows and `ctx` positions, no
 *                            budget), its trunk, the in-process experts and an engine of 2 threads
 *                            with those limits; te->tok / te->fp are the caller's to fill (the
 *                            tokenizer is freed by test_engine_close when set)
 *   test_engine_close(te)
 * Define HARNESS_NO_ENGINE before including it to leave the engine part out (no model headers). */
#ifndef K3_TEST_HARNESS_H
#define K3_TEST_HARNESS_H

#include <ftw.h> /* the test defines _GNU_SOURCE first */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char test_tmpdir[512];

__attribute__((noreturn, unused)) static void die(const char *msg) {
    fprintf(stderr, "fatal: %s\n", msg);
    exit(2);
}

__attribute__((unused)) static void test_tmpdir_make(const char *name) {
    const char *base = getenv("K3_TEST_TMP");
    if (!base || !*base) base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    snprintf(test_tmpdir, sizeof test_tmpdir, "%s/%s.XXXXXX", base, name);
    if (!mkdtemp(test_tmpdir)) die("mkdtemp");
}

static int test_rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

__attribute__((unused)) static void test_tmpdir_remove(void) {
    if (test_tmpdir[0] && nftw(test_tmpdir, test_rm_cb, 16, FTW_DEPTH | FTW_PHYS) != 0)
        fprintf(stderr, "cannot remove %s\n", test_tmpdir);
}

#ifndef HARNESS_NO_ENGINE
#include "common/kernels.h"
#include "coordinator/experts_local.h"
#include "coordinator/forward.h"
#include "coordinator/model.h"
#include "coordinator/plan.h"
#include "coordinator/state_file.h"
#include "coordinator/tokenizer.h"
#include "coordinator/trunk.h"

typedef struct {
    k3_model m;
    mem_plan plan;
    trunk *tr;
    expert_backend eb;
    engine en;
    tokenizer *tok;        /* the caller's (NULL: none) */
    state_fingerprint fp;  /* the caller's */
} test_engine;

__attribute__((unused)) static void test_engine_open(test_engine *te, const char *dir, size_t rows, size_t ctx) {
    memset(te, 0, sizeof *te);
    k3_error err = {0};
    const kernels *k = kernels_get(SIMD_AUTO);
    if (!k) die("no kernels");
    if (model_load(dir, &te->m, &err)) die(err.msg);
    if (plan_make(&te->plan, &te->m.cfg, &te->m, 0, 0, rows, ctx, &err)) die(err.msg);
    trunk_config tc = {te->plan.n_pinned, te->plan.n_slots, te->plan.lm_chunk_rows, 0, 0};
    if (!(te->tr = trunk_create(&te->m, &tc, &err))) die(err.msg);
    if (experts_local_create(&te->eb, &te->m, k, te->plan.expert_cache_per_worker, CACHE_POLICY_DEFAULT, &err))
        die(err.msg);
    te->en = (engine){.model = &te->m, .trunk = te->tr, .k = k, .experts = &te->eb};
    if (engine_init(&te->en, rows, ctx, 2, &err)) die(err.msg);
}

__attribute__((unused)) static void test_engine_close(test_engine *te) {
    engine_free(&te->en);
    if (te->eb.destroy) te->eb.destroy(&te->eb);
    trunk_free(te->tr);
    plan_free(&te->plan);
    model_free(&te->m);
    if (te->tok) tokenizer_free(te->tok);
}
#endif

#endif
