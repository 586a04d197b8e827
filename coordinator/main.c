/* main.c - bin/k3, the coordinator's command line.
 *
 *   bin/k3 MODEL_DIR (--ids 1,2,3 | --prompt TEXT | --prompt-file FILE) [--gen N]
 *          [--json FILE] [--dump-logits FILE] [--teacher-force] [--full-recompute]
 *          [--threads N] [--simd auto|scalar|avx2|avx512] [--chunk N]
 *          [--workers N] [--workers-per-node N] [--numa auto|off] [--worker-threads N]
 *          [--expert-cache-mb MB] [--worker-timeout-ms MS] [--max-restarts N]
 *   bin/k3 --tok DIR (--encode FILE | --decode FILE) [--no-special]
 *
 * Exit status: 0 success, 2 usage error or refused model/input, 1 failure at run time.
 * Results go to stdout (ids) or the --json file; progress and logs to stderr. */
#include "common/kernels.h"
#include "coordinator/chat_repl.h"
#include "coordinator/sampler.h"
#include "coordinator/experts_local.h"
#include "coordinator/generate.h"
#include "coordinator/plan.h"
#include "coordinator/tokenize_cmd.h"
#include "coordinator/tokenizer.h"
#include "coordinator/workers_pool.h"
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <numa.h>
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
    const char *tok_dir, *encode_file, *decode_file, *trace_path;
    long gen, threads, chunk;
    int teacher_force, full_recompute, no_special;
    simd_level simd;
    /* expert servers */
    long workers, workers_per_node, worker_threads, timeout_ms, max_restarts;
    double cache_mb;
    int numa;
    /* memory */
    double mem_gb;              /* 0: not given */
    const char *preset;
    int list_presets, plan_only;
    long max_context;
    /* sampling and chat */
    sampler_config sampling;
    int chat, thinking;
    const char *system;
    chat_template tmpl;
    long max_tokens;
    int32_t *stop_ids;
    size_t n_stop_ids;
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: k3 MODEL_DIR (--ids 1,2,3 | --prompt TEXT | --prompt-file FILE) [options]\n"
            "  --gen N              tokens to generate (default 16; greedy unless --temperature > 0)\n"
            "  --temperature T      sample: T in [0, 100], 0 = greedy arg-max (default)\n"
            "  --top-k K  --top-p P  --min-p M   filters when sampling (0 / 1 / 0 = off)\n"
            "  --seed S             RNG seed for sampling (default 0; same seed, same ids everywhere)\n"
            "  --stop-id N          also stop at token id N (repeatable or N,M,...)\n"
            "  --chat               interactive chat on stdin/stdout (no prompt argument); /reset, /exit\n"
            "  --system TEXT        chat: system message (\"\" = none)\n"
            "  --thinking | --no-thinking   chat: K3 think or response section (default thinking)\n"
            "  --template auto|k3|k2        chat template (default: from the tokenizer's specials)\n"
            "  --max-tokens N       chat: tokens per reply at most (default 512)\n"
            "  --json FILE          write prompt_ids, generated_ids, tf_pred, timing, peak RSS as JSON\n"
            "  --dump-logits FILE   raw float32 logits of every position that predicts a token\n"
            "  --teacher-force      also report the arg-max at every prompt position (tf_pred)\n"
            "  --full-recompute     recompute the whole sequence for every token (no carried state)\n"
            "  --threads N          OpenMP threads (default: all cores)\n"
            "  --simd LEVEL         auto|scalar|avx2|avx512 (default auto; all give the same bits)\n"
            "  --chunk N            prefill chunk size in tokens (default 64; never changes results)\n"
            "  --workers N          expert-server processes (0 = experts in-process; default one per NUMA node)\n"
            "  --workers-per-node N expert servers per NUMA node when --workers is not given (default 1)\n"
            "  --numa auto|off      bind each expert server to its node (auto, multi-node machines only)\n"
            "  --worker-threads N   OpenMP threads per expert server (default: --threads / workers)\n"
            "  --expert-cache-mb MB expert cache per server (default: all of its experts, at most 4096)\n"
            "  --worker-timeout-ms MS  restart a server that makes no progress this long (default 30000)\n"
            "  --max-restarts N     restarts allowed per server before the run fails (default 3)\n"
            "  --mem-gb X           total memory budget in GiB for all processes (fractions allowed)\n"
            "  --preset NAME        laptop|desktop|workstation|server|max|auto (default auto); --list-presets\n"
            "  --plan-only          print the memory plan (config.json alone is enough) and exit\n"
            "  --max-context N      positions the MLA cache is planned for (default: prompt + gen)\n"
            "  --dump-expert-trace FILE  write every routing decision (position, layer, top-k ids)\n"
            "  k3 --tok DIR --encode FILE [--no-special] | --decode FILE   tokenizer only\n"
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

