/* openai_api.c - request validation and rendering (contract: openai_api.h). */
#include "coordinator/openai_api.h"
#include "coordinator/xtml.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *err, *param;
    size_t errlen, paramlen;
} ectx;

static int refuse(ectx *e, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int refuse(ectx *e, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->err, e->errlen, fmt, ap);
    va_end(ap);
    snprintf(e->param, e->paramlen, "%s", param);
    return -1;
}

void api_request_free(api_request *r) {
    for (size_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    chat_ids_free(&r->prompt);
    chat_ids_free(&r->force);
    chat_ids_free(&r->force_after);
    free(r->tool_name);
    free(r->stop_ids);
    memset(r, 0, sizeof *r);
}

char *api_error_json(const char *message, const char *type, const char *param, const char *code) {
    json_t *o = json_object(), *e = json_object();
    json_t *m = json_string(message);
    json_object_set_new(e, "message", m ? m : json_string("(message not valid UTF-8)"));
    json_object_set_new(e, "type", json_string(type));
    json_object_set_new(e, "param", param && param[0] ? json_string(param) : json_null());
    json_object_set_new(e, "code", code ? json_string(code) : json_null());
    json_object_set_new(o, "error", e);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* A number field: absent -> keep *out; wrong type or out of [lo, hi] -> refused. */
static int get_num(ectx *e, const json_t *o, const char *key, double lo, double hi, double *out) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return refuse(e, key, "%s must be a number", key);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) return refuse(e, key, "%s must be in [%g, %g], got %g", key, lo, hi, d);
    *out = d;
    return 0;
}

static int get_int(ectx *e, const json_t *o, const char *key, long long lo, long long hi, long long *out, int *given) {
    const json_t *v = json_object_get(o, key);
    if (given) *given = 0;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return refuse(e, key, "%s must be an integer", key);
    long long d = json_integer_value(v);
    if (d < lo || d > hi) return refuse(e, key, "%s must be in [%lld, %lld], got %lld", key, lo, hi, d);
    *out = d;
    if (given) *given = 1;
    return 0;
}

static int get_bool(ectx *e, const json_t *o, const char *key, int *out) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return refuse(e, key, "%s must be true or false", key);
    *out = json_is_true(v);
    return 0;
}

static int parse_stop(ectx *e, const json_t *o, api_request *r) {
    const json_t *v = json_object_get(o, "stop");
    if (!v || json_is_null(v)) return 0;
    size_t n = json_is_string(v) ? 1 : json_is_array(v) ? json_array_size(v) : (size_t)-1;
    if (n == (size_t)-1) return refuse(e, "stop", "stop must be a string or an array of strings");
    if (n > 16) return refuse(e, "stop", "stop: at most 16 sequences, got %zu", n);
    if (!(r->stop = calloc(n ? n : 1, sizeof *r->stop))) return -2;
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_is_string(v) ? v : json_array_get(v, i);
        char p[32];
        snprintf(p, sizeof p, "stop[%zu]", i);
        if (!json_is_string(s) || json_string_length(s) == 0 || json_string_length(s) > 1024)
            return refuse(e, p, "%s must be a non-empty string of at most 1024 bytes", p);
        if (!(r->stop[i] = strdup(json_string_value(s)))) return -2;
        r->n_stop++;
    }
    return 0;
}

