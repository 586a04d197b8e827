/* cli.c - bin/k3's command line (see cli.h): ONE table of flags that drives the parser
 * (getopt_long), the defaults, `--help` and `--help-markdown` (the README's options table,
 * which tests/t_06_cli.sh compares with README.md). */
#include "coordinator/cli.h"
#include "workers/expert_cache.h"
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef struct cli_flag cli_flag;
typedef enum {
    CLI_SWITCH, /* no argument: stores (int)lo into the int field */
    CLI_LONG,   /* integer in [lo, hi] into the long field */
    CLI_DOUBLE, /* number in (lo, hi) (exclusive) into the double field */
    CLI_STR,    /* the argument itself into the const char * field */
    CLI_FN      /* fn(o, f, arg, err) */
} cli_kind;

struct cli_flag {
    const char *name;  /* long option without the dashes */
    const char *arg;   /* metavariable in the usage text; NULL: takes no argument */
    cli_kind kind;
    size_t off;        /* offsetof(options, field) for SWITCH/LONG/DOUBLE/STR */
    double lo, hi;
    int (*fn)(options *o, const cli_flag *f, const char *arg, k3_error *err);
    const char *dflt;  /* applied through the same setter before argv is read; shown as (default ...) */
    const char *help;  /* markdown, one README table row; NULL: shares the row above */
};

#define OFF(field) offsetof(options, field)

static int set_sampling(options *o, const cli_flag *f, const char *arg, k3_error *err) {
    return sampler_parse_flag(&o->sampling, f->name, arg, err);
}

static int add_stop_ids(options *o, const cli_flag *f, const char *arg, k3_error *err) {
    int32_t *ids;
    size_t n;
    if (parse_ids(arg, &ids, &n)) {
        free(ids);
        return k3_refuse(err, "--%s wants a token id (or a comma-separated list), got '%s'", f->name, arg);
    }
    int32_t *all = realloc(o->stop_ids, (o->n_stop_ids + n) * sizeof *all);
    if (!all) { free(ids); return k3_fail(err, "out of memory"); }
    memcpy(all + o->n_stop_ids, ids, n * sizeof *ids);
    o->stop_ids = all;
    o->n_stop_ids += n;
    free(ids);
    return 0;
}

static int set_policy(options *o, const cli_flag *f, const char *arg, k3_error *err) {
    cache_policy pol;
    if (cache_policy_parse(arg, &pol)) return k3_refuse(err, "--%s wants lru|lfu|phit, got '%s'", f->name, arg);
    o->cache_policy = arg;
    return 0;
}

static int set_prefetch(options *o, const cli_flag *f, const char *arg, k3_error *err) {
    if (!strcmp(arg, "off")) o->expert_prefetch = 0;
    else if (!strcmp(arg, "predict")) o->expert_prefetch = 1;
    else if (!strcmp(arg, "on")) o->expert_prefetch = 2;
    else return k3_refuse(err, "--%s wants off|predict|on, got '%s'", f->name, arg);
    return 0;
}

static int set_template(options *o, const cli_flag *f, const char *arg, k3_error *err) {
    (void)f;
    return chat_template_parse(arg, &o->tmpl, err);
}

static int set_simd(options *o, const cli_flag *f, const char *arg, k3_error *err) {
    if (simd_level_parse(arg, &o->simd)) return k3_refuse(err, "--%s wants auto|scalar|avx2|avx512, got '%s'", f->name, arg);
    return 0;
}

static int set_numa(options *o, const cli_flag *f, const char *arg, k3_error *err) {
    if (!strcmp(arg, "auto")) o->numa = 1;
    else if (!strcmp(arg, "off")) o->numa = 0;
    else return k3_refuse(err, "--%s wants auto|off, got '%s'", f->name, arg);
    return 0;
}

static int set_api_key(options *o, const cli_flag *f, const char *arg, k3_error *err) {
    if (!*arg) return k3_fail(err, "--%s wants a non-empty key", f->name);
    o->api_key = arg;
    return 0;
}

static int show_help(options *o, const cli_flag *f, const char *arg, k3_error *err) {
    (void)o; (void)arg; (void)err;
    if (!strcmp(f->name, "help")) cli_usage(stdout);
    else cli_markdown(stdout);
    exit(EXIT_OK);
}

