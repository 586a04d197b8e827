#define _GNU_SOURCE
/* Job: unit tests for state files (coordinator/state_file.c), prefix snapshots
 * (coordinator/snapshots.c) and XXH64 (common/hash64.c), on tests/models/m13, run from the
 * repository root (make test).
 *   - XXH64: published test vectors, streaming in odd pieces == one shot.
 *   - fingerprint: stable for one model, differs for m14b12 in the config part.
 *   - round trip: state after feeding part of a prompt -> file -> fresh state is bit-identical
 *     (every KDA S/conv, the MLA rows, ids, pos, run settings, generator); continuing from it
 *     gives the logits of a cold run bit for bit.
 *   - refusals, each with its reason: other config/tokenizer/weights/numerics, future version,
 *     bad magic, truncated at every section boundary and inside, a flipped bit in every section
 *     (the message names it), history beyond max_positions, trailing bytes.
 *   - atomic write: a failed save (K3_STATE_FAULT=fail:N) and a crash mid-save (crash:N, in a
 *     child) leave the previous file loadable and unchanged.
 *   - snapshots: memory hit, disk hit from a new store, longest prefix wins, logits equal a cold
 *     run, a corrupt or foreign disk snapshot is refused and removed, LRU eviction by file. */
#include "common/hash64.h"
#include "common/kernels.h"
#include "coordinator/experts_local.h"
#include "coordinator/generate.h"
#include "coordinator/plan.h"
#include "coordinator/snapshots.h"
#include "coordinator/state_file.h"
#include "coordinator/trunk.h"
#include "tests/unit/check.h"
#include "tests/unit/harness.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>


/* ------------------------------------------------------------------ hash */

static void test_hash(void) {
    static const struct { const char *s; uint64_t h; } v[] = {
        {"", 0xef46db3751d8e999ull},
        {"a", 0xd24ec4f1a98c6e5bull},
        {"abc", 0x44bc2cf5ad770999ull},
        {"Nobody inspects the spammish repetition", 0xfbcea83c8a378bf1ull},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        CHECK(hash64(v[i].s, strlen(v[i].s), 0) == v[i].h, "xxh64('%s')", v[i].s);
    uint8_t buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (uint8_t)(i * 7 + 3);
    uint64_t one = hash64(buf, sizeof buf, 42);
    hash64_state h;
    hash64_init(&h, 42);
    size_t off = 0, step = 1;
    while (off < sizeof buf) {
        size_t n = step < sizeof buf - off ? step : sizeof buf - off;
        hash64_update(&h, buf + off, n);
        off += n;
        step = step * 3 % 37 + 1;
    }
    CHECK(hash64_digest(&h) == one, "streaming == one shot");
}

/* ------------------------------------------------------------------ engine */

#define NP 20
static int32_t prompt[NP];

static void make_prompt(int V) {
    for (int i = 0; i < NP; i++) prompt[i] = (int32_t)((i * 37 + 11) % V);
}

/* Feeds ids into st and returns the logits of the last one (malloc'd). */
static float *feed(test_engine *te, seq_state *st, const int32_t *ids, size_t n, size_t chunk) {
    size_t V = (size_t)te->m.cfg.vocab_size;
    float *row = malloc(V * sizeof *row);
    k3_error err = {0};
    if (!row || feed_tokens(&te->en, st, ids, n, chunk, st->pos + n - 1, row, &err)) die(err.msg);
    return row;
}

static float *cold_logits(test_engine *te, size_t n) {
    seq_state st;
    k3_error err = {0};
    if (seq_state_init(&st, &te->m.cfg, &err)) die(err.msg);
    float *r = feed(te, &st, prompt, n, 64);
    seq_state_free(&st);
    return r;
}

static int states_equal(const k3_config *c, const seq_state *a, const seq_state *b) {
    if (a->pos != b->pos) return 0;
    size_t S = (size_t)c->kda_num_heads * c->kda_head_dim * c->kda_head_dim;
    size_t C = 3 * (size_t)(c->short_conv_kernel_size - 1) * c->kda_num_heads * c->kda_head_dim;
    size_t R = (size_t)c->kv_lora_rank + c->qk_rope_head_dim;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (c->layer_is_mla[l]) {
            if (memcmp(a->mla[l].cache, b->mla[l].cache, a->pos * R * 4)) return 0;
        } else if (memcmp(a->kda[l].S, b->kda[l].S, S * 4) || memcmp(a->kda[l].conv, b->kda[l].conv, C * 4))
            return 0;
    }
    return 1;
}