static int num_opt(const char *name, const char *arg, long lo, long hi, long *out) {
    if (parse_long(arg, lo, hi, out) == 0) return 0;
    fprintf(stderr, "k3: %s wants an integer in [%ld, %ld], got '%s'\n", name, lo, hi, arg);
    return -1;
}

static int parse_args(int argc, char **argv, options *o) {
    static const struct option longopts[] = {
        {"ids", required_argument, 0, 'i'},        {"prompt", required_argument, 0, 'p'},
        {"prompt-file", required_argument, 0, 'P'}, {"gen", required_argument, 0, 'g'},
        {"json", required_argument, 0, 'j'},       {"dump-logits", required_argument, 0, 'L'},
        {"teacher-force", no_argument, 0, 'T'},    {"full-recompute", no_argument, 0, 'F'},
        {"threads", required_argument, 0, 't'},    {"simd", required_argument, 0, 's'},
        {"chunk", required_argument, 0, 'c'},      {"help", no_argument, 0, 'h'},
        {"workers", required_argument, 0, 'W'},    {"workers-per-node", required_argument, 0, 'N'},
        {"numa", required_argument, 0, 'U'},       {"worker-threads", required_argument, 0, 'R'},
        {"expert-cache-mb", required_argument, 0, 'M'}, {"worker-timeout-ms", required_argument, 0, 'O'},
        {"max-restarts", required_argument, 0, 'X'},  {"mem-gb", required_argument, 0, 'G'},
        {"preset", required_argument, 0, 'S'},     {"list-presets", no_argument, 0, 'Z'},
        {"plan-only", no_argument, 0, 'Y'},        {"max-context", required_argument, 0, 'C'},  {"dump-expert-trace", required_argument, 0, 'A'},
        {"tok", required_argument, 0, 'k'},        {"encode", required_argument, 0, 'e'},
        {"decode", required_argument, 0, 'd'},     {"no-special", no_argument, 0, 'n'},
        {"temperature", required_argument, 0, 256}, {"top-k", required_argument, 0, 256},
        {"top-p", required_argument, 0, 256},       {"min-p", required_argument, 0, 256},
        {"seed", required_argument, 0, 256},        {"stop-id", required_argument, 0, 257},
        {"chat", no_argument, 0, 258},              {"system", required_argument, 0, 259},
        {"thinking", no_argument, 0, 260},          {"no-thinking", no_argument, 0, 261},
        {"template", required_argument, 0, 262},    {"max-tokens", required_argument, 0, 263},
        {0, 0, 0, 0}};
    memset(o, 0, sizeof *o);
    o->gen = 16;
    o->chunk = 64;
    o->simd = SIMD_AUTO;
    o->workers = -1;
    o->workers_per_node = 1;
    o->timeout_ms = 30000;
    o->max_restarts = 3;
    o->numa = 1;
    sampler_config_default(&o->sampling);
    o->thinking = 1;
    o->max_tokens = 512;
    int ch, li = -1;
    char e[256];
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "h", longopts, &li)) != -1) {
        switch (ch) {
        case 256:
            if (sampler_parse_flag(&o->sampling, longopts[li].name, optarg, e, sizeof e)) { fprintf(stderr, "k3: %s\n", e); return -1; }
            break;
        case 257: {
            int32_t *ids;
            size_t n;
            if (parse_ids(optarg, &ids, &n)) { fprintf(stderr, "k3: --stop-id wants a token id (or a comma-separated list), got '%s'\n", optarg); return -1; }
            int32_t *all = realloc(o->stop_ids, (o->n_stop_ids + n) * sizeof *all);
            if (!all) { free(ids); fprintf(stderr, "k3: out of memory\n"); return -1; }
            memcpy(all + o->n_stop_ids, ids, n * sizeof *ids);
            o->stop_ids = all;
            o->n_stop_ids += n;
            free(ids);
            break;
        }
        case 258: o->chat = 1; break;
        case 259: o->system = optarg; break;
        case 260: o->thinking = 1; break;
        case 261: o->thinking = 0; break;
        case 262: if (chat_template_parse(optarg, &o->tmpl, e, sizeof e)) { fprintf(stderr, "k3: %s\n", e); return -1; } break;
        case 263: if (num_opt("--max-tokens", optarg, 1, 1L << 24, &o->max_tokens)) return -1; break;
        case 'i': o->ids_arg = optarg; break;
        case 'p': o->prompt = optarg; break;
        case 'P': o->prompt_file = optarg; break;
        case 'j': o->json_path = optarg; break;
        case 'L': o->logits_path = optarg; break;
        case 'T': o->teacher_force = 1; break;
        case 'F': o->full_recompute = 1; break;
        case 'g': if (num_opt("--gen", optarg, 0, 1L << 24, &o->gen)) return -1; break;
        case 't': if (num_opt("--threads", optarg, 1, 4096, &o->threads)) return -1; break;
        case 'c': if (num_opt("--chunk", optarg, 1, 4096, &o->chunk)) return -1; break;
        case 's':
            if (simd_level_parse(optarg, &o->simd)) { fprintf(stderr, "k3: --simd wants auto|scalar|avx2|avx512, got '%s'\n", optarg); return -1; }
            break;
        case 'W': if (num_opt("--workers", optarg, 0, 256, &o->workers)) return -1; break;
        case 'N': if (num_opt("--workers-per-node", optarg, 1, 64, &o->workers_per_node)) return -1; break;
        case 'R': if (num_opt("--worker-threads", optarg, 1, 4096, &o->worker_threads)) return -1; break;
        case 'M': {
            char *end;
            o->cache_mb = strtod(optarg, &end);
            if (end == optarg || *end || !(o->cache_mb > 0 && o->cache_mb < 1e9)) {
                fprintf(stderr, "k3: --expert-cache-mb wants a positive number of MiB, got '%s'\n", optarg);
                return -1;
            }
            break;
        }
        case 'O': if (num_opt("--worker-timeout-ms", optarg, 100, 86400000L, &o->timeout_ms)) return -1; break;
        case 'X': if (num_opt("--max-restarts", optarg, 0, 1000, &o->max_restarts)) return -1; break;
        case 'U':
            if (!strcmp(optarg, "auto")) o->numa = 1;
            else if (!strcmp(optarg, "off")) o->numa = 0;
            else { fprintf(stderr, "k3: --numa wants auto|off, got '%s'\n", optarg); return -1; }
            break;
        case 'k': o->tok_dir = optarg; break;
        case 'A': o->trace_path = optarg; break;
        case 'S': o->preset = optarg; break;
        case 'Z': o->list_presets = 1; return 0;
        case 'Y': o->plan_only = 1; break;
        case 'C': if (num_opt("--max-context", optarg, 1, 1L << 30, &o->max_context)) return -1; break;
        case 'G': {
            char *end;
            o->mem_gb = strtod(optarg, &end);
            if (end == optarg || *end || !(o->mem_gb > 0 && o->mem_gb < 1e7)) {
                fprintf(stderr, "k3: --mem-gb wants a positive number of GiB, got '%s'\n", optarg);
                return -1;
            }
            break;
        }
        case 'e': o->encode_file = optarg; break;
        case 'd': o->decode_file = optarg; break;
        case 'n': o->no_special = 1; break;
        case 'h': usage(stdout); exit(EXIT_OK);
        default:
            fprintf(stderr, "k3: unknown or incomplete option '%s'\n", argv[optind - 1]);
            return -1;
        }
    }
    if (o->encode_file || o->decode_file) {
        if (!o->tok_dir && optind == argc - 1) o->tok_dir = argv[optind++];
        if (!o->tok_dir || optind != argc || (o->encode_file && o->decode_file)) {
            fprintf(stderr, "k3: tokenizer mode is: k3 --tok DIR (--encode FILE | --decode FILE) [--no-special]\n");
            return -1;
        }
        return 0;
    }
    if (optind != argc - 1) { fprintf(stderr, "k3: expected exactly one MODEL_DIR\n"); return -1; }
    o->model_dir = argv[optind];
    if (o->mem_gb > 0 && o->preset) { fprintf(stderr, "k3: give --mem-gb or --preset, not both\n"); return -1; }
    if (o->plan_only) return 0;
    int sources = !!o->ids_arg + !!o->prompt + !!o->prompt_file;
    if (o->chat) {
        if (sources || o->teacher_force || o->full_recompute || o->logits_path || o->json_path) {
            fprintf(stderr, "k3: --chat reads the conversation from stdin: no --ids/--prompt/--prompt-file, --teacher-force, --full-recompute, --dump-logits or --json\n");
            return -1;
        }
        return 0;
    }
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
    /* every row is kept only when it is asked for; else one row is reused */
    int keep = o->logits_path || o->teacher_force;
    r->rows = malloc((keep ? r->n_rows : 1) * V * sizeof *r->rows);
    if (!r->rows) { k3_fail(err, "out of memory for %zu rows of logits", r->n_rows); return EXIT_RUNTIME; }
    seq_state st;
    sampler smp;
    char se[256];
    if (sampler_init(&smp, &o->sampling, se, sizeof se)) { k3_fail(err, "%s", se); return EXIT_USAGE; }
    if (seq_state_init(&st, c, err)) { sampler_free(&smp); return EXIT_RUNTIME; }
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
        float *row = r->rows + (keep ? (pos - r->first_pos) * V : 0);
        if (o->full_recompute) {
            seq_state_reset(&st, c);
            size_t want = (i == 0) ? r->first_pos : pos;
            if (feed_tokens(en, &st, r->seq, pos + 1, (size_t)o->chunk, want, r->rows + (keep ? (want - r->first_pos) * V : 0), err)) goto out;
        } else if (i > 0) {
            if (feed_tokens(en, &st, r->seq + pos, 1, 1, pos, row, err)) goto out;
        }
        if (N == 0) break;
        int32_t next = sampler_pick(&smp, row, V);
        if (next == SAMPLER_ENOMEM) { k3_fail(err, "out of memory in the sampler"); goto out; }
        if (next < 0) { k3_fail(err, "non-finite logits at position %zu: refusing to emit a token", pos); goto out; }
        r->seq[n + i] = next;
        r->n_gen = i + 1;
        int stop = 0;
        for (size_t j = 0; j < o->n_stop_ids; j++) stop |= next == o->stop_ids[j];
        if (stop) break;
        if (tty) fprintf(stderr, "\rk3: generated %zu/%zu", i + 1, N);
    }
    if (tty && N) fprintf(stderr, "\n");
    if (N > 0 && r->n_gen < N) r->n_rows = n + r->n_gen - 1 - r->first_pos; /* stopped early: rows computed */
    r->decode_s = now_s() - t0;
    if (o->teacher_force)
        for (size_t p = 0; p < n; p++) {
            r->tf_pred[p] = argmax_logits(r->rows + p * V, V);
            if (r->tf_pred[p] < 0) { k3_fail(err, "non-finite logits at position %zu", p); goto out; }
        }
    status = EXIT_OK;