/* THE flags of bin/k3. To add one:
 *   1. a field in `options` (cli.h),
 *   2. one row here, in the place it should appear in --help and the README:
 *      { "name", "METAVAR" or NULL, kind, OFF(field), lo, hi, setter or NULL, "default" or NULL,
 *        "help (markdown; NULL = same README row as the flag above)" },
 *      a default given as text goes through the same setter as the command line, so it is
 *      checked and cannot disagree with the help; a computed default belongs in the help text,
 *   3. `make readme-options` rewrites the README table from `bin/k3 --help-markdown`
 *      (tests/t_06_cli.sh fails while they differ).
 * Nothing else lists flags. */
static const cli_flag FLAGS[] = {
    {"ids", "LIST", CLI_STR, OFF(ids_arg), 0, 0, NULL, NULL,
     "prompt as comma-separated token ids (stdout: generated ids, space-separated)"},
    {"prompt", "TEXT", CLI_STR, OFF(prompt), 0, 0, NULL, NULL,
     "prompt as text, encoded with the model's tokenizer (special-token text allowed); stdout: generated text"},
    {"prompt-file", "FILE", CLI_STR, OFF(prompt_file), 0, 0, NULL, NULL, NULL},
    {"gen", "N", CLI_LONG, OFF(gen), 0, 1L << 24, NULL, "16",
     "tokens to generate (greedy arg-max, lowest id on ties, unless `--temperature` > 0)"},
    {"temperature", "T", CLI_FN, 0, 0, 0, set_sampling, "0",
     "sampling in the coordinator with a fixed generator (SplitMix64 + xoshiro256**): a seed gives the same ids on any "
     "machine, thread count, worker count and budget (docs/CHAT.md); T in [0, 100], 0 = greedy; "
     "K 0, P 1, M 0 = filter off"},
    {"top-k", "K", CLI_FN, 0, 0, 0, set_sampling, "0", NULL},
    {"top-p", "P", CLI_FN, 0, 0, 0, set_sampling, "1", NULL},
    {"min-p", "M", CLI_FN, 0, 0, 0, set_sampling, "0", NULL},
    {"seed", "S", CLI_FN, 0, 0, 0, set_sampling, "0", NULL},
    {"presence-penalty", "P", CLI_FN, 0, 0, 0, set_sampling, "0",
     "the adjustments before the pick (docs/CHAT.md \"Adjustments\"; --ids/--prompt runs and --chat, where each reply "
     "counts its own ids; not with state files, and requests carry their own in --serve): penalties in [-2, 2] over "
     "the reply's ids, vLLM's repetition penalty in (0, 10] (1 = off) over the prompt's and the reply's, biases in "
     "[-100, 100] (repeatable)"},
    {"frequency-penalty", "F", CLI_FN, 0, 0, 0, set_sampling, "0", NULL},
    {"repetition-penalty", "R", CLI_FN, 0, 0, 0, set_sampling, "1", NULL},
    {"logit-bias", "ID=B,...", CLI_FN, 0, 0, 0, set_sampling, NULL, NULL},
    {"stop-id", "N", CLI_FN, 0, 0, 0, add_stop_ids, NULL, "stop after emitting id N (repeatable, or N,M,...)"},
    {"mpi", NULL, CLI_SWITCH, OFF(mpi), 1, 0, NULL, NULL,
     "run under `mpirun -np N`: rank 0 coordinates, ranks 1..N-1 serve disjoint expert sets from their own hosts "
     "(README \"Several machines\"); `--worker-timeout-ms` bounds a rank's silence; with `--workers N` every expert rank "
     "serves its experts through N local servers (rank 0 owns none); `--json` gains per-rank `mpi` counters"},
    {"draft", "none|ngram|ids|model", CLI_STR, OFF(draft), 0, 0, NULL, "none",
     "exact speculative decoding: proposals checked in one forward pass each; the ids are always those of plain "
     "decoding (README \"Speculation\"); `ngram` looks the context's longest repeated suffix up"},
    {"draft-max", "K", CLI_LONG, OFF(draft_max), 1, 63, NULL, "4", "speculation: proposals per verification pass"},
    {"draft-ids", "FILE", CLI_STR, OFF(draft_ids), 0, 0, NULL, NULL,
     "speculation: whitespace-separated ids proposed in order as the continuation (with `--draft ids`)"},
    {"draft-model", "DIR", CLI_STR, OFF(draft_model), 0, 0, NULL, NULL,
     "speculation: a smaller checkpoint with the same tokenizer proposes its greedy continuation (implies "
     "`--draft model`; run in the coordinator, everything resident, a line of the memory plan)"},
    {"draft-rollback", "auto|states|refeed", CLI_STR, OFF(draft_rollback), 0, 0, NULL, "auto",
     "speculation: after a rejection, restore the state the verification pass kept at the last accepted position "
     "(`states`, K copies of the KDA state in the plan) or restore one copy and re-feed the accepted ids (`refeed`, "
     "a second pass); `auto`: states when the memory budget allows"},
    {"chat", NULL, CLI_SWITCH, OFF(chat), 1, 0, NULL, NULL,
     "interactive chat on stdin/stdout (K3 XTML or K2 `<|im_*|>` template from the tokenizer); `/reset`, `/exit`; "
     "no prompt argument"},
    {"system", "TEXT", CLI_STR, OFF(system), 0, 0, NULL, NULL, "chat: system message (\"\" = none)"},
    {"thinking", NULL, CLI_SWITCH, OFF(thinking), 1, 0, NULL, "on", "chat: K3 think or response section"},
    {"no-thinking", NULL, CLI_SWITCH, OFF(thinking), 0, 0, NULL, NULL, NULL},
    {"template", "auto|k3|k2", CLI_FN, 0, 0, 0, set_template, "auto",
     "chat template (auto: from the tokenizer's special tokens)"},
    {"max-tokens", "N", CLI_LONG, OFF(max_tokens), 1, 1L << 24, NULL, "512", "chat: tokens per reply at most"},
    {"serve", NULL, CLI_SWITCH, OFF(serve), 1, 0, NULL, NULL,
     "OpenAI-compatible HTTP server (README \"Serve\"); no prompt argument; `--max-tokens` is the default reply "
     "length, `--thinking`/`--no-thinking` the default mode, `--max-context` the per-request limit (default 4096)"},
    {"host", "ADDR", CLI_STR, OFF(host), 0, 0, NULL, "127.0.0.1", "serve: numeric IPv4/IPv6 address to bind"},
    {"port", "N", CLI_LONG, OFF(port), 0, 65535, NULL, "8080", "serve: TCP port (`0`: any free port, printed on stderr)"},
    {"api-key", "KEY", CLI_FN, 0, 0, 0, set_api_key, NULL,
     "serve: require `Authorization: Bearer KEY` (compared in constant time; default: no key)"},
    {"parallel", "N", CLI_LONG, OFF(parallel), 1, 256, NULL, "4",
     "serve: sequences decoded together, one forward step for all (at most `--chunk`)"},
    {"max-queue", "N", CLI_LONG, OFF(max_queue), 1, 100000, NULL, "64",
     "serve: requests waiting for a slot; beyond that 429 with Retry-After"},
    {"http-timeout", "S", CLI_LONG, OFF(http_timeout), 1, 86400, NULL, "60",
     "serve: seconds a client may stay idle or take to send its request (none while it waits for tokens)"},
    {"snapshot-mb", "MB", CLI_LONG, OFF(snapshot_mb), 0, 1L << 20, NULL, "512",
     "serve: prefix snapshots kept in memory, so a conversation's next request skips what was computed (0 = off)"},
    {"json", "FILE", CLI_STR, OFF(json_path), 0, 0, NULL, NULL,
     "`prompt_ids`, `generated_ids`, `generated_text`, `tf_pred`, `timing`, `peak_rss_bytes`, `n_workers`, "
     "per-worker `workers` stats, `simd` and `kernel_choice` (the kernels this CPU got, e.g. `bf16=shift mxfp4=pd lanes=0 "
     "gemm=double`); `timing.load_s` is every weight in before the first forward (`load_model_s` headers, "
     "`load_trunk_s` the pinned trunk's reads, `load_experts_s` the expert backend), `prefill_s` the prompt's forwards "
     "(`prefill_tokens` positions); `*_cpu_s`: CPU seconds of all threads in the same span (less than threads x wall when other work shares the cores); `timing.decode_tokens_per_s` is `decode_tokens` / `decode_s`: the tokens after the "
     "first (the first comes from the prefill's step, whose time is `prefill_s`); `timing.prefill_phases` and "
     "`decode_phases`: the same spans' forwards by phase (`mix`, `kda_matmul`, `kda_core`, `mla_matmul`, `mla_core`, "
     "`moe_in`, `route`, `experts`, `moe_out`, `shared`, `mlp`, `lm_head`), each `wall_s`, `cpu_s` and the `gflop` it computed"},
    {"dump-logits", "FILE", CLI_STR, OFF(logits_path), 0, 0, NULL, NULL,
     "raw little-endian float32 logits, one row of `vocab_size` per position that predicts a token: positions "
     "`n_prompt-1 .. n_prompt+gen-2` (from 0 with `--teacher-force`)"},
    {"teacher-force", NULL, CLI_SWITCH, OFF(teacher_force), 1, 0, NULL, NULL,
     "one forward over the prompt; `tf_pred` = arg-max at every prompt position"},
    {"full-recompute", NULL, CLI_SWITCH, OFF(full_recompute), 1, 0, NULL, NULL,
     "recompute the whole sequence for every token instead of carrying KDA/MLA state (same bits)"},
    {"threads", "N", CLI_LONG, OFF(threads), 1, 4096, NULL, NULL, "OpenMP threads of the coordinator (default: every usable cpu; on several NUMA nodes split across the nodes in proportion to their cpus, each thread bound to its node)"},
    {"simd", "auto|scalar|avx2|avx512", CLI_FN, 0, 0, 0, set_simd, "auto",
     "kernel level (same bits; a level the CPU lacks exits 2)"},
    {"chunk", "N", CLI_LONG, OFF(chunk), 1, 4096, NULL, "64", "prefill chunk in tokens (never changes results)"},
    {"workers", "N", CLI_LONG, OFF(workers), 0, 256, NULL, NULL,
     "expert-server processes; `0` computes experts in-process (default: `--workers-per-node` per NUMA node; server i goes to node i mod nodes)"},
    {"workers-per-node", "N", CLI_LONG, OFF(workers_per_node), 1, 64, NULL, "1",
     "servers per NUMA node when `--workers` is not given"},
    {"numa", "auto|off", CLI_FN, 0, 0, 0, set_numa, "auto",
     "auto: on several NUMA nodes bind each server to its node's cpus and memory, and spread the coordinator's threads and trunk rows over every node; off: bind nothing"},
    {"worker-threads", "N", CLI_LONG, OFF(worker_threads), 1, 4096, NULL, NULL,
     "OpenMP threads per server (default: its share of its node's cpus, at least 1)"},
    {"expert-cache-mb", "MB", CLI_DOUBLE, OFF(cache_mb), 0, 1e9, NULL, NULL,
     "expert cache per server (default: the memory plan's cache per server, i.e. all of its experts when the budget "
     "allows; below one expert is refused)"},
    {"expert-cache-policy", "P", CLI_FN, 0, 0, 0, set_policy, "phit",
     "`lru`, `lfu` or `phit` (predicted hit, chosen by trace simulation; see docs/PERFORMANCE.md); never changes the ids"},
    {"read-threads", "N", CLI_LONG, OFF(read_threads), 0, 256, NULL, "4",
     "reads in flight: reader threads of the trunk (its pinned load and streamed units) and of every expert cache (in-process "
     "and in each server), each read cut in 4 MiB pieces so one large read keeps N preads at the device (an NVMe's "
     "queue depth); `0`: one synchronous pread at a time"},
    {"expert-prefetch", "off|predict|on", CLI_FN, 0, 0, 0, set_prefetch, "off",
     "after each MoE layer, predict the next MoE layer's experts from its router applied to this layer's input (router "
     "copies: a plan line); `on`: start their reads (the cache that owns them, `--read-threads` > 0; the plan keeps 2 x top-k "
     "expert slots per cache before pinning trunk units, as far as the budget allows); `predict`: only score the "
     "prediction; `--json` `prefetch` gives recall, hinted reads used and wasted, read stall; never changes the ids"},
    {"preload-experts", NULL, CLI_SWITCH, OFF(preload_experts), 1, 0, NULL, NULL,
     "read the experts at load, as many as the expert caches hold (all of them when resident), instead of on first use: "
     "`load_s` is then every weight in and no request waits for a first read (a server's steady latency); in-process "
     "(`--workers 0`) and in each expert server"},
    {"worker-timeout-ms", "MS", CLI_LONG, OFF(timeout_ms), 100, 86400000L, NULL, "30000",
     "a server that makes no progress, or is not ready, this long is restarted"},
    {"max-restarts", "N", CLI_LONG, OFF(max_restarts), 0, 1000, NULL, "3", "restarts per server before the run fails"},
    {"mem-gb", "X", CLI_DOUBLE, OFF(mem_gb), 0, 1e7, NULL, NULL,
     "one memory budget in GiB for the coordinator and every expert server together (fractions allowed)"},
    {"mmap", NULL, CLI_SWITCH, OFF(map_trunk), 1, 0, NULL, NULL,
     "the pinned trunk is the checkpoint files' own pages (a read-only mapping) instead of copies read with O_DIRECT: a "
     "repeated run finds them in the page cache and loads without reading or clearing memory; values still checked "
     "at load; no NUMA placement of the trunk; the files must not change while it runs (the budget counts them as before)"},
    {"preset", "NAME", CLI_STR, OFF(preset), 0, 0, NULL, NULL,
     "`laptop` 8, `desktop` 32, `workstation` 128, `server` 512 GiB, `max` (everything resident), `auto` (85 % of "
     "MemAvailable; the default); `--list-presets` lists them"},
    {"list-presets", NULL, CLI_SWITCH, OFF(list_presets), 1, 0, NULL, NULL, NULL},
    {"plan-only", NULL, CLI_SWITCH, OFF(plan_only), 1, 0, NULL, NULL,
     "print the memory plan and exit; needs only `config.json` (e.g. `bin/k3 configs/kimi-k3 --plan-only --mem-gb 8`)"},
    {"max-context", "N", CLI_LONG, OFF(max_context), 1, 1L << 30, NULL, NULL,
     "positions the MLA cache is planned for and the limit of every input (default: prompt + gen; 4096 with "
     "`--chat` or `--plan-only`); a longer prompt is refused, a longer chat message is refused with a message"},
    {"save-state", "FILE", CLI_STR, OFF(save_state), 0, 0, NULL, NULL,
     "after the run, write its state (history, KDA/MLA state, sampler) to FILE atomically ([docs/FORMATS.md](docs/FORMATS.md))"},
    {"load-state", "FILE", CLI_STR, OFF(load_state), 0, 0, NULL, NULL,
     "start from a saved state: `--ids/--prompt/--prompt-file` (optional) are appended, `--gen N` generates N more; "
     "with `--chat`, reopens the conversation"},
    {"checkpoint", "FILE", CLI_STR, OFF(checkpoint), 0, 0, NULL, NULL,
     "write the run's state to FILE every `--checkpoint-every` generated tokens (and at the end)"},
    {"checkpoint-every", "N", CLI_LONG, OFF(checkpoint_every), 1, 1L << 24, NULL, "16", NULL},
    {"resume", "FILE", CLI_STR, OFF(resume), 0, 0, NULL, NULL,
     "`k3 MODEL --resume FILE`: continue an interrupted run from its checkpoint to its `--gen` target; stdout and "
     "`--json` report the whole run"},
    {"state-dir", "DIR", CLI_STR, OFF(state_dir), 0, 0, NULL, NULL,
     "keep prefix snapshots on disk in DIR (a new prompt that extends a stored history feeds only the rest; "
     "with `--serve` they outlive a restart); "
     "`--state-dir-mb` caps the files (least recently used deleted first)"},
    {"state-dir-mb", "MB", CLI_DOUBLE, OFF(state_dir_mb), 1, 1e9, NULL, "4096", NULL},
    {"dump-expert-trace", "FILE", CLI_STR, OFF(trace_path), 0, 0, NULL, NULL,
     "every routing decision: `pos layer e1 .. ek` per line (for `scripts/sim_expert_cache.py`)"},
    {"tok", "DIR", CLI_STR, OFF(tok_dir), 0, 0, NULL, NULL,
     "tokenizer only: `k3 --tok DIR (--encode FILE | --decode FILE) [--no-special]` (ids are space-separated)"},
    {"encode", "FILE", CLI_STR, OFF(encode_file), 0, 0, NULL, NULL, NULL},
    {"decode", "FILE", CLI_STR, OFF(decode_file), 0, 0, NULL, NULL, NULL},
    {"no-special", NULL, CLI_SWITCH, OFF(no_special), 1, 0, NULL, NULL, NULL},
    {"doctor", NULL, CLI_SWITCH, OFF(doctor), 1, 0, NULL, NULL,
     "`k3 --doctor [MODEL_DIR] [--json FILE]`: checks this machine (SIMD, NUMA, memory, /dev/shm, limits, the "
     "model's file system and read rate) and recommends `--mem-gb`, `--workers`, `--threads` with an s/token estimate "
     "(at `--mem-gb X` when given)"},
    {"verify", NULL, CLI_SWITCH, OFF(verify), 1, 0, NULL, NULL,
     "`k3 --verify MODEL_DIR [--sha256] [--expect FILE] [--json FILE]`: reads every byte once and checks headers, "
     "index, dtypes/shapes, MXFP4 scale bytes and float values; `--sha256` prints each shard's digest, `--expect` "
     "compares with a sha256sum file; exit 2 names every problem"},
    {"sha256", NULL, CLI_SWITCH, OFF(sha256), 1, 0, NULL, NULL, NULL},
    {"expect", "FILE", CLI_STR, OFF(expect_path), 0, 0, NULL, NULL, NULL},
    {"help", NULL, CLI_FN, 0, 0, 0, show_help, NULL,
     "this text; `--help-markdown` prints this table (the README's is generated from it)"},
    {"help-markdown", NULL, CLI_FN, 0, 0, 0, show_help, NULL, NULL},
};
#define N_FLAGS (sizeof FLAGS / sizeof FLAGS[0])

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

