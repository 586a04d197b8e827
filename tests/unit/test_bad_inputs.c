/* test_bad_inputs.c - replays the bad-input corpus tests/bad/ (see
 * tests/bad/make_bad.py) through the matching parser, and runs config_parse on
 * systematic mutations of a valid nested config.
 *
 *   tests/bad/config/NAME.json            config_parse
 *   tests/bad/safetensors/NAME.safetensors safetensors_open
 *   tests/bad/checkpoint/NAME/            checkpoint_open
 * Each input has NAME.expect (or EXPECT in a directory): the parser must refuse
 * (return -1) with a non-empty message containing every line of the file; or
 * NAME.accept (ACCEPT): the parser must accept it (positive controls, so the
 * test cannot pass by refusing everything). An input with neither is a failure.
 *
 * Config mutations, on tests/bad/config/valid_nested.json (and on
 * tests/models/m13/config.json when that model is present): every required key
 * deleted in turn (message names the key), every other key deleted in turn
 * (still accepted), every required key given ill-typed values, the flat layout
 * equal to the nested one. Run from the repository root (K3_BAD_DIR overrides
 * tests/bad). Exits non-zero and prints every failure. */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/checkpoint.h"
#include "common/config.h"
#include "common/safetensors.h"
#include "tests/unit/check.h"

#define failures check_failures /* tests/unit/check.h's counters */
#define checks check_count

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
    failures++;
    if (failures > 100) return;
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

/* snprintf that treats truncation as a test failure (paths are short). */
static void fmt(char *buf, size_t n, const char *f, ...) __attribute__((format(printf, 3, 4)));
static void fmt(char *buf, size_t n, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    int r = vsnprintf(buf, n, f, ap);
    va_end(ap);
    if (r < 0 || (size_t)r >= n) fail("string too long: %s...", buf);
}

/* Reads a whole file; NULL if it cannot. *len excludes the added NUL. */
static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        cap *= 2;
        char *nb = realloc(buf, cap + 1);
        if (!nb) { free(buf); buf = NULL; break; }
        buf = nb;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    if (len) *len = n;
    return buf;
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Checks one parser outcome. expect_path: a file of substrings (one a line) or NULL
 * for "must be accepted". */
static void check_outcome(const char *what, int rc, const k3_error *err, const char *expect_path) {
    checks++;
    if (!expect_path) {
        if (rc != 0) fail("%s: a valid input was refused: %s", what, err->msg);
        return;
    }
    if (rc == 0) { fail("%s: accepted, expected a refusal", what); return; }
    if (rc != -1) fail("%s: returned %d, expected -1", what, rc);
    if (!err->set || !err->msg[0]) { fail("%s: refused with an empty message", what); return; }
    char *ex = read_file(expect_path, NULL);
    if (!ex) { fail("%s: cannot read %s", what, expect_path); return; }
    int lines = 0;
    for (char *line = strtok(ex, "\n"); line; line = strtok(NULL, "\n")) {
        if (!*line) continue;
        lines++;
        if (!strstr(err->msg, line)) fail("%s: message lacks \"%s\": %s", what, line, err->msg);
    }
    if (!lines) fail("%s: %s names no expected substring", what, expect_path);
    free(ex);
}

static int has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

typedef struct { int refused, accepted; } tally;

/* Finds NAME.expect / NAME.accept next to dir/NAME.ext (or EXPECT / ACCEPT inside a
 * directory case). Returns 1 = expect (path in out), 0 = accept, -1 = neither. */