static char *path_in(const char *name) {
    static char p[4][768];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", test_tmpdir, name);
    return p[k];
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) die(path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    if (!b || fread(b, 1, (size_t)len, f) != (size_t)len) die("read");
    fclose(f);
    *n = (size_t)len;
    return b;
}

static int32_t stops[2] = {5, 7};

static state_run sample_run(void) {
    state_run r = {.kind = STATE_KIND_RUN, .text = 1, .gen_target = 16, .n_prompt = 12, .ckpt_every = 3};
    sampler_config_default(&r.sampling);
    r.sampling.temperature = 0.7;
    r.sampling.top_k = 40;
    r.sampling.seed = 9;
    k3_rng_seed(&r.rng, 9);
    k3_rng_next(&r.rng);
    r.stop_ids = stops;
    r.n_stop_ids = 2;
    return r;
}

/* Loads bytes; returns the rc and leaves the message in msg. */
static int load_bytes(test_engine *te, const unsigned char *b, size_t n, size_t maxp, const state_fingerprint *fp,
                      char *msg, size_t msglen) {
    seq_state st;
    k3_error err = {0};
    if (seq_state_init(&st, &te->m.cfg, &err)) die(err.msg);
    state_loaded ld;
    int rc = state_file_load_mem(b, n, "mem", fp ? fp : &te->fp, &te->m.cfg, maxp, &st, &ld, &err);
    snprintf(msg, msglen, "%s", err.msg);
    if (rc == 0) state_loaded_free(&ld);
    seq_state_free(&st);
    return rc;
}

static void test_round_trip(test_engine *te) {
    const k3_config *c = &te->m.cfg;
    size_t V = (size_t)c->vocab_size;
    k3_error err = {0};
    seq_state st;
    if (seq_state_init(&st, c, &err)) die(err.msg);
    free(feed(te, &st, prompt, 10, 4));
    state_run run = sample_run();
    const char *f = path_in("a.k3state");
    CHECK(state_file_save(f, &te->fp, c, prompt, 12, &st, &run, &err) == 0, "save: %s", err.msg);
    struct stat sb;
    CHECK(stat(f, &sb) == 0 && (uint64_t)sb.st_size == state_file_bytes(c, 12, 10, 2), "size %lld vs %llu",
          (long long)sb.st_size, (unsigned long long)state_file_bytes(c, 12, 10, 2));
    CHECK((sb.st_mode & 0777) == 0600, "mode %o", sb.st_mode & 0777);
    CHECK(access(path_in("a.k3state.k3tmp"), F_OK) != 0, "no temporary left");
    seq_state st2;
    if (seq_state_init(&st2, c, &err)) die(err.msg);
    state_loaded ld;
    int rc = state_file_load(f, &te->fp, c, 4096, &st2, &ld, &err);
    CHECK(rc == 0, "load: %s", err.msg);
    if (rc) return;
    CHECK(states_equal(c, &st, &st2), "state bits");
    CHECK(ld.n_ids == 12 && !memcmp(ld.ids, prompt, 12 * 4), "ids");
    CHECK(ld.run.kind == STATE_KIND_RUN && ld.run.text == 1 && ld.run.gen_target == 16 && ld.run.n_prompt == 12 &&
              ld.run.ckpt_every == 3,
          "run fields");
    CHECK(ld.run.sampling.temperature == 0.7 && ld.run.sampling.top_k == 40 && ld.run.sampling.seed == 9 &&
              ld.run.sampling.top_p == 1.0 && ld.run.sampling.min_p == 0.0,
          "sampler settings");
    CHECK(!memcmp(&ld.run.rng, &run.rng, sizeof run.rng), "generator state");
    CHECK(ld.run.n_stop_ids == 2 && ld.run.stop_ids[0] == 5 && ld.run.stop_ids[1] == 7, "stop ids");
    /* continuing from the loaded state == a cold run, bit for bit */
    float *a = feed(te, &st2, prompt + 10, NP - 10, 3);
    float *b = cold_logits(te, NP);
    CHECK(!memcmp(a, b, V * 4), "logits after load == cold");
    free(a);
    free(b);
    state_loaded_free(&ld);
    seq_state_free(&st);
    seq_state_free(&st2);
}