/* Applies one flag (arg NULL for a switch). */
static int apply(options *o, const cli_flag *f, const char *arg, k3_error *err) {
    char *base = (char *)o;
    switch (f->kind) {
    case CLI_SWITCH: *(int *)(base + f->off) = (int)f->lo; return 0;
    case CLI_STR: *(const char **)(base + f->off) = arg; return 0;
    case CLI_LONG:
        if (parse_long(arg, (long)f->lo, (long)f->hi, (long *)(base + f->off)))
            return k3_refuse(err, "--%s wants an integer in [%ld, %ld], got '%s'", f->name, (long)f->lo, (long)f->hi, arg);
        return 0;
    case CLI_DOUBLE: {
        char *end;
        errno = 0;
        double v = strtod(arg, &end);
        if (errno || end == arg || *end || !(v > f->lo && v < f->hi))
            return k3_refuse(err, "--%s wants a number in (%g, %g), got '%s'", f->name, f->lo, f->hi, arg);
        *(double *)(base + f->off) = v;
        return 0;
    }
    case CLI_FN: return f->fn(o, f, arg, err);
    }
    return k3_fail(err, "--%s: bad flag table entry", f->name);
}

int cli_defaults(options *o, k3_error *err) {
    memset(o, 0, sizeof *o);
    o->workers = -1; /* one per NUMA node */
    sampler_config_default(&o->sampling);
    for (size_t i = 0; i < N_FLAGS; i++)
        if (FLAGS[i].dflt && apply(o, &FLAGS[i], FLAGS[i].dflt, err))
            return k3_fail(err, "default of --%s", FLAGS[i].name);
    return 0;
}