static int find_expectation(const char *dir, const char *stem, int is_dir, char *out, size_t outlen) {
    char acc[4096];
    if (is_dir) {
        fmt(out, outlen, "%s/%s/EXPECT", dir, stem);
        fmt(acc, sizeof acc, "%s/%s/ACCEPT", dir, stem);
    } else {
        fmt(out, outlen, "%s/%s.expect", dir, stem);
        fmt(acc, sizeof acc, "%s/%s.accept", dir, stem);
    }
    int e = exists(out), a = exists(acc);
    if (e && a) return -2;
    return e ? 1 : a ? 0 : -1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The sorted entries of dir whose name ends with ext (ext "" = subdirectories). */
static char **list_dir(const char *dir, const char *ext, size_t *n) {
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    size_t cap = 64;
    char **names = malloc(cap * sizeof *names);
    struct dirent *de;
    while (names && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char path[4096];
        fmt(path, sizeof path, "%s/%s", dir, de->d_name);
        struct stat st;
        if (stat(path, &st) != 0) continue;
        if (ext[0] ? !(S_ISREG(st.st_mode) && has_suffix(de->d_name, ext)) : !S_ISDIR(st.st_mode)) continue;
        if (*n == cap) {
            cap *= 2;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) break;
            names = nn;
        }
        if (!(names[*n] = strdup(de->d_name))) break;
        (*n)++;
    }
    closedir(d);
    if (names) qsort(names, *n, sizeof *names, cmp_str);
    return names;
}

static void free_list(char **names, size_t n) {
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
}

enum { KIND_CONFIG, KIND_SAFETENSORS, KIND_CHECKPOINT };

static tally run_corpus(const char *root, const char *sub, int kind) {
    tally t = {0, 0};
    char dir[4096];
    fmt(dir, sizeof dir, "%s/%s", root, sub);
    const char *ext = kind == KIND_CONFIG ? ".json" : kind == KIND_SAFETENSORS ? ".safetensors" : "";
    size_t n;
    char **names = list_dir(dir, ext, &n);
    if (!names) { fail("%s: cannot list", dir); return t; }
    for (size_t i = 0; i < n; i++) {
        char stem[1024], path[4096], expect[4096], what[4200];
        fmt(stem, sizeof stem, "%.*s", (int)(strlen(names[i]) - strlen(ext)), names[i]);
        fmt(path, sizeof path, "%s/%s", dir, names[i]);
        fmt(what, sizeof what, "%s", path);
        int ex = find_expectation(dir, stem, kind == KIND_CHECKPOINT, expect, sizeof expect);
        if (ex < 0) {
            fail("%s: %s", path, ex == -2 ? "has both an expect and an accept file" : "has no .expect or .accept file");
            continue;
        }
        k3_error err = {0};
        int rc;
        if (kind == KIND_CONFIG) {
            size_t len;
            char *text = read_file(path, &len);
            if (!text) { fail("%s: cannot read", path); continue; }
            /* exact-size copy: the parser must not read past len */
            char *exact = malloc(len ? len : 1);
            if (!exact) { free(text); fail("out of memory"); continue; }
            memcpy(exact, text, len);
            free(text);
            k3_config cfg;
            rc = config_parse(exact, len, path, &cfg, &err);
            if (rc == 0) config_free(&cfg);
            free(exact);
        } else if (kind == KIND_SAFETENSORS) {
            st_file f;
            rc = safetensors_open(path, &f, &err);
            if (rc == 0) safetensors_free(&f);
        } else {
            checkpoint ck;
            rc = checkpoint_open(path, &ck, &err);
            if (rc == 0) checkpoint_close(&ck);
        }
        check_outcome(what, rc, &err, ex ? expect : NULL);
        if (ex) t.refused++;
        else t.accepted++;
    }
    free_list(names, n);
    return t;
}

/* ---- config mutations ---- */

static const char *const REQ_MAIN[] = {
    "hidden_size", "num_hidden_layers", "vocab_size", "rms_norm_eps", "hidden_act", "activation_situ_beta",
    "activation_situ_linear_beta", "intermediate_size", "first_k_dense_replace", "moe_layer_freq", "num_experts",
    "num_experts_per_token", "num_shared_experts", "moe_intermediate_size", "routed_expert_hidden_size",
    "latent_moe_use_norm", "moe_router_activation_func", "moe_renormalize", "routed_scaling_factor",
    "num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
    "qk_rope_head_dim", "v_head_dim", "mla_use_nope", "mla_use_output_gate", "attn_res_block_size", NULL};