/* Section boundaries of a file: offsets of every section header. */
static size_t sections(const unsigned char *b, size_t n, size_t *off, size_t max) {
    size_t k = 0, o = 24;
    while (o + 24 <= n && k < max) {
        uint64_t len;
        memcpy(&len, b + o + 8, 8);
        off[k++] = o;
        o += 24 + len;
    }
    return k;
}

static void test_refusals(test_engine *te) {
    const k3_config *c = &te->m.cfg;
    size_t n;
    unsigned char *b = slurp(path_in("a.k3state"), &n);
    char msg[1024];
    CHECK(load_bytes(te, b, n, 4096, NULL, msg, sizeof msg) == 0, "pristine loads: %s", msg);
    /* fingerprints, part by part */
    static const char *const want[5] = {"config.json", "tiktoken.model", "tokenizer_config.json", "weights",
                                        "numerics"};
    for (int i = 0; i < 5; i++) {
        state_fingerprint fp = te->fp;
        ((uint64_t *)&fp)[i] ^= 1;
        CHECK(load_bytes(te, b, n, 4096, &fp, msg, sizeof msg) == -1 && strstr(msg, want[i]), "fp part %d: %s", i, msg);
    }
    /* future version (header checksum fixed up) */
    unsigned char *m = malloc(n);
    memcpy(m, b, n);
    uint32_t v = 7;
    memcpy(m + 8, &v, 4);
    uint64_t hs = hash64(m, 16, 0);
    memcpy(m + 16, &hs, 8);
    CHECK(load_bytes(te, m, n, 4096, NULL, msg, sizeof msg) == -1 && strstr(msg, "newer") && strstr(msg, "version 7"),
          "future: %s", msg);
    memcpy(m, b, n);
    m[0] = 'X';
    CHECK(load_bytes(te, m, n, 4096, NULL, msg, sizeof msg) == -1 && strstr(msg, "not a k3 state file"), "magic: %s",
          msg);
    memcpy(m, b, n);
    m[9] ^= 4;
    CHECK(load_bytes(te, m, n, 4096, NULL, msg, sizeof msg) == -1 && strstr(msg, "header"), "header flip: %s", msg);
    /* truncated everywhere interesting */
    size_t off[128];
    size_t ns = sections(b, n, off, 128);
    CHECK(ns == (size_t)(3 + c->num_hidden_layers), "%zu sections", ns);
    for (size_t i = 0; i < ns; i++) {
        size_t cuts[3] = {off[i], off[i] + 10, off[i] + 30};
        for (int j = 0; j < 3; j++) {
            if (cuts[j] >= n) continue;
            CHECK(load_bytes(te, b, cuts[j], 4096, NULL, msg, sizeof msg) == -1 && strstr(msg, "truncated"),
                  "cut at %zu: %s", cuts[j], msg);
        }
    }
    CHECK(load_bytes(te, b, n - 1, 4096, NULL, msg, sizeof msg) == -1 && strstr(msg, "truncated"), "cut 1: %s", msg);
    /* a flipped bit in every section's payload names that section */
    for (size_t i = 0; i < ns; i++) {
        uint64_t len;
        memcpy(&len, b + off[i] + 8, 8);
        if (len == 0) continue;
        memcpy(m, b, n);
        m[off[i] + 24 + len / 2] ^= 0x10;
        char tag[5] = {0};
        memcpy(tag, b + off[i], 4);
        uint32_t idx;
        memcpy(&idx, b + off[i] + 4, 4);
        char name[48];
        if (!strcmp(tag, "FPRT")) snprintf(name, sizeof name, "'fingerprint'");
        else if (!strcmp(tag, "RUN ")) snprintf(name, sizeof name, "'run settings'");
        else if (!strcmp(tag, "TOKS")) snprintf(name, sizeof name, "'token history'");
        else snprintf(name, sizeof name, "'%.3s layer %u'", tag, idx);
        CHECK(load_bytes(te, m, n, 4096, NULL, msg, sizeof msg) == -1 && strstr(msg, name) && strstr(msg, "checksum"),
              "flip in %s: %s", name, msg);
        /* and in the section's length field */
        memcpy(m, b, n);
        m[off[i] + 8] ^= 0x04;
        CHECK(load_bytes(te, m, n, 4096, NULL, msg, sizeof msg) == -1, "length flip in %s accepted", name);
    }
    /* a section length near 2^64 (off + len wraps past the file's end; fuzz_state found it reading past
     * the buffer): every section, the buffer cut 4 bytes into its payload, in an allocation of
     * exactly that size (make asan sees any read past it) */
    for (size_t i = 0; i < ns; i++) {
        const size_t cut = off[i] + 24 + 4;
        if (cut > n) continue;
        unsigned char *w = malloc(cut);
        memcpy(w, b, cut);
        const uint64_t huge = UINT64_MAX - 147; /* 2^64 - 148: a multiple of 4 past the history's 16 fixed bytes */
        memcpy(w + off[i] + 8, &huge, 8);
        CHECK(load_bytes(te, w, cut, 4096, NULL, msg, sizeof msg) == -1, "a wrapping length in section %zu accepted", i);
        free(w);
    }
    /* history beyond the limit */
    CHECK(load_bytes(te, b, n, 11, NULL, msg, sizeof msg) == -1 && strstr(msg, "exceeds --max-context 11"),
          "max: %s", msg);
    CHECK(load_bytes(te, b, n, 12, NULL, msg, sizeof msg) == 0, "12 fits: %s", msg);
    /* trailing bytes */
    unsigned char *t = malloc(n + 3);
    memcpy(t, b, n);
    memset(t + n, 0, 3);
    CHECK(load_bytes(te, t, n + 3, 4096, NULL, msg, sizeof msg) == -1 && strstr(msg, "unexpected bytes"), "trail: %s",
          msg);
    free(t);
    free(m);
    free(b);
}