int cli_parse(int argc, char **argv, options *o) {
    k3_error err = {0};
    struct option longopts[N_FLAGS + 1];
    for (size_t i = 0; i < N_FLAGS; i++)
        longopts[i] = (struct option){FLAGS[i].name, FLAGS[i].arg ? required_argument : no_argument, 0, 256 + (int)i};
    longopts[N_FLAGS] = (struct option){0, 0, 0, 0};
    if (cli_defaults(o, &err)) { fprintf(stderr, "k3: %s\n", err.msg); return -1; }
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (ch == 'h') { cli_usage(stdout); exit(EXIT_OK); }
        if (ch < 256 || ch >= 256 + (int)N_FLAGS) {
            fprintf(stderr, "k3: unknown or incomplete option '%s'\n", argv[optind - 1]);
            return -1;
        }
        if (apply(o, &FLAGS[ch - 256], optarg, &err)) { fprintf(stderr, "k3: %s\n", err.msg); return -1; }
    }
    if (o->list_presets) return 0;
    if (o->encode_file || o->decode_file) {
        if (!o->tok_dir && optind == argc - 1) o->tok_dir = argv[optind++];
        if (!o->tok_dir || optind != argc || (o->encode_file && o->decode_file)) {
            fprintf(stderr, "k3: tokenizer mode is: k3 --tok DIR (--encode FILE | --decode FILE) [--no-special]\n");
            return -1;
        }
        return 0;
    }
    if (o->doctor || o->verify) { /* operator tools (doctor.h, verify.h) */
        if ((o->doctor && o->verify) || optind < argc - 1 || (o->verify && optind != argc - 1) || ((o->sha256 || o->expect_path) && !o->verify)) {
            fprintf(stderr, "k3: the tools are: k3 --doctor [MODEL_DIR] [--mem-gb X] [--json FILE] | k3 --verify MODEL_DIR [--sha256] [--expect FILE] [--json FILE]\n");
            return -1;
        }
        o->model_dir = optind < argc ? argv[optind] : NULL;
        return 0;
    }
    if (optind != argc - 1) { fprintf(stderr, "k3: expected exactly one MODEL_DIR\n"); return -1; }
    o->model_dir = argv[optind];
    if (o->mem_gb > 0 && o->preset) { fprintf(stderr, "k3: give --mem-gb or --preset, not both\n"); return -1; }
    if (o->plan_only) return 0;
    int sources = !!o->ids_arg + !!o->prompt + !!o->prompt_file;
    if (o->serve) {
        if (o->chat || sources || o->teacher_force || o->full_recompute || o->logits_path || o->json_path) {
            fprintf(stderr, "k3: --serve takes its prompts over HTTP: no --chat, --ids/--prompt/--prompt-file, --teacher-force, --full-recompute, --dump-logits or --json\n");
            return -1;
        }
        if (o->parallel > o->chunk) {
            fprintf(stderr, "k3: --parallel %ld is more than --chunk %ld (a step feeds at most --chunk tokens)\n", o->parallel, o->chunk);
            return -1;
        }
        return 0;
    }
    if (o->resume) {
        if (sources || o->load_state || o->chat || o->teacher_force) {
            fprintf(stderr, "k3: --resume continues the checkpointed run as it was: no --ids/--prompt/--prompt-file, "
                            "--load-state, --chat or --teacher-force\n");
            return -1;
        }
        return 0;
    }
    if (o->load_state && o->teacher_force) {
        fprintf(stderr, "k3: --teacher-force needs the whole prompt: not with --load-state\n");
        return -1;
    }
    if (o->chat && (o->checkpoint || o->save_state)) {
        fprintf(stderr, "k3: in --chat, save with /save FILE (no --checkpoint or --save-state)\n");
        return -1;
    }
    if (o->chat) {
        if (sources || o->teacher_force || o->full_recompute || o->logits_path || o->json_path) {
            fprintf(stderr, "k3: --chat reads the conversation from stdin: no --ids/--prompt/--prompt-file, --teacher-force, --full-recompute, --dump-logits or --json\n");
            return -1;
        }
        return 0;
    }
    if (sources > 1 || (sources == 0 && !o->load_state)) {
        fprintf(stderr, "k3: give exactly one of --ids, --prompt, --prompt-file (optional with --load-state)\n");
        return -1;
    }
    return 0;
}