static const char *const REQ_LINEAR[] = {"full_attn_layers", "num_heads", "head_dim", "short_conv_kernel_size",
                                         "use_full_rank_gate", NULL};

static int in_list(const char *const *list, const char *key) {
    for (; *list; list++)
        if (strcmp(*list, key) == 0) return 1;
    return 0;
}

/* Parses a JSON document; returns rc, fills err, frees the config. */
static int parse_json(json_t *doc, const char *path, k3_config *keep, k3_error *err) {
    char *text = json_dumps(doc, JSON_COMPACT);
    if (!text) { fail("%s: json_dumps failed", path); return -2; }
    k3_config cfg;
    int rc = config_parse(text, strlen(text), path, &cfg, err);
    free(text);
    if (rc == 0) {
        if (keep) *keep = cfg;
        else config_free(&cfg);
    }
    return rc;
}

static void expect_refused(json_t *doc, const char *what, const char *want1, const char *want2) {
    k3_error err = {0};
    checks++;
    int rc = parse_json(doc, what, NULL, &err);
    if (rc == 0) { fail("%s: accepted, expected a refusal naming '%s'", what, want1); return; }
    if (rc == -2) return;
    if (!err.set || !err.msg[0]) { fail("%s: empty message", what); return; }
    if (!strstr(err.msg, want1)) fail("%s: message lacks \"%s\": %s", what, want1, err.msg);
    if (want2 && !strstr(err.msg, want2)) fail("%s: message lacks \"%s\": %s", what, want2, err.msg);
}

static void expect_accepted(json_t *doc, const char *what) {
    k3_error err = {0};
    checks++;
    int rc = parse_json(doc, what, NULL, &err);
    if (rc == -1) fail("%s: refused: %s", what, err.msg);
}

/* The object a key lives in: text_config / linear_attn_config (nested) or the root (flat). */
typedef struct { json_t *root, *main, *linear; } cfg_doc;

static cfg_doc locate(json_t *root) {
    cfg_doc d = {root, root, NULL};
    json_t *tc = json_object_get(root, "text_config");
    if (json_is_object(tc)) d.main = tc;
    d.linear = json_object_get(d.main, "linear_attn_config");
    if (!d.linear && tc) d.linear = json_object_get(root, "linear_attn_config");
    if (!json_is_object(d.linear)) d.linear = NULL;
    return d;
}

/* Runs fn on a fresh copy of base with key (in main or linear) modified. */
static json_t *copy_with(json_t *base, const char *key, int linear, json_t *value /* stolen; NULL = delete */) {
    json_t *doc = json_deep_copy(base);
    cfg_doc d = locate(doc);
    json_t *obj = linear && d.linear ? d.linear : d.main;
    if (value) json_object_set_new(obj, key, value);
    else json_object_del(obj, key);
    return doc;
}

typedef enum { T_INT, T_NUM, T_BOOL, T_STR, T_ARRAY } field_type;

static field_type type_of(const char *key) {
    static const char *const nums[] = {"rms_norm_eps", "activation_situ_beta", "activation_situ_linear_beta",
                                       "routed_scaling_factor", NULL};
    static const char *const bools[] = {"latent_moe_use_norm", "moe_renormalize", "mla_use_nope", "mla_use_output_gate",
                                        "use_full_rank_gate", NULL};
    static const char *const strs[] = {"hidden_act", "moe_router_activation_func", NULL};
    if (in_list(nums, key)) return T_NUM;
    if (in_list(bools, key)) return T_BOOL;
    if (in_list(strs, key)) return T_STR;
    if (strcmp(key, "full_attn_layers") == 0) return T_ARRAY;
    return T_INT;
}