out:
    seq_state_free(&st);
    sampler_free(&smp);
    return status;
}

/* Reads a whole file (for --prompt-file). */
static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 65536;
            char *nb = realloc(buf, cap + 1);
            if (!nb) { free(buf); fclose(f); return NULL; }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) { free(buf); return NULL; }
    buf[n] = 0;
    *len = n;
    return buf;
}

static json_t *workers_json(const expert_backend *eb, int n_workers) {
    json_t *a = json_array();
    for (int i = 0; i < n_workers; i++) {
        worker_stats ws;
        workers_pool_stats(eb, i, &ws);
        json_t *w = json_object();
        json_object_set_new(w, "worker", json_integer(i));
        json_object_set_new(w, "pid", json_integer(ws.pid));
        json_object_set_new(w, "node", json_integer(ws.node));
        json_object_set_new(w, "requests", json_integer((json_int_t)ws.requests));
        json_object_set_new(w, "expert_hits", json_integer((json_int_t)ws.hits));
        json_object_set_new(w, "expert_misses", json_integer((json_int_t)ws.misses));
        json_object_set_new(w, "bytes_read", json_integer((json_int_t)ws.bytes_read));
        json_object_set_new(w, "restarts", json_integer(ws.restarts));
        json_object_set_new(w, "cache_slots", json_integer(ws.cache_slots));
        json_object_set_new(w, "direct_io", json_boolean(ws.direct_io));
        json_object_set_new(w, "ring_wait_s", json_real(ws.wait_s));
        json_object_set_new(w, "compute_s", json_real(ws.compute_s));
        json_object_set_new(w, "peak_rss_bytes", json_integer((json_int_t)ws.peak_rss_bytes));
        json_array_append_new(a, w);
    }
    return a;
}