/* logit_bias: {"<token id>": bias in [-100, 100], ...} (OpenAI's form: ids as decimal strings) */
static int parse_logit_bias(const api_context *c, ectx *e, const json_t *o, api_request *r) {
    const json_t *v = json_object_get(o, "logit_bias");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v)) return refuse(e, "logit_bias", "logit_bias must be an object of token ids to numbers");
    if (json_object_size(v) > K3_MAX_LOGIT_BIAS)
        return refuse(e, "logit_bias", "logit_bias: at most %d tokens, got %zu", K3_MAX_LOGIT_BIAS, json_object_size(v));
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val) {
        char p[48];
        snprintf(p, sizeof p, "logit_bias.%.32s", key);
        long long id = -1;
        size_t kl = strlen(key);
        if (kl == 0 || kl > 10 || strspn(key, "0123456789") != kl)
            return refuse(e, p, "logit_bias: key \"%.32s\" is not a token id", key);
        id = strtoll(key, NULL, 10);
        if ((size_t)id >= c->vocab)
            return refuse(e, p, "logit_bias: token id %lld is outside the vocabulary [0, %zu)", id, c->vocab);
        if (!json_is_number(val)) return refuse(e, p, "%s must be a number", p);
        const double b = json_number_value(val);
        if (!(b >= -100 && b <= 100)) return refuse(e, p, "%s must be in [-100, 100], got %g", p, b);
        for (size_t i = 0; i < r->sampling.n_bias; i++)
            if (r->sampling.bias[i].id == (int32_t)id)
                return refuse(e, p, "logit_bias: token id %lld is given twice", id);
        r->sampling.bias[r->sampling.n_bias++] = (sampler_bias){(int32_t)id, b};
    }
    return 0;
}

static int parse_common(const api_context *c, ectx *e, const json_t *o, api_request *r, int chat) {
    int rc;
    const json_t *v;
    if ((v = json_object_get(o, "model")) && !json_is_string(v) && !json_is_null(v))
        return refuse(e, "model", "model must be a string");
    long long n = 1;
    if ((rc = get_int(e, o, "n", 1, 1, &n, NULL))) {
        if (json_is_integer(json_object_get(o, "n"))) return refuse(e, "n", "n: only 1 choice per request is supported");
        return rc;
    }
    double d;
    sampler_config_default(&r->sampling);
    d = 1.0;
    if ((rc = get_num(e, o, "temperature", 0, 2, &d))) return rc;
    /* OpenAI's default temperature is 1; k3 serves greedy unless asked (documented) */
    if (json_object_get(o, "temperature") && !json_is_null(json_object_get(o, "temperature"))) r->sampling.temperature = d;
    d = 1.0;
    if ((rc = get_num(e, o, "top_p", 0, 1, &d))) return rc;
    if (d <= 0) return refuse(e, "top_p", "top_p must be in (0, 1]");
    r->sampling.top_p = d;
    d = 0;
    if ((rc = get_num(e, o, "min_p", 0, 1, &d))) return rc;
    r->sampling.min_p = d;
    long long k = 0, seed = 0;
    if ((rc = get_int(e, o, "top_k", -1, 1 << 30, &k, NULL))) return rc;
    r->sampling.top_k = k < 0 ? 0 : (int)k; /* -1 = off, as vLLM */
    if ((rc = get_int(e, o, "seed", INT64_MIN, INT64_MAX, &seed, NULL))) return rc;
    r->sampling.seed = (uint64_t)seed;
    d = 0;
    if ((rc = get_num(e, o, "presence_penalty", -2, 2, &d))) return rc;
    r->sampling.presence_penalty = d;
    d = 0;
    if ((rc = get_num(e, o, "frequency_penalty", -2, 2, &d))) return rc;
    r->sampling.frequency_penalty = d;
    d = 1;
    if ((rc = get_num(e, o, "repetition_penalty", 0, 10, &d))) return rc;
    if (d <= 0) return refuse(e, "repetition_penalty", "repetition_penalty must be in (0, 10] (1 = off), got %g", d);
    r->sampling.repetition_penalty = d == 1 ? 0 : d; /* 1 changes nothing: off */
    if ((rc = parse_logit_bias(c, e, o, r))) return rc;
    k3_error se = {0};
    if (sampler_config_check(&r->sampling, &se)) return refuse(e, "temperature", "%s", se.msg);
    if ((rc = get_bool(e, o, "stream", &r->stream))) return rc;
    if ((v = json_object_get(o, "stream_options")) && !json_is_null(v)) {
        if (!json_is_object(v)) return refuse(e, "stream_options", "stream_options must be an object");
        const json_t *iu = json_object_get(v, "include_usage");
        if (iu && !json_is_boolean(iu)) return refuse(e, "stream_options.include_usage", "stream_options.include_usage must be true or false");
        r->include_usage = json_is_true(iu);
    }
    if ((rc = parse_stop(e, o, r))) return rc;
    if ((rc = get_bool(e, o, "return_token_ids", &r->return_token_ids))) return rc;
    long long top = 0;
    int given = 0;
    if (chat) {
        if ((rc = get_bool(e, o, "logprobs", &r->logprobs))) return rc;
        if ((rc = get_int(e, o, "top_logprobs", 0, 20, &top, &given))) return rc;
        if (given && top > 0 && !r->logprobs) return refuse(e, "top_logprobs", "top_logprobs needs logprobs: true");
    } else {
        if ((rc = get_int(e, o, "logprobs", 0, 20, &top, &given))) return rc;
        r->logprobs = given;
    }
    r->top_logprobs = (int)top;
    (void)c;
    return 0;
}

