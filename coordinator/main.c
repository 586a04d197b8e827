/* main.c - bin/k3, the coordinator's command line.
 *
 *   bin/k3 MODEL_DIR (--ids 1,2,3 | --prompt TEXT | --prompt-file FILE) [--gen N]
 *          [--json FILE] [--dump-logits FILE] [--teacher-force] [--full-recompute]
 *          [--threads N] [--simd auto|scalar|avx2|avx512] [--chunk N]
 *
 * Exit status: 0 success, 2 usage error or refused model/input, 1 failure at run time.
 * Results go to stdout (ids) or the --json file; progress and logs to stderr. */
#include "common/kernels.h"
#include "coordinator/experts_local.h"
#include "coordinator/generate.h"
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

enum { EXIT_OK = 0, EXIT_RUNTIME = 1, EXIT_USAGE = 2 };

typedef struct {
    const char *model_dir, *ids_arg, *prompt, *prompt_file, *json_path, *logits_path;
    long gen, threads, chunk;
    int teacher_force, full_recompute;
    simd_level simd;
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: k3 MODEL_DIR (--ids 1,2,3 | --prompt TEXT | --prompt-file FILE) [options]\n"
            "  --gen N              tokens to generate greedily (default 16)\n"
            "  --json FILE          write prompt_ids, generated_ids, tf_pred, timing, peak RSS as JSON\n"
            "  --dump-logits FILE   raw float32 logits of every position that predicts a token\n"
            "  --teacher-force      also report the arg-max at every prompt position (tf_pred)\n"
            "  --full-recompute     recompute the whole sequence for every token (no carried state)\n"
            "  --threads N          OpenMP threads (default: all cores)\n"
            "  --simd LEVEL         auto|scalar|avx2|avx512 (default auto; all give the same bits)\n"
            "  --chunk N            prefill chunk size in tokens (default 64; never changes results)\n"
            "exit status: 0 ok, 2 usage or refused model/input, 1 run-time failure\n");
}

static int parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* "1,2,3" -> ids; strict: digits and single commas only. */
static int parse_ids(const char *s, int32_t **ids, size_t *n) {
    size_t cap = 16;
    *n = 0;
    *ids = malloc(cap * sizeof **ids);
    if (!*ids) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        if (*p < '0' || *p > '9') return -1;
        long v = strtol(p, &end, 10);
        if (errno || v > INT32_MAX) return -1;
        if (*n == cap) {
            int32_t *nb = realloc(*ids, 2 * cap * sizeof **ids);
            if (!nb) return -1;
            *ids = nb;
            cap *= 2;
        }
        (*ids)[(*n)++] = (int32_t)v;
        p = end;
        if (*p == ',') { p++; if (!*p) return -1; }
        else if (*p) return -1;
    }
    return *n ? 0 : -1;
}