/* --dump-expert-trace: one line per (position, MoE layer): "pos layer e1 ... ek" in top-k order. */
static void trace_route(void *ctx, int layer, size_t position, const int32_t *ids, int top_k) {
    FILE *f = ctx;
    fprintf(f, "%zu %d", position, layer);
    for (int j = 0; j < top_k; j++) fprintf(f, " %d", ids[j]);
    fputc('\n', f);
}

typedef struct {
    double load_s;
    int threads, n_workers;
    const expert_backend *eb;
    const tokenizer *tok;
    const mem_plan *plan;
    trunk *trunk;
} run_info;

/* VmHWM (peak resident set) of a process, in bytes; 0 if unknown. */
static uint64_t peak_rss_of(const char *status_path) {
    FILE *f = fopen(status_path, "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    return (uint64_t)kb * 1024;
}

static json_t *memory_json(const run_info *ri, const expert_backend *eb) {
    json_t *j = json_object();
    const mem_plan *p = ri->plan;
    uint64_t self = peak_rss_of("/proc/self/status"), total = self, hits = 0, misses = 0, bytes = 0;
    for (int i = 0; i < ri->n_workers; i++) {
        worker_stats ws;
        workers_pool_stats(eb, i, &ws);
        total += ws.peak_rss_bytes;
        hits += ws.hits;
        misses += ws.misses;
        bytes += ws.bytes_read;
    }
    if (ri->n_workers == 0) bytes = experts_local_stats(eb, &hits, &misses);
    trunk_stats ts = trunk_get_stats(ri->trunk);
    json_object_set_new(j, "budget_bytes", json_integer((json_int_t)p->budget));
    json_object_set_new(j, "floor_bytes", json_integer((json_int_t)p->floor));
    json_object_set_new(j, "planned_bytes", json_integer((json_int_t)p->total));
    json_object_set_new(j, "peak_rss_coordinator_bytes", json_integer((json_int_t)self));
    json_object_set_new(j, "peak_rss_total_bytes", json_integer((json_int_t)total));
    json_object_set_new(j, "trunk_pinned_units", json_integer(ts.n_pinned));
    json_object_set_new(j, "trunk_walk_units", json_integer(ts.n_walk));
    json_object_set_new(j, "trunk_slots", json_integer(ts.n_slots));
    json_object_set_new(j, "trunk_pinned_bytes", json_integer((json_int_t)ts.pinned_bytes));
    json_object_set_new(j, "trunk_bytes_streamed", json_integer((json_int_t)ts.bytes_streamed));
    json_object_set_new(j, "expert_cache_bytes_per_server", json_integer((json_int_t)p->expert_cache_per_worker));
    json_object_set_new(j, "expert_hits", json_integer((json_int_t)hits));
    json_object_set_new(j, "expert_misses", json_integer((json_int_t)misses));
    json_object_set_new(j, "expert_bytes_read", json_integer((json_int_t)bytes));
    return j;
}

static int write_outputs(const options *o, const run_result *r, const engine *en, const run_info *ri) {
    size_t V = (size_t)en->model->cfg.vocab_size;
    if (o->logits_path) {
        FILE *f = fopen(o->logits_path, "wb");
        if (!f || fwrite(r->rows, sizeof(float) * V, r->n_rows, f) != r->n_rows || fclose(f) != 0) {
            fprintf(stderr, "k3: cannot write %s: %s\n", o->logits_path, strerror(errno));
            return EXIT_RUNTIME;
        }
    }
    char *text = NULL;
    size_t text_len = 0;
    if (ri->tok) {
        char e[256];
        if (tokenizer_decode(ri->tok, r->seq + r->n_prompt, r->n_gen, &text, &text_len, e, sizeof e) != TOK_OK) text = NULL;
    }
    if (o->ids_arg || !text) {
        for (size_t i = 0; i < r->n_gen; i++) printf("%s%d", i ? " " : "", r->seq[r->n_prompt + i]);
        printf("\n");
    } else {
        /* whole code points only: an incomplete tail is held back, an invalid sequence shown as U+FFFD */
        utf8_stream us;
        utf8_stream_init(&us, 1);
        char *out = malloc(UTF8_STREAM_MAX_OUT(text_len));
        if (out) {
            size_t n = utf8_stream_push(&us, text, text_len, out);
            n += utf8_stream_flush(&us, out + n);
            fwrite(out, 1, n, stdout);
            printf("\n");
            free(out);
        }
    }
    if (o->json_path) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        json_t *j = json_object();
        json_object_set_new(j, "prompt_ids", ids_json(r->seq, r->n_prompt));
        json_object_set_new(j, "generated_ids", ids_json(r->seq + r->n_prompt, r->n_gen));
        if (text) json_object_set_new(j, "generated_text", json_stringn_nocheck(text, text_len));
        if (o->teacher_force) json_object_set_new(j, "tf_pred", ids_json(r->tf_pred, r->n_prompt));
        json_object_set_new(j, "logits_first_position", json_integer((json_int_t)r->first_pos));
        json_object_set_new(j, "mode", json_string(o->full_recompute ? "full-recompute" : "incremental"));
        json_object_set_new(j, "threads", json_integer(ri->threads));
        json_object_set_new(j, "simd", json_string(en->k->name));
        json_t *tm = json_object();
        json_object_set_new(tm, "load_s", json_real(ri->load_s));
        json_object_set_new(tm, "prefill_s", json_real(r->prefill_s));
        json_object_set_new(tm, "decode_s", json_real(r->decode_s));
        json_object_set_new(tm, "decode_tokens_per_s", json_real(r->decode_s > 0 ? (double)r->n_gen / r->decode_s : 0));
        json_object_set_new(j, "timing", tm);
        json_object_set_new(j, "peak_rss_bytes", json_integer((json_int_t)ru.ru_maxrss * 1024));
        json_object_set_new(j, "n_workers", json_integer(ri->n_workers));
        if (ri->n_workers > 0) json_object_set_new(j, "workers", workers_json(ri->eb, ri->n_workers));
        json_object_set_new(j, "memory", memory_json(ri, ri->eb));
        int bad = json_dump_file(j, o->json_path, JSON_INDENT(1) | JSON_COMPACT);
        json_decref(j);
        if (bad) { fprintf(stderr, "k3: cannot write %s\n", o->json_path); free(text); return EXIT_RUNTIME; }
    }
    free(text);
    return EXIT_OK;
}