static int parse_thinking(const api_context *c, ectx *e, const json_t *o, api_request *r, const char **effort) {
    r->thinking = c->default_thinking;
    *effort = r->thinking ? "max" : NULL;
    const json_t *t = json_object_get(o, "thinking");
    if (t && !json_is_null(t)) {
        if (json_is_boolean(t)) r->thinking = json_is_true(t);
        else if (json_is_object(t) && json_is_string(json_object_get(t, "type"))) {
            const char *ty = json_string_value(json_object_get(t, "type"));
            if (!strcmp(ty, "enabled")) r->thinking = 1;
            else if (!strcmp(ty, "disabled")) r->thinking = 0;
            else return refuse(e, "thinking.type", "thinking.type must be \"enabled\" or \"disabled\"");
        } else return refuse(e, "thinking", "thinking must be true, false or {\"type\": \"enabled\" | \"disabled\"}");
        *effort = r->thinking ? "max" : NULL;
    }
    const json_t *re = json_object_get(o, "reasoning_effort");
    if (re && !json_is_null(re)) {
        const char *s = json_is_string(re) ? json_string_value(re) : "";
        if (!strcmp(s, "none")) {
            r->thinking = 0;
            *effort = NULL;
        } else if (!strcmp(s, "low") || !strcmp(s, "high") || !strcmp(s, "max")) {
            if (t && !json_is_null(t) && !r->thinking)
                return refuse(e, "reasoning_effort", "reasoning_effort contradicts thinking disabled");
            r->thinking = 1;
            *effort = !strcmp(s, "low") ? "low" : !strcmp(s, "high") ? "high" : "max";
        } else
            return refuse(e, "reasoning_effort",
                          "reasoning_effort must be \"none\", \"low\", \"high\" or \"max\" (K3 knows no other level)");
    }
    return 0;
}

