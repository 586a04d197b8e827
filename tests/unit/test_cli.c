/* test_cli.c - the flag table of coordinator/cli.c: defaults equal what the rest of the
 * engine assumes, every flag parses, ranges and bad values are refused, the help and the
 * markdown table list every flag (the README is checked against --help-markdown by
 * tests/t_06_cli.sh). */
#include "coordinator/cli.h"
#include "tests/unit/check.h"
#include "workers/expert_cache.h"
#include <stdlib.h>
#include <string.h>
#include <getopt.h>
#include <stdarg.h>

static int parse(options *o, const char *a0, ...) {
    char *argv[64];
    int argc = 0;
    argv[argc++] = (char *)"k3";
    va_list ap;
    va_start(ap, a0);
    for (const char *a = a0; a && argc < 63; a = va_arg(ap, const char *)) argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    optind = 0; /* glibc: full re-initialisation of getopt */
    FILE *saved = stderr;
    stderr = fopen("/dev/null", "w");
    int rc = cli_parse(argc, argv, o);
    fclose(stderr);
    stderr = saved;
    return rc;
}

int main(void) {
    options o;
    k3_error err = {0};
    CHECK(cli_defaults(&o, &err) == 0, "defaults: %s", err.msg);
    sampler_config sd;
    sampler_config_default(&sd);
    CHECK(o.gen == 16 && o.chunk == 64 && o.simd == SIMD_AUTO && o.workers == -1 && o.workers_per_node == 1,
          "gen %ld chunk %ld workers %ld", o.gen, o.chunk, o.workers);
    CHECK(o.timeout_ms == 30000 && o.max_restarts == 3 && o.numa == 1 && o.thinking == 1 && o.max_tokens == 512,
          "timeout %ld restarts %ld numa %d thinking %d", o.timeout_ms, o.max_restarts, o.numa, o.thinking);
    CHECK(o.tmpl == CHAT_TEMPLATE_AUTO && o.cache_mb == 0 && o.mem_gb == 0 && !o.preset, "template/cache/mem");
    CHECK(!memcmp(&o.sampling, &sd, sizeof sd), "sampling defaults differ from sampler_config_default");
    cache_policy pol;
    CHECK(o.cache_policy && cache_policy_parse(o.cache_policy, &pol) == 0 && pol == CACHE_POLICY_DEFAULT,
          "the table's --expert-cache-policy default is not CACHE_POLICY_DEFAULT (%s)", cache_policy_name(CACHE_POLICY_DEFAULT));

    CHECK(parse(&o, "m", "--ids", "1,2", "--gen", "5", "--threads", "2", "--simd", "scalar", "--workers", "0",
                "--expert-cache-mb", "1.5", "--no-thinking", "--stop-id", "3,4", "--stop-id", "9", "--seed", "7",
                "--temperature", "0.5", "--numa", "off", "--expert-cache-policy", "lru", NULL) == 0, "full line");
    CHECK(o.gen == 5 && o.threads == 2 && o.simd == SIMD_SCALAR && o.workers == 0 && o.cache_mb == 1.5 && !o.thinking &&
          o.numa == 0 && !strcmp(o.cache_policy, "lru") && !strcmp(o.model_dir, "m") && !strcmp(o.ids_arg, "1,2"),
          "values");
    CHECK(o.n_stop_ids == 3 && o.stop_ids[0] == 3 && o.stop_ids[1] == 4 && o.stop_ids[2] == 9, "stop ids");
    CHECK(o.sampling.seed == 7 && o.sampling.temperature == 0.5, "sampling");
    free(o.stop_ids);

    /* refusals */
    const char *bad[][3] = {{"--gen", "-1", 0},          {"--gen", "x", 0},           {"--threads", "0", 0},
                            {"--chunk", "4097", 0},      {"--workers", "257", 0},     {"--expert-cache-mb", "0", 0},
                            {"--expert-cache-mb", "1e9", 0}, {"--mem-gb", "-2", 0},   {"--mem-gb", "nan", 0},
                            {"--simd", "sse", 0},        {"--numa", "on", 0},         {"--template", "k4", 0},
                            {"--expert-cache-policy", "fifo", 0}, {"--stop-id", "1,,2", 0}, {"--top-p", "2", 0},
                            {"--worker-timeout-ms", "99", 0}, {"--max-restarts", "1001", 0}, {"--bogus", "1", 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(parse(&o, "m", "--ids", "1", bad[i][0], bad[i][1], NULL) == -1, "%s %s accepted", bad[i][0], bad[i][1]);
        free(o.stop_ids);
    }
    CHECK(parse(&o, "m", NULL) == -1, "no prompt accepted");
    CHECK(parse(&o, "m", "--ids", "1", "--prompt", "x", NULL) == -1, "two prompts accepted");
    CHECK(parse(&o, "m", "--chat", "--ids", "1", NULL) == -1, "--chat with --ids accepted");
    CHECK(parse(&o, "m", "--ids", "1", "--mem-gb", "1", "--preset", "laptop", NULL) == -1, "--mem-gb with --preset");
    CHECK(parse(&o, "m", "--plan-only", NULL) == 0 && o.plan_only, "--plan-only");
    CHECK(parse(&o, "--tok", "d", "--encode", "f", NULL) == 0 && !strcmp(o.tok_dir, "d"), "tokenizer mode");
    CHECK(parse(&o, "--list-presets", NULL) == 0 && o.list_presets, "--list-presets");

    /* every flag in --help and --help-markdown */
    char *u = NULL, *m = NULL;
    size_t ul = 0, ml = 0;
    FILE *f = open_memstream(&u, &ul);
    cli_usage(f);
    fclose(f);
    f = open_memstream(&m, &ml);
    cli_markdown(f);
    fclose(f);
    const char *names[] = {"ids", "prompt-file", "gen", "seed", "stop-id", "chat", "no-thinking", "json", "threads",
                           "expert-cache-mb", "expert-cache-policy", "mem-gb", "list-presets", "max-context",
                           "dump-expert-trace", "tok", "no-special", "help-markdown"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char a[64], b[64];
        snprintf(a, sizeof a, "--%s", names[i]);
        snprintf(b, sizeof b, "`--%s", names[i]);
        CHECK(strstr(u, a) != NULL, "--help lacks %s", a);
        CHECK(strstr(m, b) != NULL, "--help-markdown lacks %s", b);
    }
    CHECK(strstr(u, "4096") == NULL || strstr(u, "at most 4096") == NULL, "stale --expert-cache-mb default");
    free(u);
    free(m);
    return check_report("test_cli");
}
