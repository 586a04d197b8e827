/* cli.c - parsing of bin/k3's command line (see cli.h). */
#include "coordinator/cli.h"
#include "workers/expert_cache.h"
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

void cli_usage(FILE *f) {
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
            "  --expert-cache-policy P   lru|lfu|phit (default phit; see docs/PERFORMANCE.md)\n"
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
int parse_ids(const char *s, int32_t **ids, size_t *n) {
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

int cli_parse(int argc, char **argv, options *o) {
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
        {"expert-cache-policy", required_argument, 0, 264},
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
        case 264: {
            cache_policy pol;
            if (cache_policy_parse(optarg, &pol)) { fprintf(stderr, "k3: --expert-cache-policy wants lru|lfu|phit, got '%s'\n", optarg); return -1; }
            o->cache_policy = optarg;
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
        case 'h': cli_usage(stdout); exit(EXIT_OK);
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