static int parse_args(int argc, char **argv, options *o) {
    static const struct option longopts[] = {
        {"ids", required_argument, 0, 'i'},        {"prompt", required_argument, 0, 'p'},
        {"prompt-file", required_argument, 0, 'P'}, {"gen", required_argument, 0, 'g'},
        {"json", required_argument, 0, 'j'},       {"dump-logits", required_argument, 0, 'L'},
        {"teacher-force", no_argument, 0, 'T'},    {"full-recompute", no_argument, 0, 'F'},
        {"threads", required_argument, 0, 't'},    {"simd", required_argument, 0, 's'},
        {"chunk", required_argument, 0, 'c'},      {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    o->gen = 16;
    o->chunk = 64;
    o->simd = SIMD_AUTO;
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (ch) {
        case 'i': o->ids_arg = optarg; break;
        case 'p': o->prompt = optarg; break;
        case 'P': o->prompt_file = optarg; break;
        case 'j': o->json_path = optarg; break;
        case 'L': o->logits_path = optarg; break;
        case 'T': o->teacher_force = 1; break;
        case 'F': o->full_recompute = 1; break;
        case 'g':
            if (parse_long(optarg, 0, 1L << 24, &o->gen)) { fprintf(stderr, "k3: --gen wants an integer in [0, 16777216], got '%s'\n", optarg); return -1; }
            break;
        case 't':
            if (parse_long(optarg, 1, 4096, &o->threads)) { fprintf(stderr, "k3: --threads wants an integer in [1, 4096], got '%s'\n", optarg); return -1; }
            break;
        case 'c':
            if (parse_long(optarg, 1, 1 << 16, &o->chunk)) { fprintf(stderr, "k3: --chunk wants an integer in [1, 65536], got '%s'\n", optarg); return -1; }
            break;
        case 's':
            if (simd_level_parse(optarg, &o->simd)) { fprintf(stderr, "k3: --simd wants auto|scalar|avx2|avx512, got '%s'\n", optarg); return -1; }
            break;
        case 'h': usage(stdout); exit(EXIT_OK);
        default:
            fprintf(stderr, "k3: unknown or incomplete option '%s'\n", argv[optind - 1]);
            return -1;
        }
    }
    if (optind != argc - 1) { fprintf(stderr, "k3: expected exactly one MODEL_DIR\n"); return -1; }
    o->model_dir = argv[optind];
    int sources = !!o->ids_arg + !!o->prompt + !!o->prompt_file;
    if (sources != 1) { fprintf(stderr, "k3: give exactly one of --ids, --prompt, --prompt-file\n"); return -1; }
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static json_t *ids_json(const int32_t *ids, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

typedef struct {
    int32_t *seq;        /* prompt then generated ids */
    size_t n_prompt, n_gen;
    int32_t *tf_pred;
    float *rows;         /* logits rows, positions first_pos.. */
    size_t first_pos, n_rows;
    double prefill_s, decode_s;
} run_result;

/* Runs the generation; returns an exit status. */
static int run(engine *en, const options *o, run_result *r, k3_error *err) {
    const k3_config *c = &en->model->cfg;
    size_t V = (size_t)c->vocab_size, n = r->n_prompt, N = (size_t)o->gen;
    r->first_pos = o->teacher_force ? 0 : n - 1;
    size_t last_pos = N > 0 ? n + N - 2 : n - 1;
    r->n_rows = last_pos + 1 - r->first_pos;
    r->rows = malloc(r->n_rows * V * sizeof *r->rows);
    if (!r->rows) { k3_fail(err, "out of memory for %zu rows of logits", r->n_rows); return EXIT_RUNTIME; }
    seq_state st;
    if (seq_state_init(&st, c, err)) return EXIT_RUNTIME;
    int status = EXIT_RUNTIME;
    double t0 = now_s();
    int tty = isatty(2);
    if (!o->full_recompute) {
        if (feed_tokens(en, &st, r->seq, n, (size_t)o->chunk, r->first_pos, r->rows, err)) goto out;
    }
    r->prefill_s = now_s() - t0;
    t0 = now_s();
    for (size_t i = 0; i < (N > 0 ? N : 1); i++) {
        size_t pos = n - 1 + i; /* the position whose logits choose the next token */
        float *row = r->rows + (pos - r->first_pos) * V;
        if (o->full_recompute) {
            seq_state_reset(&st, c);
            size_t want = (i == 0) ? r->first_pos : pos;
            if (feed_tokens(en, &st, r->seq, pos + 1, (size_t)o->chunk, want, r->rows + (want - r->first_pos) * V, err)) goto out;
        } else if (i > 0) {
            if (feed_tokens(en, &st, r->seq + pos, 1, 1, pos, row, err)) goto out;
        }
        if (N == 0) break;
        int32_t next = argmax_logits(row, V);
        if (next < 0) { k3_fail(err, "non-finite logits at position %zu: refusing to emit a token", pos); goto out; }
        r->seq[n + i] = next;
        r->n_gen = i + 1;
        if (tty) fprintf(stderr, "\rk3: generated %zu/%zu", i + 1, N);
    }
    if (tty && N) fprintf(stderr, "\n");
    r->decode_s = now_s() - t0;
    if (o->teacher_force)
        for (size_t p = 0; p < n; p++) {
            r->tf_pred[p] = argmax_logits(r->rows + p * V, V);
            if (r->tf_pred[p] < 0) { k3_fail(err, "non-finite logits at position %zu", p); goto out; }
        }
    status = EXIT_OK;
out:
    seq_state_free(&st);
    return status;
}

static int write_outputs(const options *o, const run_result *r, const engine *en, double load_s, int threads) {
    size_t V = (size_t)en->model->cfg.vocab_size;
    if (o->logits_path) {
        FILE *f = fopen(o->logits_path, "wb");
        if (!f || fwrite(r->rows, sizeof(float) * V, r->n_rows, f) != r->n_rows || fclose(f) != 0) {
            fprintf(stderr, "k3: cannot write %s: %s\n", o->logits_path, strerror(errno));
            return EXIT_RUNTIME;
        }
    }
    for (size_t i = 0; i < r->n_gen; i++) printf("%s%d", i ? " " : "", r->seq[r->n_prompt + i]);
    printf("\n");
    if (o->json_path) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        json_t *j = json_object();
        json_object_set_new(j, "prompt_ids", ids_json(r->seq, r->n_prompt));
        json_object_set_new(j, "generated_ids", ids_json(r->seq + r->n_prompt, r->n_gen));
        if (o->teacher_force) json_object_set_new(j, "tf_pred", ids_json(r->tf_pred, r->n_prompt));
        json_object_set_new(j, "logits_first_position", json_integer((json_int_t)r->first_pos));
        json_object_set_new(j, "mode", json_string(o->full_recompute ? "full-recompute" : "incremental"));
        json_object_set_new(j, "threads", json_integer(threads));
        json_object_set_new(j, "simd", json_string(en->k->name));
        json_t *tm = json_object();
        json_object_set_new(tm, "load_s", json_real(load_s));
        json_object_set_new(tm, "prefill_s", json_real(r->prefill_s));
        json_object_set_new(tm, "decode_s", json_real(r->decode_s));
        json_object_set_new(tm, "decode_tokens_per_s", json_real(r->decode_s > 0 ? (double)r->n_gen / r->decode_s : 0));
        json_object_set_new(j, "timing", tm);
        json_object_set_new(j, "peak_rss_bytes", json_integer((json_int_t)ru.ru_maxrss * 1024));
        int bad = json_dump_file(j, o->json_path, JSON_INDENT(1) | JSON_COMPACT);
        json_decref(j);
        if (bad) { fprintf(stderr, "k3: cannot write %s\n", o->json_path); return EXIT_RUNTIME; }
    }
    return EXIT_OK;
}

int main(int argc, char **argv) {
    options o;
    if (parse_args(argc, argv, &o)) { usage(stderr); return EXIT_USAGE; }
    const kernels *k = kernels_get(o.simd);
    if (!k) {
        static const char *const names[] = {"auto", "scalar", "avx2", "avx512"};
        fprintf(stderr, "k3: --simd %s is not supported by this CPU or build\n", names[o.simd]);
        return EXIT_USAGE;
    }
    if (o.threads) omp_set_num_threads((int)o.threads);
    int threads = omp_get_max_threads();
    if (o.prompt || o.prompt_file) {
        fprintf(stderr, "k3: text prompts need the tokenizer, which this build does not have yet; use --ids\n");
        return EXIT_USAGE;
    }
    run_result r = {0};
    int32_t *prompt;
    size_t n;
    if (parse_ids(o.ids_arg, &prompt, &n)) {
        fprintf(stderr, "k3: --ids wants a comma-separated list of non-negative integers, got '%s'\n", o.ids_arg);
        free(prompt);
        return EXIT_USAGE;
    }
    double t0 = now_s();
    k3_model m;
    k3_error err = {0};
    if (model_load(o.model_dir, &m, &err)) {
        fprintf(stderr, "k3: refusing model: %s\n", err.msg);
        free(prompt);
        return EXIT_USAGE;
    }
    double load_s = now_s() - t0;
    int status = EXIT_USAGE;
    for (size_t i = 0; i < n; i++)
        if (prompt[i] >= m.cfg.vocab_size) {
            fprintf(stderr, "k3: prompt id %d is outside the vocabulary [0, %d)\n", prompt[i], m.cfg.vocab_size);
            goto done;
        }
    r.n_prompt = n;
    r.seq = malloc((n + (size_t)o.gen) * sizeof *r.seq);
    r.tf_pred = malloc(n * sizeof *r.tf_pred);
    status = EXIT_RUNTIME;
    if (!r.seq || !r.tf_pred) { fprintf(stderr, "k3: out of memory\n"); goto done; }
    memcpy(r.seq, prompt, n * sizeof *prompt);
    expert_backend eb;
    if (experts_local_create(&eb, &m, k, &err)) { fprintf(stderr, "k3: %s\n", err.msg); goto done; }
    engine en = {.model = &m, .k = k, .experts = &eb};
    status = run(&en, &o, &r, &err);
    if (status != EXIT_OK) fprintf(stderr, "k3: %s\n", err.msg);
    else status = write_outputs(&o, &r, &en, load_s, threads);
    eb.destroy(&eb);
done:
    free(prompt);
    free(r.seq);
    free(r.tf_pred);
    free(r.rows);
    model_free(&m);
    return status;
}