/* ---- the usage text and the README table, both from FLAGS ---- */

static const char SYNOPSIS[] =
    "bin/k3 MODEL_DIR (--ids 1,2,3 | --prompt TEXT | --prompt-file FILE) [options]\n"
    "bin/k3 MODEL_DIR --chat [options]\n"
    "bin/k3 MODEL_DIR --serve [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--parallel N] [--max-queue N] [options]\n"
    "bin/k3 MODEL_DIR --plan-only [--mem-gb X | --preset NAME] [--max-context N]\n"
    "bin/k3 --tok DIR (--encode FILE | --decode FILE) [--no-special]\n"
    "bin/k3 --doctor [MODEL_DIR] [--mem-gb X] [--json FILE]\n"
    "bin/k3 --verify MODEL_DIR [--sha256] [--expect FILE] [--json FILE]\n";

/* A README row / usage entry: flag i and the following flags whose help is NULL. */
static size_t row_end(size_t i) {
    size_t j = i + 1;
    while (j < N_FLAGS && !FLAGS[j].help) j++;
    return j;
}

/* The help of the row [i, j) followed by its defaults, into buf (markdown; backticks kept). */
static void row_help(size_t i, size_t j, char *buf, size_t len) {
    size_t n = (size_t)snprintf(buf, len, "%s", FLAGS[i].help);
    int nd = 0;
    for (size_t k = i; k < j; k++) nd += FLAGS[k].dflt != NULL;
    for (size_t k = i, d = 0; k < j && n < len; k++) {
        if (!FLAGS[k].dflt) continue;
        const char *pre = d++ ? ", " : nd > 1 ? " (defaults: " : " (default ";
        if (FLAGS[k].kind == CLI_SWITCH) n += (size_t)snprintf(buf + n, len - n, "%s`--%s`", pre, FLAGS[k].name);
        else if (j - i > 1) n += (size_t)snprintf(buf + n, len - n, "%s`--%s %s`", pre, FLAGS[k].name, FLAGS[k].dflt);
        else n += (size_t)snprintf(buf + n, len - n, "%s%s", pre, FLAGS[k].dflt);
    }
    if (nd && n < len) snprintf(buf + n, len - n, ")");
}