static void test_atomic(test_engine *te) {
    const k3_config *c = &te->m.cfg;
    k3_error err = {0};
    const char *f = path_in("a.k3state");
    size_t n0, n1;
    unsigned char *before = slurp(f, &n0);
    seq_state st;
    if (seq_state_init(&st, c, &err)) die(err.msg);
    free(feed(te, &st, prompt, 15, 64));
    state_run run = sample_run();
    setenv("K3_STATE_FAULT", "fail:1000", 1);
    CHECK(state_file_save(f, &te->fp, c, prompt, 16, &st, &run, &err) == -1 && strstr(err.msg, "write failed"),
          "fault: %s", err.msg);
    unsetenv("K3_STATE_FAULT");
    unsigned char *after = slurp(f, &n1);
    CHECK(n0 == n1 && !memcmp(before, after, n0), "a failed save changed the previous file");
    CHECK(access(path_in("a.k3state.k3tmp"), F_OK) != 0, "failed save removed its temporary");
    free(after);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("K3_STATE_FAULT", "crash:5000", 1);
        k3_error e2 = {0};
        state_file_save(f, &te->fp, c, prompt, 16, &st, &run, &e2);
        _exit(0);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 3, "child crashed mid-save (status %d)", ws);
    after = slurp(f, &n1);
    CHECK(n0 == n1 && !memcmp(before, after, n0), "a crash mid-save changed the previous file");
    char msg[1024];
    CHECK(load_bytes(te, after, n1, 4096, NULL, msg, sizeof msg) == 0, "previous still loads: %s", msg);
    free(after);
    /* and a good save replaces it */
    CHECK(state_file_save(f, &te->fp, c, prompt, 16, &st, &run, &err) == 0, "save: %s", err.msg);
    after = slurp(f, &n1);
    CHECK(n1 == state_file_bytes(c, 16, 15, 2), "new size");
    free(after);
    free(before);
    seq_state_free(&st);
}