/* Values of the wrong JSON type for a field of type ty (NULL-terminated, new references). */
static int wrong_values(field_type ty, json_t **out) {
    int n = 0;
    if (ty != T_STR) out[n++] = json_string("7");
    if (ty == T_INT) out[n++] = json_real(7.5);
    if (ty == T_INT || ty == T_NUM || ty == T_STR || ty == T_ARRAY) out[n++] = json_true();
    if (ty == T_BOOL || ty == T_STR || ty == T_ARRAY) out[n++] = json_integer(1);
    out[n++] = json_null();
    out[n++] = json_object();
    if (ty != T_ARRAY) out[n++] = json_pack("[i]", 7);
    return n;
}

/* Every key of obj: required ones deleted -> refused naming the key; others deleted -> accepted
 * (strict = 1 only for the committed copy, whose optional keys are known). */
static void delete_each(json_t *base, const char *label, int linear, int strict) {
    cfg_doc d = locate(base);
    json_t *obj = linear ? d.linear : d.main;
    if (!obj) { fail("%s: no %s object", label, linear ? "linear_attn_config" : "main"); return; }
    const char *const *req = linear ? REQ_LINEAR : REQ_MAIN;
    /* every required key must be present in the base, or the deletion test is vacuous */
    for (const char *const *k = req; *k; k++) {
        int found = json_object_get(obj, *k) != NULL;
        if (!found && linear) found = json_object_get(d.main, *k) != NULL;
        if (!found) fail("%s: required key '%s' absent from the base config", label, *k);
    }
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        if (!linear && strcmp(key, "linear_attn_config") == 0) continue;
        json_t *doc = copy_with(base, key, linear, NULL);
        char what[512];
        fmt(what, sizeof what, "%s without '%s'", label, key);
        if (in_list(req, key)) expect_refused(doc, what, key, NULL);
        else if (strict) expect_accepted(doc, what);
        json_decref(doc);
    }
}

static void ill_type_each(json_t *base, const char *label) {
    for (int linear = 0; linear < 2; linear++)
        for (const char *const *k = linear ? REQ_LINEAR : REQ_MAIN; *k; k++) {
            json_t *vals[8];
            int n = wrong_values(type_of(*k), vals);
            for (int i = 0; i < n; i++) {
                char *vs = json_dumps(vals[i], JSON_ENCODE_ANY | JSON_COMPACT);
                char what[512];
                fmt(what, sizeof what, "%s with '%s' = %s", label, *k, vs ? vs : "?");
                free(vs);
                json_t *doc = copy_with(base, *k, linear, vals[i]);
                expect_refused(doc, what, *k, NULL);
                json_decref(doc);
            }
        }
}

/* Single-value edits: key = value JSON text, refusal must name want. */
typedef struct { const char *key; int linear; const char *value; const char *want; } edit;

static void apply_edits(json_t *base, const char *label, const edit *edits) {
    for (const edit *e = edits; e->key; e++) {
        json_error_t jerr;
        json_t *val = json_loads(e->value, JSON_DECODE_ANY, &jerr);
        if (!val) { fail("bad edit value %s", e->value); continue; }
        json_t *doc = copy_with(base, e->key, e->linear, val);
        char what[512];
        fmt(what, sizeof what, "%s with '%s' = %s", label, e->key, e->value);
        if (e->want) expect_refused(doc, what, e->want, NULL);
        else expect_accepted(doc, what);
        json_decref(doc);
    }
}