/* The prompt as ids: parsed from --ids, or encoded from --prompt / --prompt-file
 * (special-token text allowed, like --encode). Returns an exit status. */
static int prompt_ids(const options *o, const tokenizer *tok, int32_t **ids, size_t *n) {
    if (o->ids_arg) {
        if (parse_ids(o->ids_arg, ids, n) == 0) return EXIT_OK;
        fprintf(stderr, "k3: --ids wants a comma-separated list of non-negative integers, got '%s'\n", o->ids_arg);
        return EXIT_USAGE;
    }
    size_t len = strlen(o->prompt ? o->prompt : "");
    char *text = o->prompt ? strdup(o->prompt) : read_file(o->prompt_file, &len);
    if (!text) { fprintf(stderr, "k3: cannot read %s\n", o->prompt_file ? o->prompt_file : "prompt"); return EXIT_USAGE; }
    char e[512];
    int rc = tokenizer_encode(tok, text, len, 1, ids, n, e, sizeof e);
    free(text);
    if (rc != TOK_OK) { fprintf(stderr, "k3: cannot encode the prompt: %s\n", e); return EXIT_USAGE; }
    if (*n == 0) { fprintf(stderr, "k3: the prompt is empty\n"); return EXIT_USAGE; }
    return EXIT_OK;
}