static int parse_chat(const api_context *c, ectx *e, const json_t *o, api_request *r) {
    const char *effort = NULL;
    int rc = parse_thinking(c, e, o, r, &effort);
    if (rc) return rc;
    if (c->tmpl != CHAT_TEMPLATE_K3) {
        r->thinking = 0;
        effort = NULL;
    }
    xtml_options xo = {0};
    xo.thinking = r->thinking;
    xo.effort = effort;
    xo.default_system = chat_default_system(c->tmpl);
    const json_t *tools = json_object_get(o, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) return refuse(e, "tools", "tools must be an array");
        size_t i;
        const json_t *t;
        json_array_foreach(tools, i, t) {
            char p[64];
            snprintf(p, sizeof p, "tools[%zu]", i);
            const json_t *f = json_object_get(t, "function");
            if (!json_is_object(t) || !json_is_string(json_object_get(t, "type")) ||
                strcmp(json_string_value(json_object_get(t, "type")), "function") || !json_is_object(f) ||
                !json_is_string(json_object_get(f, "name")))
                return refuse(e, p, "%s must be {\"type\": \"function\", \"function\": {\"name\": ..., ...}}", p);
        }
        if (json_array_size(tools) > 0) {
            xo.tools = tools;
            r->has_tools = 1;
        }
    }
    int parallel = 1;
    if ((rc = get_bool(e, o, "parallel_tool_calls", &parallel))) return rc;
    r->single_call = !parallel;
    const json_t *tc = json_object_get(o, "tool_choice");
    const char *named = NULL;
    if (tc && !json_is_null(tc)) {
        if (json_is_string(tc)) {
            const char *s = json_string_value(tc);
            if (strcmp(s, "auto") && strcmp(s, "none") && strcmp(s, "required"))
                return refuse(e, "tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or a named function");
            xo.tool_choice = s;
        } else if (!json_is_object(tc) || !json_is_string(json_object_get(json_object_get(tc, "function"), "name")))
            return refuse(e, "tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or a named function");
        else
            named = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
        if (xo.tool_choice && !strcmp(xo.tool_choice, "required") && !xo.tools)
            return refuse(e, "tool_choice", "tool_choice \"required\" needs tools");
        if (named) {
            int found = 0;
            for (size_t i = 0; i < json_array_size(xo.tools); i++)
                found |= !strcmp(named, json_string_value(json_object_get(json_object_get(json_array_get(xo.tools, i), "function"), "name")));
            if (!found)
                return refuse(e, "tool_choice", "tool_choice names the function '%.80s', which is not among tools", named);
        }
        if ((named || (xo.tool_choice && !strcmp(xo.tool_choice, "required"))) && c->tmpl != CHAT_TEMPLATE_K3)
            return refuse(e, "tool_choice", "a named or \"required\" tool_choice needs the K3 template (K2 has no tools channel here)");
        if (xo.tool_choice && !strcmp(xo.tool_choice, "none")) r->tool_choice_none = 1;
        /* required with one tool is a call to that tool */
        if (!named && xo.tool_choice && !strcmp(xo.tool_choice, "required") && json_array_size(xo.tools) == 1)
            named = json_string_value(json_object_get(json_object_get(json_array_get(xo.tools, 0), "function"), "name"));
        if (named || (xo.tool_choice && !strcmp(xo.tool_choice, "required"))) {
            k3_error fe = {0};
            if (xtml_forced_call(c->tok, r->thinking, named, &r->force_after, &r->force, &fe))
                return fe.kind == K3_ENOMEM ? -2 : refuse(e, "tool_choice", "%s", fe.msg);
            if (named && !(r->tool_name = strdup(named))) return -2;
        }
    }
    const json_t *rf = json_object_get(o, "response_format");
    if (rf && !json_is_null(rf)) {
        const char *ty = json_is_object(rf) && json_is_string(json_object_get(rf, "type"))
                             ? json_string_value(json_object_get(rf, "type")) : NULL;
        if (!ty || (strcmp(ty, "text") && strcmp(ty, "json_object") && strcmp(ty, "json_schema")))
            return refuse(e, "response_format.type", "response_format.type must be \"text\", \"json_object\" or \"json_schema\"");
        if (!strcmp(ty, "json_schema")) {
            const json_t *js = json_object_get(rf, "json_schema"), *sc = json_object_get(js, "schema");
            if (!json_is_object(js) || !json_is_object(sc))
                return refuse(e, "response_format.json_schema.schema", "response_format.json_schema.schema must be an object");
            xo.json_schema = sc;
        }
        if (strcmp(ty, "text")) xo.response_format = ty;
    }
    k3_error xe = {0};
    rc = xtml_render_chat(c->tok, c->tmpl, json_object_get(o, "messages"), &xo, &r->prompt, &xe, e->param, e->paramlen);
    if (rc && xe.kind == K3_ENOMEM) return -2;
    if (rc) {
        snprintf(e->err, e->errlen, "%s", xe.msg);
        if (!e->param[0]) snprintf(e->param, e->paramlen, "messages");
        return -1;
    }
    return 0;
}