static void test_fingerprint(test_engine *te) {
    state_fingerprint again, other;
    k3_error err = {0};
    CHECK(state_fingerprint_compute(&again, "tests/models/m13", NULL, &te->m.ck, &err) == 0, "%s", err.msg);
    CHECK(!memcmp(&again, &te->fp, sizeof again), "stable");
    k3_model m2;
    if (model_load("tests/models/m14b12", &m2, &err)) die(err.msg);
    CHECK(state_fingerprint_compute(&other, "tests/models/m14b12", NULL, &m2.ck, &err) == 0, "%s", err.msg);
    CHECK(other.config != te->fp.config && other.weights != te->fp.weights && other.numerics == te->fp.numerics,
          "m14b12 differs");
    model_free(&m2);
}

/* ------------------------------------------------------------------ snapshots */

static void test_snapshots(test_engine *te) {
    const k3_config *c = &te->m.cfg;
    size_t V = (size_t)c->vocab_size;
    k3_error err = {0};
    float *cold = cold_logits(te, NP);
    char dir[768];
    snprintf(dir, sizeof dir, "%s/snaps", test_tmpdir);
    snap_options o = {.cfg = c, .fp = &te->fp, .mem_cap = 1 << 30, .dir = dir, .disk_cap = 1 << 30,
                      .max_positions = 4096, .log = stderr};
    snap_store *s;
    CHECK(snap_store_open(&s, &o, &err) == 0, "open: %s", err.msg);
    seq_state st, st2;
    if (seq_state_init(&st, c, &err) || seq_state_init(&st2, c, &err)) die(err.msg);
    free(feed(te, &st, prompt, 6, 64));
    CHECK(snap_insert(s, prompt, &st, &err) == 0, "insert 6: %s", err.msg);
    free(feed(te, &st, prompt + 6, 6, 64));
    CHECK(snap_insert(s, prompt, &st, &err) == 0, "insert 12: %s", err.msg);
    /* the longest prefix wins */
    CHECK(snap_lookup(s, prompt, NP, NP - 1, &st2, &err) == 12, "lookup: %s", err.msg);
    float *a = feed(te, &st2, prompt + 12, NP - 12, 64);
    CHECK(!memcmp(a, cold, V * 4), "from memory snapshot == cold");
    free(a);
    /* max_len respected; another prompt misses */
    seq_state_reset(&st2, c);
    CHECK(snap_lookup(s, prompt, NP, 11, &st2, &err) == 6, "max_len 11 -> 6");
    int32_t other[NP];
    memcpy(other, prompt, sizeof other);
    other[2] ^= 1;
    CHECK(snap_lookup(s, other, NP, NP - 1, &st2, &err) == 0, "other prompt misses");
    snap_stats ss = snap_get_stats(s);
    CHECK(ss.mem_entries == 2 && ss.disk_files == 2 && ss.hits_mem == 2 && ss.misses == 1, "stats %zu %zu %llu %llu",
          ss.mem_entries, ss.disk_files, (unsigned long long)ss.hits_mem, (unsigned long long)ss.misses);
    snap_store_free(s);
    /* a new store (no memory tier) finds them on disk */
    o.mem_cap = 0;
    CHECK(snap_store_open(&s, &o, &err) == 0, "reopen: %s", err.msg);
    seq_state_reset(&st2, c);
    CHECK(snap_lookup(s, prompt, NP, NP - 1, &st2, &err) == 12, "disk lookup: %s", err.msg);
    a = feed(te, &st2, prompt + 12, NP - 12, 5);
    CHECK(!memcmp(a, cold, V * 4), "from disk snapshot == cold");
    free(a);
    snap_store_free(s);
    /* corrupt the 12-position file: refused, removed, falls back to 6 */
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "ls %s/*-12.k3snap", dir);
    FILE *p = popen(cmd, "r");
    char f12[1024] = {0};
    if (!p || !fgets(f12, sizeof f12, p)) die("no 12 snapshot");
    pclose(p);
    f12[strcspn(f12, "\n")] = 0;
    int fd = open(f12, O_RDWR);
    unsigned char byte;
    CHECK(pread(fd, &byte, 1, 600) == 1, "read");
    byte ^= 1;
    CHECK(pwrite(fd, &byte, 1, 600) == 1, "write");
    close(fd);
    CHECK(snap_store_open(&s, &o, &err) == 0, "reopen: %s", err.msg);
    seq_state_reset(&st2, c);
    CHECK(snap_lookup(s, prompt, NP, NP - 1, &st2, &err) == 6, "corrupt one skipped");
    ss = snap_get_stats(s);
    CHECK(ss.refused == 1 && access(f12, F_OK) != 0, "refused and removed");
    a = feed(te, &st2, prompt + 6, NP - 6, 64);
    CHECK(!memcmp(a, cold, V * 4), "from the 6 snapshot == cold");
    free(a);
    snap_store_free(s);
    /* another model's snapshot (renamed to this model's name for the prompt): refused */
    {
        state_fingerprint fp2 = te->fp;
        fp2.config ^= 1;
        char dir2[800];
        snprintf(dir2, sizeof dir2, "%s/snaps2", test_tmpdir);
        snap_options o2 = o;
        o2.fp = &fp2;
        o2.dir = dir2;
        seq_state_reset(&st, c);
        free(feed(te, &st, prompt, 12, 64));
        CHECK(snap_store_open(&s, &o2, &err) == 0 && snap_insert(s, prompt, &st, &err) == 0, "foreign: %s", err.msg);
        snap_store_free(s);
        CHECK(snap_store_open(&s, &o, &err) == 0 && snap_insert(s, prompt, &st, &err) == 0, "own: %s", err.msg);
        snap_store_free(s);
        snprintf(cmd, sizeof cmd, "cp %s/*-12.k3snap %s", dir2, f12);
        CHECK(system(cmd) == 0, "%s", cmd);
        CHECK(snap_store_open(&s, &o, &err) == 0, "reopen: %s", err.msg);
        seq_state_reset(&st2, c);
        CHECK(snap_lookup(s, prompt, NP, NP - 1, &st2, &err) == 6, "foreign refused");
        CHECK(snap_get_stats(s).refused == 1, "counted");
        snap_store_free(s);
    }
    /* LRU by file: a cap that holds one file keeps the newest */
    uint64_t one = state_file_bytes(c, 12, 12, 0);
    o.disk_cap = one + one / 2;
    CHECK(snap_store_open(&s, &o, &err) == 0, "reopen: %s", err.msg);
    seq_state_reset(&st, c);
    free(feed(te, &st, prompt, 12, 64));
    CHECK(snap_insert(s, prompt, &st, &err) == 0, "insert: %s", err.msg);
    free(feed(te, &st, prompt + 12, 2, 64));
    CHECK(snap_insert(s, prompt, &st, &err) == 0, "insert: %s", err.msg);
    ss = snap_get_stats(s);
    CHECK(ss.disk_files == 1 && ss.disk_bytes <= o.disk_cap, "evicted to %zu files %llu bytes", ss.disk_files,
          (unsigned long long)ss.disk_bytes);
    seq_state_reset(&st2, c);
    CHECK(snap_lookup(s, prompt, NP, NP - 1, &st2, &err) == 14, "newest kept");
    snap_store_free(s);
    /* memory tier LRU */
    o.dir = NULL;
    o.mem_cap = state_bytes_at(c, 14) + 14 * 4 + 100;
    CHECK(snap_store_open(&s, &o, &err) == 0, "open mem: %s", err.msg);
    seq_state_reset(&st, c);
    free(feed(te, &st, prompt, 6, 64));
    snap_insert(s, prompt, &st, &err);
    free(feed(te, &st, prompt + 6, 8, 64));
    snap_insert(s, prompt, &st, &err);
    ss = snap_get_stats(s);
    CHECK(ss.mem_entries == 1 && ss.evictions == 1 && ss.mem_bytes <= o.mem_cap, "mem LRU");
    snap_store_free(s);
    seq_state_free(&st);
    seq_state_free(&st2);
    free(cold);
}

int main(void) {
    test_tmpdir_make("test_state");
    test_hash();
    test_engine te;
    test_engine_open(&te, "tests/models/m13", 64, 4096);
    k3_error err = {0};
    if (state_fingerprint_compute(&te.fp, "tests/models/m13", NULL, &te.m.ck, &err)) die(err.msg);
    make_prompt(te.m.cfg.vocab_size);
    test_fingerprint(&te);
    test_round_trip(&te);
    test_refusals(&te);
    test_atomic(&te);
    test_snapshots(&te);
    test_engine_close(&te);
    test_tmpdir_remove();
    return check_report("test_state");
}