void cli_markdown(FILE *f) {
    fprintf(f, "```\n%s```\n\n| option | meaning |\n|---|---|\n", SYNOPSIS);
    char help[2048];
    for (size_t i = 0; i < N_FLAGS; i = row_end(i)) {
        size_t j = row_end(i);
        fputs("| ", f);
        for (size_t k = i; k < j; k++) {
            fprintf(f, "%s`--%s", k > i ? ", " : "", FLAGS[k].name);
            if (FLAGS[k].arg) {
                fputc(' ', f);
                for (const char *c = FLAGS[k].arg; *c; c++) {
                    if (*c == '|') fputc('\\', f);
                    fputc(*c, f);
                }
            }
            fputc('`', f);
        }
        fputs(" | ", f);
        row_help(i, j, help, sizeof help);
        for (const char *c = help; *c; c++) {
            if (*c == '|') fputc('\\', f); /* a table cell, even inside `code` */
            fputc(*c, f);
        }
        fputs(" |\n", f);
    }
}

/* The same rows as plain text: flags, then the help (backticks dropped) wrapped at 96 columns. */
void cli_usage(FILE *f) {
    fprintf(f, "usage:\n");
    for (const char *s = SYNOPSIS; *s;) {
        const char *e = strchr(s, '\n');
        fprintf(f, "  %.*s\n", (int)(e - s), s);
        s = e + 1;
    }
    fprintf(f, "options:\n");
    char help[2048];
    for (size_t i = 0; i < N_FLAGS; i = row_end(i)) {
        size_t j = row_end(i);
        fputs("  ", f);
        for (size_t k = i; k < j; k++)
            fprintf(f, "%s--%s%s%s", k > i ? ", " : "", FLAGS[k].name, FLAGS[k].arg ? " " : "", FLAGS[k].arg ? FLAGS[k].arg : "");
        row_help(i, j, help, sizeof help);
        size_t n = 0;
        for (const char *c = help; *c; c++)
            if (*c != '`') help[n++] = *c;
        help[n] = 0;
        fputs("\n      ", f);
        size_t col = 6;
        char *save = NULL;
        for (char *w = strtok_r(help, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
            size_t wl = strlen(w);
            if (col > 6 && col + 1 + wl > 96) { fputs("\n      ", f); col = 6; }
            else if (col > 6) { fputc(' ', f); col++; }
            fputs(w, f);
            col += wl;
        }
        fputc('\n', f);
    }
    fprintf(f, "exit status: 0 ok, 2 usage or refused model/input, 1 run-time failure\n");
}