static void config_edits(json_t *base, const char *label) {
    int n = (int)json_integer_value(json_object_get(locate(base).main, "num_hidden_layers"));
    char out_of_range[64], bad_kda[64];
    fmt(out_of_range, sizeof out_of_range, "[%d]", n + 1);
    fmt(bad_kda, sizeof bad_kda, "[%d]", n + 1);
    const edit edits[] = {
        /* unsupported values */
        {"hidden_act", 0, "\"silu\"", "hidden_act"},
        {"hidden_act", 0, "\"swiglu\"", "hidden_act"},
        {"moe_router_activation_func", 0, "\"softmax\"", "moe_router_activation_func"},
        {"mla_use_nope", 0, "false", "mla_use_nope"},
        {"num_expert_group", 0, "2", "num_expert_group"},
        {"num_expert_group", 0, "8", "num_expert_group"},
        {"num_expert_group", 0, "\"1\"", "num_expert_group"},
        {"num_key_value_heads", 0, "1", "num_key_value_heads"},
        {"use_full_rank_gate", 1, "false", "use_full_rank_gate"},
        {"topk_method", 0, "\"greedy\"", "topk_method"},
        /* layer maps */
        {"full_attn_layers", 1, "[0]", "full_attn_layers"},
        {"full_attn_layers", 1, out_of_range, "full_attn_layers"},
        {"full_attn_layers", 1, "[-1]", "full_attn_layers"},
        {"full_attn_layers", 1, "[1, 1]", "full_attn_layers"},
        {"full_attn_layers", 1, "[1.0]", "full_attn_layers"},
        {"kda_layers", 1, "[]", "kda_layers"},
        {"kda_layers", 1, bad_kda, "kda_layers"},
        {"kda_layers", 1, "[0]", "kda_layers"},
        {"kda_layers", 1, "\"all\"", "kda_layers"},
        /* ranges */
        {"hidden_size", 0, "0", "hidden_size"},
        {"vocab_size", 0, "-1", "vocab_size"},
        {"num_hidden_layers", 0, "0", "num_hidden_layers"},
        {"rms_norm_eps", 0, "0", "rms_norm_eps"},
        {"rms_norm_eps", 0, "-1e-5", "rms_norm_eps"},
        {"moe_intermediate_size", 0, "33", "moe_intermediate_size"},
        {"routed_expert_hidden_size", 0, "0", "routed_expert_hidden_size"},
        {"attn_res_block_size", 0, "0", "attn_res_block_size"},
        {"short_conv_kernel_size", 1, "0", "short_conv_kernel_size"},
        {"gate_lower_bound", 1, "\"-5\"", "gate_lower_bound"},
        {"gate_lower_bound", 1, "null", NULL},
        {NULL, 0, NULL, NULL}};
    apply_edits(base, label, edits);
    /* tie_word_embeddings at the root too */
    json_t *doc = json_deep_copy(base);
    json_object_set_new(doc, "tie_word_embeddings", json_true());
    char what[512];
    fmt(what, sizeof what, "%s with root 'tie_word_embeddings' = true", label);
    expect_refused(doc, what, "tie_word_embeddings", NULL);
    json_decref(doc);
    /* kda_layers missing one layer / listing an MLA layer */
    json_t *full = json_object_get(locate(base).linear, "full_attn_layers");
    if (json_array_size(full) > 0 && n > 1) {
        doc = json_deep_copy(base);
        cfg_doc d = locate(doc);
        json_t *kda = json_object_get(d.linear, "kda_layers");
        if (json_array_size(kda) > 0) {
            json_array_remove(kda, 0);
            fmt(what, sizeof what, "%s with kda_layers missing its first entry", label);
            expect_refused(doc, what, "kda_layers", NULL);
            json_array_append(kda, json_array_get(full, 0));
            fmt(what, sizeof what, "%s with kda_layers listing an MLA layer", label);
            expect_refused(doc, what, "kda_layers", NULL);
        }
        json_decref(doc);
    }
    /* the whole text_config / linear_attn_config removed */
    doc = json_deep_copy(base);
    if (json_object_get(doc, "text_config")) {
        json_object_del(doc, "text_config");
        fmt(what, sizeof what, "%s without text_config", label);
        expect_refused(doc, what, "hidden_size", NULL);
    }
    json_decref(doc);
    doc = json_deep_copy(base);
    cfg_doc d = locate(doc);
    if (d.linear) {
        json_object_del(d.main, "linear_attn_config");
        json_object_del(doc, "linear_attn_config");
        fmt(what, sizeof what, "%s without linear_attn_config", label);
        expect_refused(doc, what, "num_heads", NULL); /* the first KDA key looked up */
    }
    json_decref(doc);
}