static int workers_wanted(const options *o) {
    if (o->workers >= 0) return (int)o->workers;
    int nodes = (o->numa && numa_available() >= 0) ? numa_num_configured_nodes() : 1;
    return (nodes > 0 ? nodes : 1) * (int)o->workers_per_node;
}

static int start_backend(const options *o, k3_model *m, const kernels *k, int threads, int nw, uint64_t cache_bytes,
                         expert_backend *eb, k3_error *err) {
    if (nw == 0) return experts_local_create(eb, m, k, cache_bytes, err);
    pool_options po = {0};
    char path[4096];
    if (workers_pool_default_path(path, sizeof path)) return k3_fail(err, "cannot locate k3-expertd");
    po.n_workers = nw;
    po.numa = o->numa;
    po.threads = o->worker_threads ? (int)o->worker_threads : (threads / nw > 0 ? threads / nw : 1);
    po.timeout_ms = (int)o->timeout_ms;
    po.max_restarts = (int)o->max_restarts;
    po.max_tokens = (size_t)o->chunk;
    po.expertd_path = path;
    po.simd = k->name;
    po.cache_bytes = cache_bytes;
    return workers_pool_create(eb, m, &po, err);
}

/* The budget asked for: --mem-gb, --preset, or the auto preset. 0 = everything resident. */
static int budget_bytes(const options *o, uint64_t *bytes) {
    if (o->mem_gb > 0) { *bytes = (uint64_t)(o->mem_gb * 1024.0 * 1024.0 * 1024.0); return 0; }
    const char *name = o->preset ? o->preset : "auto";
    if (plan_preset_bytes(name, bytes) == 0) return 0;
    fprintf(stderr, "k3: unknown --preset '%s' (see --list-presets)\n", name);
    return -1;
}

