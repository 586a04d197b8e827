/* bench_state.c - size and speed of state files for a model's config (no weights needed).
 *
 *   bin/bench_state MODEL_OR_CONFIG_DIR DIR POSITIONS... [--reps N]
 *
 * For each history length P: fills a sequence state (every KDA layer, P MLA rows) with
 * pseudo-random floats, then measures (median of N, default 3):
 *   save    state_file_save to DIR/bench.k3state (XXH64 of every section, write, fsync, rename,
 *           fsync of DIR)
 *   load    state_file_load of it (page cache warm: the file was just written), every check
 *   raw     the ceilings in the same run: write+fsync of the same bytes from one buffer (no
 *           hashing), read of them back (warm), XXH64 over them in memory, memcpy of them
 * and prints one markdown row per P: bytes, times, GB/s, and save/raw and load/raw ratios.
 * The file is removed at the end. Progress on stderr, results on stdout. */
#define _GNU_SOURCE
#include "common/hash64.h"
#include "coordinator/state_file.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmpd);
    return v[n / 2];
}

static void fill(float *p, size_t n, uint64_t *s) {
    for (size_t i = 0; i < n; i++) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (float)((int32_t)(*s >> 33) % 1000) * 1e-3f;
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: bench_state MODEL_OR_CONFIG_DIR DIR POSITIONS... [--reps N]\n");
        return 2;
    }
    int reps = 3;
    k3_config cfg;
    k3_error err = {0};
    if (config_load(argv[1], &cfg, &err)) { fprintf(stderr, "%s\n", err.msg); return 2; }
    char path[4096], raw[4096];
    snprintf(path, sizeof path, "%s/bench.k3state", argv[2]);
    snprintf(raw, sizeof raw, "%s/bench.raw", argv[2]);
    for (int a = 3; a < argc; a++)
        if (!strcmp(argv[a], "--reps") && a + 1 < argc) reps = atoi(argv[a + 1]);
    if (reps < 1 || reps > 50) reps = 3;
    state_fingerprint fp = {1, 2, 3, 4, 5};
    printf("| positions | file bytes | save s | load s | write+fsync s (raw) | read s (raw) | XXH64 GB/s | memcpy GB/s | save / raw | load / raw |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (int a = 3; a < argc; a++) {
        if (!strcmp(argv[a], "--reps")) { a++; continue; }
        size_t P = (size_t)strtoull(argv[a], NULL, 10);
        seq_state st;
        if (seq_state_init(&st, &cfg, &err) || seq_state_reserve(&st, &cfg, P ? P : 1, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        uint64_t seed = 1;
        size_t S = (size_t)cfg.kda_num_heads * cfg.kda_head_dim * cfg.kda_head_dim;
        size_t C = 3 * (size_t)(cfg.short_conv_kernel_size - 1) * cfg.kda_num_heads * cfg.kda_head_dim;
        size_t R = (size_t)cfg.kv_lora_rank + cfg.qk_rope_head_dim;
        for (int l = 0; l < cfg.num_hidden_layers; l++) {
            if (cfg.layer_is_mla[l]) fill(st.mla[l].cache, P * R, &seed);
            else { fill(st.kda[l].S, S, &seed); fill(st.kda[l].conv, C, &seed); }
        }
        st.pos = P;
        int32_t *ids = malloc((P + 1) * sizeof *ids);
        for (size_t i = 0; i <= P; i++) ids[i] = (int32_t)(i % (size_t)cfg.vocab_size);
        state_run run = {.kind = STATE_KIND_RUN, .gen_target = 1, .n_prompt = P};
        sampler_config_default(&run.sampling);
        uint64_t bytes = state_file_bytes(&cfg, P + 1, P, 0);
        double ts[50], tl[50], tw[50], tr[50], th[50], tm[50];
        char *buf = malloc(bytes), *buf2 = malloc(bytes);
        if (!ids || !buf || !buf2) { fprintf(stderr, "out of memory\n"); return 1; }
        memset(buf, 7, bytes);
        memset(buf2, 1, bytes);
        for (int r = 0; r < reps; r++) {
            fprintf(stderr, "bench_state: %zu positions, rep %d/%d\n", P, r + 1, reps);
            double t0 = now();
            if (state_file_save(path, &fp, &cfg, ids, P + 1, &st, &run, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
            ts[r] = now() - t0;
            seq_state l2;
            state_loaded ld;
            if (seq_state_init(&l2, &cfg, &err)) return 1;
            t0 = now();
            if (state_file_load(path, &fp, &cfg, P + 1, &l2, &ld, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
            tl[r] = now() - t0;
            state_loaded_free(&ld);
            seq_state_free(&l2);
            /* ceilings on the same bytes */
            t0 = now();
            int fd = open(raw, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            for (uint64_t o = 0; o < bytes;) {
                ssize_t k = write(fd, buf + o, bytes - o > (1u << 26) ? (1u << 26) : bytes - o);
                if (k <= 0) { perror("write"); return 1; }
                o += (uint64_t)k;
            }
            fsync(fd);
            close(fd);
            tw[r] = now() - t0;
            t0 = now();
            fd = open(raw, O_RDONLY);
            for (uint64_t o = 0; o < bytes;) {
                ssize_t k = read(fd, buf2 + o, bytes - o > (1u << 26) ? (1u << 26) : bytes - o);
                if (k <= 0) { perror("read"); return 1; }
                o += (uint64_t)k;
            }
            close(fd);
            tr[r] = now() - t0;
            t0 = now();
            volatile uint64_t h = hash64(buf2, bytes, 0);
            (void)h;
            th[r] = now() - t0;
            t0 = now();
            memcpy(buf2, buf, bytes);
            tm[r] = now() - t0;
        }
        unlink(raw);
        unlink(path);
        double s = median(ts, reps), l = median(tl, reps), w = median(tw, reps), rd = median(tr, reps);
        double h = median(th, reps), m = median(tm, reps);
        printf("| %zu | %llu | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f | %.2f | %.2f |\n", P, (unsigned long long)bytes, s,
               l, w, rd, bytes / h * 1e-9, bytes / m * 1e-9, s / w, l / rd);
        fflush(stdout);
        free(buf);
        free(buf2);
        free(ids);
        seq_state_free(&st);
    }
    config_free(&cfg);
    return 0;
}