/* The flat form of a nested config: text_config and linear_attn_config keys at the root. */
static json_t *flatten(json_t *base) {
    json_t *flat = json_object();
    cfg_doc d = locate(base);
    const char *key;
    json_t *v;
    json_object_foreach(d.main, key, v)
        if (strcmp(key, "linear_attn_config") != 0) json_object_set(flat, key, v);
    if (d.linear) json_object_update(flat, d.linear);
    json_object_set_new(flat, "tie_word_embeddings", json_false());
    return flat;
}

static int same_config(const k3_config *a, const k3_config *b) {
#define SAME(f) (a->f == b->f)
    if (!(SAME(hidden_size) && SAME(num_hidden_layers) && SAME(vocab_size) && SAME(rms_norm_eps) && SAME(situ_beta) &&
          SAME(situ_linear_beta) && SAME(intermediate_size) && SAME(first_k_dense_replace) && SAME(moe_layer_freq) &&
          SAME(num_experts) && SAME(num_experts_per_token) && SAME(num_shared_experts) && SAME(moe_intermediate_size) &&
          SAME(routed_expert_hidden_size) && SAME(latent_moe_use_norm) && SAME(moe_renormalize) &&
          SAME(routed_scaling_factor) && SAME(num_attention_heads) && SAME(q_lora_rank) && SAME(kv_lora_rank) &&
          SAME(qk_nope_head_dim) && SAME(qk_rope_head_dim) && SAME(v_head_dim) && SAME(mla_use_output_gate) &&
          SAME(attn_res_block_size) && SAME(kda_num_heads) && SAME(kda_head_dim) && SAME(short_conv_kernel_size) &&
          SAME(has_gate_lower_bound) && SAME(gate_lower_bound)))
        return 0;
#undef SAME
    size_t n = (size_t)a->num_hidden_layers;
    return memcmp(a->layer_is_mla, b->layer_is_mla, n) == 0 && memcmp(a->layer_is_moe, b->layer_is_moe, n) == 0;
}

static void flat_layout(json_t *base, const char *label) {
    k3_config nested, flat_cfg;
    k3_error err = {0};
    char what[512];
    checks++;
    if (parse_json(base, label, &nested, &err)) { fail("%s: refused: %s", label, err.msg); return; }
    json_t *flat = flatten(base);
    fmt(what, sizeof what, "%s (flat layout)", label);
    checks++;
    if (parse_json(flat, what, &flat_cfg, &err)) {
        fail("%s: refused: %s", what, err.msg);
    } else {
        checks++;
        if (!same_config(&nested, &flat_cfg)) fail("%s: parses differently from the nested layout", what);
        config_free(&flat_cfg);
    }
    /* a required key missing from the flat file is still refused */
    json_t *doc = json_deep_copy(flat);
    json_object_del(doc, "num_heads");
    fmt(what, sizeof what, "%s (flat layout) without 'num_heads'", label);
    expect_refused(doc, what, "num_heads", NULL);
    json_decref(doc);
    json_decref(flat);
    config_free(&nested);
}