static void list_presets(void) {
    for (const mem_preset *p = plan_presets(); p->name; p++) {
        uint64_t b = 0;
        plan_preset_bytes(p->name, &b);
        if (b) printf("%-12s %8.1f GiB  %s\n", p->name, b / (1024.0 * 1024.0 * 1024.0), p->what);
        else printf("%-12s %12s  %s\n", p->name, "-", p->what);
    }
}

/* --plan-only: the plan from config.json alone (no weights needed). */
static int plan_only(const options *o) {
    k3_config cfg;
    k3_error err = {0};
    uint64_t budget;
    if (budget_bytes(o, &budget)) return EXIT_USAGE;
    if (config_load(o->model_dir, &cfg, &err)) { fprintf(stderr, "k3: refusing model: %s\n", err.msg); return EXIT_USAGE; }
    mem_plan plan;
    size_t ctx = o->max_context ? (size_t)o->max_context : 4096;
    int rc = plan_make(&plan, &cfg, NULL, budget, workers_wanted(o), (size_t)o->chunk, ctx, &err);
    if (rc) fprintf(stderr, "k3: %s\n", err.msg);
    else plan_print(&plan, &cfg, stdout);
    plan_free(&plan);
    config_free(&cfg);
    return rc ? EXIT_USAGE : EXIT_OK;
}