static int parse_prompt(const api_context *c, ectx *e, const json_t *o, api_request *r) {
    const json_t *p = json_object_get(o, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0))) p = json_array_get(p, 0);
    if (json_is_string(p)) {
        int32_t *ids = NULL;
        size_t n = 0;
        k3_error te = {0};
        int rc = tokenizer_encode(c->tok, json_string_value(p), json_string_length(p), 1, &ids, &n, &te);
        int oom = rc ? te.kind == K3_ENOMEM : chat_ids_append(&r->prompt, ids, n) != 0;
        free(ids);
        if (oom) return -2;
        if (rc) return refuse(e, "prompt", "prompt: %s", te.msg);
    } else if (json_is_array(p)) {
        size_t i;
        const json_t *v;
        json_array_foreach(p, i, v) {
            char q[32];
            snprintf(q, sizeof q, "prompt[%zu]", i);
            if (!json_is_integer(v)) return refuse(e, q, "%s: prompt must be a string or an array of token ids", q);
            json_int_t id = json_integer_value(v);
            if (id < 0 || (size_t)id >= c->vocab)
                return refuse(e, q, "%s: token id %lld is outside the vocabulary [0, %zu)", q, (long long)id, c->vocab);
            int32_t x = (int32_t)id;
            if (chat_ids_append(&r->prompt, &x, 1)) return -2;
        }
    } else return refuse(e, "prompt", "prompt must be a string or an array of token ids");
    return 0;
}

int api_parse(const api_context *c, int chat, const char *body, size_t len, api_request *r, char *err, size_t errlen,
              char *param, size_t paramlen) {
    memset(r, 0, sizeof *r);
    r->chat = chat;
    ectx e = {err, param, errlen, paramlen};
    param[0] = 0;
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) return refuse(&e, "", "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    int rc;
    if (!json_is_object(o)) {
        rc = refuse(&e, "", "the body must be a JSON object");
        goto out;
    }
    if ((rc = parse_common(c, &e, o, r, chat))) goto out;
    if ((rc = chat ? parse_chat(c, &e, o, r) : parse_prompt(c, &e, o, r))) goto out;
    if (r->prompt.n == 0) {
        rc = refuse(&e, chat ? "messages" : "prompt", "the prompt is empty");
        goto out;
    }
    for (size_t i = 0; i < r->prompt.n; i++)
        if ((size_t)r->prompt.ids[i] >= c->vocab) {
            rc = refuse(&e, chat ? "messages" : "prompt",
                        "the rendered prompt holds id %d, outside the model's vocabulary [0, %zu)", r->prompt.ids[i],
                        c->vocab);
            goto out;
        }
    if (r->prompt.n >= c->max_context) {
        rc = refuse(&e, chat ? "messages" : "prompt", "the prompt is %zu tokens; the context limit is %zu", r->prompt.n,
                    c->max_context);
        goto out;
    }
    long long mt = 0;
    int g1 = 0, g2 = 0;
    size_t room = c->max_context - r->prompt.n;
    if ((rc = get_int(&e, o, "max_tokens", 1, 1LL << 40, &mt, &g1))) goto out;
    if (!g1 && (rc = get_int(&e, o, "max_completion_tokens", 1, 1LL << 40, &mt, &g2))) goto out;
    if ((g1 || g2) && (size_t)mt > room) {
        rc = refuse(&e, g1 ? "max_tokens" : "max_completion_tokens",
                    "%s %lld is impossible: the prompt is %zu tokens and the context limit is %zu (at most %zu)",
                    g1 ? "max_tokens" : "max_completion_tokens", mt, r->prompt.n, c->max_context, room);
        goto out;
    }
    r->max_tokens = (g1 || g2) ? (size_t)mt : (c->default_max_tokens < room ? c->default_max_tokens : room);
    k3_error ce = {0};
    rc = chat_stop_ids(c->tok, c->tmpl, NULL, 0, &r->stop_ids, &r->n_stop_ids, &ce);
    if (rc && ce.kind == K3_ENOMEM) rc = -2;
    else if (rc) rc = refuse(&e, "", "%s", ce.msg);
out:
    json_decref(o);
    if (rc) api_request_free(r);
    return rc;
}