/* The committed base: the values in tests/bad/make_bad.py must come out as expected. */
static void check_base_values(json_t *base, const char *label) {
    k3_config c;
    k3_error err = {0};
    checks++;
    if (parse_json(base, label, &c, &err)) { fail("%s: refused: %s", label, err.msg); return; }
    checks++;
    static const unsigned char mla[4] = {0, 1, 0, 1}, moe[4] = {0, 1, 1, 1};
    if (c.hidden_size != 64 || c.num_hidden_layers != 4 || c.vocab_size != 256 || c.kda_num_heads != 2 ||
        c.kda_head_dim != 16 || c.short_conv_kernel_size != 4 || !c.has_gate_lower_bound || c.gate_lower_bound != -5.0 ||
        c.bos_token_id != 1 || c.eos_token_id != 2 || c.pad_token_id != 3 || c.situ_beta != 4.0 ||
        c.situ_linear_beta != 25.0 || memcmp(c.layer_is_mla, mla, 4) || memcmp(c.layer_is_moe, moe, 4))
        fail("%s: parsed values differ from the file (one-based layer map, KDA keys, token ids)", label);
    config_free(&c);
}

static void config_mutations(const char *path, int strict) {
    json_error_t jerr;
    json_t *base = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!base) { fail("%s: cannot load: %s", path, jerr.text); return; }
    if (strict) check_base_values(base, path);
    int before = checks;
    delete_each(base, path, 0, strict);
    delete_each(base, path, 1, strict);
    ill_type_each(base, path);
    config_edits(base, path);
    flat_layout(base, path);
    printf("%s: %d config mutations\n", path, checks - before);
    json_decref(base);
}

/* k3_escape / k3_fail: bytes quoted from files never reach a terminal raw. */
static void escape_cases(void) {
    static const struct { const char *in, *out; } c[] = {
        {"plain name.weight", "plain name.weight"},
        {"a\x1b[31mred\x07", "a\\x1b[31mred\\x07"},
        {"tab\tnl\ncr\rdel\x7f", "tab\\x09nl\\x0acr\\x0ddel\\x7f"},
        {"csi\xc2\x9b" "2J", "csi\\xc2\\x9b2J"},              /* U+009B, a C1 control */
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
        {"bad\xff\xc3", "bad\\xff\\xc3"},                  /* invalid / cut UTF-8 */
        {"sur\xed\xa0\x80", "sur\\xed\\xa0\\x80"},       /* a surrogate */
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        char out[128];
        k3_escape(out, sizeof out, c[i].in, strlen(c[i].in));
        checks++;
        if (strcmp(out, c[i].out)) fail("k3_escape case %zu: got '%s'", i, out);
        k3_error e = {0};
        k3_fail(&e, "tensor '%s'", c[i].in);
        checks++;
        for (const char *p = e.msg; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f) { fail("k3_fail case %zu left a control byte", i); break; }
    }
    char small[6]; /* never cuts an escape in half, always terminated */
    k3_escape(small, sizeof small, "ab\x1b", 3);
    checks++;
    if (strcmp(small, "ab")) fail("k3_escape into 6 bytes: got '%s'", small);
}

/* floats_first_nonfinite against a value-by-value scan: every dtype, lengths around its block and
 * quarter sizes, one NaN / Inf / -Inf (or two) planted at every lane of a word, in each quarter,
 * in the tail; values with all-but-one exponent bits set and subnormals must pass */