int main(int argc, char **argv) {
    options o;
    if (parse_args(argc, argv, &o)) { usage(stderr); return EXIT_USAGE; }
    if (o.encode_file || o.decode_file) return tokenize_command(o.tok_dir, o.encode_file, o.decode_file, o.no_special);
    if (o.list_presets) { list_presets(); return EXIT_OK; }
    if (o.plan_only) return plan_only(&o);
    /* With expert servers the coordinator's cores sit idle while they compute;
     * libgomp reads its wait policy only at start-up, so restart once with
     * passive waiting (idle threads sleep instead of spinning on shared cores). */
    if (workers_wanted(&o) != 0 && !getenv("OMP_WAIT_POLICY")) {
        setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
        execv("/proc/self/exe", argv);
    }
    const kernels *k = kernels_get(o.simd);
    if (!k) {
        static const char *const names[] = {"auto", "scalar", "avx2", "avx512"};
        fprintf(stderr, "k3: --simd %s is not supported by this CPU or build\n", names[o.simd]);
        return EXIT_USAGE;
    }
    if (o.threads) omp_set_num_threads((int)o.threads);
    run_info ri = {.threads = omp_get_max_threads()};
    mem_plan plan = {0};
    trunk *tr = NULL;
    tokenizer *tok = NULL;
    if (o.prompt || o.prompt_file || o.tok_dir || o.chat) {
        char e[1024];
        if (!(tok = tokenizer_load(o.tok_dir ? o.tok_dir : o.model_dir, e, sizeof e))) {
            fprintf(stderr, "k3: cannot load the tokenizer: %s\n", e);
            return EXIT_USAGE;
        }
    }
    ri.tok = tok;
    run_result r = {0};
    int32_t *prompt = NULL;
    size_t n = 0;
    int status = o.chat ? EXIT_OK : prompt_ids(&o, tok, &prompt, &n);
    if (status != EXIT_OK) { free(prompt); tokenizer_free(tok); return status; }
    double t0 = now_s();
    k3_model m;
    k3_error err = {0};
    if (model_load(o.model_dir, &m, &err)) {
        fprintf(stderr, "k3: refusing model: %s\n", err.msg);
        free(prompt);
        tokenizer_free(tok);
        return EXIT_USAGE;
    }
    ri.load_s = now_s() - t0;
    status = EXIT_USAGE;
    expert_backend eb = {0};
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
    uint64_t budget;
    status = EXIT_USAGE;
    if (budget_bytes(&o, &budget)) goto done;
    ri.n_workers = workers_wanted(&o);
    size_t ctx = o.max_context ? (size_t)o.max_context : o.chat ? 4096 : n + (size_t)o.gen;
    if (plan_make(&plan, &m.cfg, &m, budget, ri.n_workers, (size_t)o.chunk, ctx, &err)) {
        fprintf(stderr, "k3: %s\n", err.msg);
        goto done;
    }
    plan_print(&plan, &m.cfg, stderr);
    status = EXIT_RUNTIME;
    trunk_config tc = {plan.n_pinned, plan.n_slots, plan.lm_chunk_rows};
    if (!(tr = trunk_create(&m, &tc, &err))) { fprintf(stderr, "k3: %s\n", err.msg); goto done; }
    uint64_t cache_bytes = o.cache_mb > 0 ? (uint64_t)(o.cache_mb * 1048576.0) : plan.expert_cache_per_worker;
    if (start_backend(&o, &m, k, ri.threads, ri.n_workers, cache_bytes, &eb, &err)) { fprintf(stderr, "k3: %s\n", err.msg); goto done; }
    ri.eb = &eb;
    ri.plan = &plan;
    ri.trunk = tr;
    engine en = {.model = &m, .trunk = tr, .k = k, .experts = &eb};
    FILE *trace = NULL;
    if (o.trace_path) {
        if (!(trace = fopen(o.trace_path, "w"))) { fprintf(stderr, "k3: cannot write %s\n", o.trace_path); goto done; }
        fprintf(trace, "# k3 expert trace v1 layers=%d experts=%d top_k=%d\n", m.cfg.num_hidden_layers, m.cfg.num_experts,
                m.cfg.num_experts_per_token);
        en.on_route = trace_route;
        en.on_route_ctx = trace;
    }
    if (o.chat) {
        chat_options co;
        chat_options_default(&co);
        co.system = o.system;
        co.thinking = o.thinking;
        co.tmpl = o.tmpl;
        co.max_tokens = (size_t)o.max_tokens;
        co.sampling = o.sampling;
        co.stop_ids = o.stop_ids;
        co.n_stop_ids = o.n_stop_ids;
        co.chunk = (size_t)o.chunk;
        co.max_context = (size_t)o.max_context;
        status = chat_repl(&en, tok, &co, stdin, stdout, stderr);
        if (trace) fclose(trace);
        goto done;
    }
    status = run(&en, &o, &r, &err);
    if (trace && fclose(trace) != 0 && status == EXIT_OK) { fprintf(stderr, "k3: error writing %s\n", o.trace_path); status = EXIT_RUNTIME; }
    if (status != EXIT_OK) fprintf(stderr, "k3: %s\n", err.msg);
    else status = write_outputs(&o, &r, &en, &ri);
done:
    if (eb.destroy) eb.destroy(&eb);
    trunk_free(tr);
    plan_free(&plan);
    free(prompt);
    free(r.seq);
    free(r.tf_pred);
    free(r.rows);
    free(o.stop_ids);
    model_free(&m);
    tokenizer_free(tok);
    return status;
}