static size_t nonfinite_ref(const unsigned char *b, st_dtype dt, size_t n) {
    for (size_t i = 0; i < n; i++) { /* through the values themselves, as floats */
        float f;
        if (dt == ST_BF16) {
            uint16_t v;
            memcpy(&v, b + 2 * i, 2);
            const uint32_t u = (uint32_t)v << 16;
            memcpy(&f, &u, 4);
        } else memcpy(&f, b + 4 * i, 4);
        if (!isfinite(f)) return i;
    }
    return n;
}
static void nonfinite_scan_cases(void) {
    enum { MAXN = 1200 };
    static unsigned char buf[4 * MAXN + 8];
    static const size_t lens[] = {0, 1, 3, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 1000, 1199};
    static const uint16_t bad16[] = {0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffff};
    static const uint32_t bad32[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu};
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (int d = 0; d < 2; d++) {
        const st_dtype dt = d ? ST_F32 : ST_BF16;
        for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
            const size_t n = lens[li];
            for (size_t plant = 0; plant <= n + 1; plant += plant < 80 ? 1 : 7) {
                for (size_t i = 0; i < n; i++) { /* finite: near-max exponents, subnormals, zeros */
                    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                    const unsigned r = (unsigned)(rng >> 32);
                    if (d) {
                        const uint32_t v = (r & 3) == 0 ? 0x7f7fffffu ^ (r & 0x80000000u) : (r & 3) == 1 ? (r & 0x807fffffu) : (r & 0xbfffffffu);
                        memcpy(buf + 4 * i, &v, 4);
                    } else {
                        const uint16_t v = (uint16_t)((r & 3) == 0 ? 0x7f7f ^ (r & 0x8000) : (r & 3) == 1 ? (r & 0x807f) : (r & 0xbfff));
                        memcpy(buf + 2 * i, &v, 2);
                    }
                }
                if (plant < n) { /* plant >= n: none planted */
                    const unsigned k = (unsigned)(plant % 5);
                    if (d) memcpy(buf + 4 * plant, &bad32[k], 4);
                    else memcpy(buf + 2 * plant, &bad16[k], 2);
                    if (n > 4 && plant + n / 2 < n) { /* a second one further on (another quarter) */
                        if (d) memcpy(buf + 4 * (plant + n / 2), &bad32[(k + 1) % 5], 4);
                        else memcpy(buf + 2 * (plant + n / 2), &bad16[(k + 1) % 5], 2);
                    }
                }
                const size_t want = nonfinite_ref(buf, dt, n), got = floats_first_nonfinite(buf, dt, n);
                checks++;
                if (got != want) fail("floats_first_nonfinite(%s, n %zu, planted at %zu): %zu, want %zu", d ? "F32" : "BF16", n, plant, got, want);
            }
        }
    }
    /* a value only in the last quarter, and only in the tail beyond the quarters */
    for (int d = 0; d < 2; d++) {
        const st_dtype dt = d ? ST_F32 : ST_BF16;
        const size_t n = 1199, es = d ? 4 : 2;
        for (size_t at = n - 80; at < n; at++) {
            memset(buf, 0, es * n);
            if (d) memcpy(buf + 4 * at, &bad32[0], 4);
            else memcpy(buf + 2 * at, &bad16[0], 2);
            checks++;
            if (floats_first_nonfinite(buf, dt, n) != at) fail("floats_first_nonfinite: a lone value at %zu of %zu missed", at, n);
        }
    }
}

int main(void) {
    escape_cases();
    nonfinite_scan_cases();
    const char *root = getenv("K3_BAD_DIR");
    if (!root) root = "tests/bad";
    char path[4096];
    static const struct { const char *sub; int kind, min_refused; } corpora[] = {
        {"config", KIND_CONFIG, 40}, {"safetensors", KIND_SAFETENSORS, 30}, {"checkpoint", KIND_CHECKPOINT, 10}};
    for (size_t i = 0; i < sizeof corpora / sizeof *corpora; i++) {
        tally t = run_corpus(root, corpora[i].sub, corpora[i].kind);
        printf("%s/%s: %d refused, %d accepted\n", root, corpora[i].sub, t.refused, t.accepted);
        if (t.refused < corpora[i].min_refused) fail("%s/%s: only %d bad inputs found", root, corpora[i].sub, t.refused);
        if (t.accepted < 1) fail("%s/%s: no positive control", root, corpora[i].sub);
    }
    fmt(path, sizeof path, "%s/config/valid_nested.json", root);
    config_mutations(path, 1);
    if (exists("tests/models/m13/config.json")) config_mutations("tests/models/m13/config.json", 0);
    else printf("tests/models/m13/config.json absent: mutations on the committed copy only\n");
    printf("test_bad_inputs: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
