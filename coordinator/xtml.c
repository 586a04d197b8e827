/* xtml.c - OpenAI messages to K3 XTML ids / K2 ids (contract: xtml.h). */
#include "coordinator/xtml.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const tokenizer *tok;
    chat_ids *out;
    int32_t open, close, sep, end;
    k3_error *err;
    char *param;
    size_t paramlen;
} wr;

static int bad(wr *w, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(wr *w, const char *param, const char *fmt, ...) {
    char msg[sizeof w->err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(w->param, w->paramlen, "%s", param);
    return k3_refuse(w->err, "%s", msg);
}

static int nomem(wr *w) { return k3_nomem(w->err, "out of memory rendering the conversation"); }

static int put_id(wr *w, int32_t id) {
    if (chat_ids_append(w->out, &id, 1)) return nomem(w);
    return 0;
}

/* One text segment, special-token text disallowed. */
static int put_text(wr *w, const char *param, const char *s, size_t len) {
    if (len == 0) return 0;
    int32_t *ids = NULL;
    size_t n = 0;
    k3_error te = {0};
    int rc = tokenizer_encode(w->tok, s, len, 0, &ids, &n, &te);
    if (rc == 0) rc = chat_ids_append(w->out, ids, n) ? nomem(w) : 0;
    else if (te.kind == K3_EINPUT) rc = bad(w, param, "%s", te.msg);
    else rc = nomem(w);
    free(ids);
    return rc;
}
static int put_str(wr *w, const char *s) { return put_text(w, "", s, strlen(s)); }

/* Attribute value escaping: & first, then ". */
static int put_attr(wr *w, const char *key, const char *val) {
    char k[64];
    snprintf(k, sizeof k, " %s", key);
    int rc;
    if ((rc = put_str(w, k)) || (rc = put_str(w, "=\""))) return rc;
    size_t n = strlen(val), m = 0;
    char *esc = malloc(6 * n + 1);
    if (!esc) return nomem(w);
    for (size_t i = 0; i < n; i++) {
        if (val[i] == '&') memcpy(esc + m, "&amp;", 5), m += 5;
        else if (val[i] == '"') memcpy(esc + m, "&quot;", 6), m += 6;
        else esc[m++] = val[i];
    }
    rc = put_text(w, "", esc, m);
    free(esc);
    return rc ? rc : put_str(w, "\"");
}

/* OPEN tag [attrs k,v,...,NULL] SEP */
static int open_tag(wr *w, const char *tag, ...) {
    int rc;
    if ((rc = put_id(w, w->open)) || (rc = put_str(w, tag))) return rc;
    va_list ap;
    va_start(ap, tag);
    for (;;) {
        const char *k = va_arg(ap, const char *);
        if (!k) break;
        const char *v = va_arg(ap, const char *);
        if (v && (rc = put_attr(w, k, v))) break;
    }
    va_end(ap);
    return rc ? rc : put_id(w, w->sep);
}
static int close_tag(wr *w, const char *tag) {
    int rc;
    if ((rc = put_id(w, w->close)) || (rc = put_str(w, tag))) return rc;
    return put_id(w, w->sep);
}
static int end_msg(wr *w) {
    int rc = close_tag(w, "message");
    return rc ? rc : put_id(w, w->end);
}

/* A whole system message with a type and a body. */
static int sys_msg(wr *w, const char *type, const char *body, size_t len) {
    int rc;
    if ((rc = open_tag(w, "message", "role", "system", "type", type, NULL)) || (rc = put_text(w, "", body, len)))
        return rc;
    return end_msg(w);
}

/* ---- JSON helpers ---- */

static json_t *deep_sorted(const json_t *v) {
    /* jansson keeps insertion order; JSON_SORT_KEYS at dump time sorts recursively */
    return json_deep_copy(v);
}

char *xtml_json_default(const json_t *v) { return json_dumps(v, JSON_ENCODE_ANY); }

static char *json_compact_sorted(const json_t *v) {
    json_t *c = deep_sorted(v);
    if (!c) return NULL;
    char *s = json_dumps(c, JSON_ENCODE_ANY | JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(c);
    return s;
}

static int fenced(wr *w, const char *type, const char *head, const json_t *v) {
    char *js = json_compact_sorted(v);
    if (!js) return nomem(w);
    size_t hl = strlen(head), jl = strlen(js);
    char *body = malloc(hl + jl + 32);
    int rc = body ? 0 : nomem(w);
    if (body) {
        int n = sprintf(body, "%s```json\n%s\n```", head, js);
        rc = sys_msg(w, type, body, (size_t)n);
    }
    free(body);
    free(js);
    return rc;
}

/* Content: null, a string, or an array of {"type":"text","text":...} parts (one segment each). */
static int put_content(wr *w, const json_t *c, const char *path, int null_ok) {
    char p[160];
    if (!c || json_is_null(c)) {
        if (null_ok) return 0;
        return bad(w, path, "%s: content is required", path);
    }
    if (json_is_string(c)) return put_text(w, path, json_string_value(c), json_string_length(c));
    if (!json_is_array(c)) return bad(w, path, "%s: content must be a string or an array of text parts", path);
    size_t i;
    const json_t *part;
    json_array_foreach(c, i, part) {
        snprintf(p, sizeof p, "%s[%zu]", path, i);
        const json_t *ty = json_object_get(part, "type"), *tx = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(ty) || strcmp(json_string_value(ty), "text") || !json_is_string(tx))
            return bad(w, p, "%s: only {\"type\": \"text\", \"text\": ...} content parts are supported", p);
        int rc = put_text(w, p, json_string_value(tx), json_string_length(tx));
        if (rc) return rc;
    }
    return 0;
}

static const char *str_or(const json_t *o, const char *key, const char *dflt) {
    const json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : dflt;
}

/* One call's arguments as argument elements (or the json fallback). */
static int put_arguments(wr *w, const json_t *args, const char *path) {
    json_t *parsed = NULL;
    const json_t *obj = NULL;
    int rc = 0;
    if (!args || json_is_null(args)) return 0;
    if (json_is_object(args)) obj = args;
    else if (json_is_string(args)) {
        const char *s = json_string_value(args);
        size_t n = json_string_length(args), b = 0;
        while (b < n && (s[b] == ' ' || s[b] == '\t' || s[b] == '\n' || s[b] == '\r')) b++;
        if (b == n) return 0;
        parsed = json_loadb(s, n, JSON_DECODE_ANY, NULL);
        if (!parsed) {
            if ((rc = open_tag(w, "json", "type", "object", NULL)) || (rc = put_text(w, path, s, n))) return rc;
            return close_tag(w, "json");
        }
        if (!json_is_object(parsed)) {
            json_decref(parsed);
            return bad(w, path, "%s: arguments must be a JSON object", path);
        }
        obj = parsed;
    } else return bad(w, path, "%s: arguments must be a string or an object", path);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        const char *type;
        char *txt = NULL;
        const char *raw = NULL;
        size_t rawlen = 0;
        switch (json_typeof(v)) {
        case JSON_STRING: type = "string"; raw = json_string_value(v); rawlen = json_string_length(v); break;
        case JSON_INTEGER: case JSON_REAL: type = "number"; break;
        case JSON_TRUE: case JSON_FALSE: type = "boolean"; break;
        case JSON_NULL: type = "null"; break;
        case JSON_OBJECT: type = "object"; break;
        default: type = "array"; break;
        }
        if (!raw) {
            if (!(txt = xtml_json_default(v))) { rc = nomem(w); break; }
            raw = txt;
            rawlen = strlen(txt);
        }
        if (!(rc = open_tag(w, "argument", "key", key, "type", type, NULL)) && !(rc = put_text(w, path, raw, rawlen)))
            rc = close_tag(w, "argument");
        free(txt);
        if (rc) break;
    }
    json_decref(parsed);
    return rc;
}

static int put_assistant(wr *w, const json_t *m, const char *path, int thinking) {
    char p[192];
    int rc;
    if ((rc = open_tag(w, "message", "role", "assistant", "name", str_or(m, "name", NULL), NULL))) return rc;
    if (thinking) {
        const json_t *rcnt = json_object_get(m, "reasoning_content");
        snprintf(p, sizeof p, "%s.reasoning_content", path);
        if (rcnt && !json_is_null(rcnt) && !json_is_string(rcnt)) return bad(w, p, "%s must be a string", p);
        if ((rc = open_tag(w, "think", NULL)) ||
            (rcnt && json_is_string(rcnt) && (rc = put_text(w, p, json_string_value(rcnt), json_string_length(rcnt)))) ||
            (rc = close_tag(w, "think")))
            return rc;
    }
    snprintf(p, sizeof p, "%s.content", path);
    if ((rc = open_tag(w, "response", NULL)) || (rc = put_content(w, json_object_get(m, "content"), p, 1)) ||
        (rc = close_tag(w, "response")))
        return rc;
    const json_t *tc = json_object_get(m, "tool_calls");
    snprintf(p, sizeof p, "%s.tool_calls", path);
    if (tc && !json_is_null(tc) && !json_is_array(tc)) return bad(w, p, "%s must be an array", p);
    if (json_is_array(tc) && json_array_size(tc) > 0) {
        if ((rc = open_tag(w, "tools", NULL))) return rc;
        size_t i;
        const json_t *c;
        json_array_foreach(tc, i, c) {
            snprintf(p, sizeof p, "%s.tool_calls[%zu].function", path, i);
            const json_t *f = json_object_get(c, "function");
            const char *name = str_or(f, "name", NULL);
            if (!json_is_object(f) || !name) return bad(w, p, "%s must be an object with a string name", p);
            char idx[24];
            snprintf(idx, sizeof idx, "%zu", i + 1);
            if ((rc = open_tag(w, "call", "tool", name, "index", idx, NULL))) return rc;
            char pa[224];
            snprintf(pa, sizeof pa, "%s.arguments", p);
            if ((rc = put_arguments(w, json_object_get(f, "arguments"), pa)) || (rc = close_tag(w, "call"))) return rc;
        }
        if ((rc = close_tag(w, "tools"))) return rc;
    }
    return end_msg(w);
}

/* The index into messages of the k-th tool result of the run starting at `first` (call order). */
static int tool_order(const json_t *msgs, size_t first, size_t n_run, const json_t *calls, size_t *order) {
    for (size_t k = 0; k < n_run; k++) order[k] = first + k;
    if (!json_is_array(calls)) return 0;
    size_t nc = json_array_size(calls);
    size_t *pos = malloc((n_run ? n_run : 1) * sizeof *pos);
    if (!pos) return -1;
    for (size_t k = 0; k < n_run; k++) {
        const char *id = str_or(json_array_get(msgs, first + k), "tool_call_id", NULL);
        size_t j = nc;
        for (size_t c = 0; id && c < nc; c++)
            if (!strcmp(id, str_or(json_array_get(calls, c), "id", ""))) { j = c; break; }
        if (j == nc) { free(pos); return 0; } /* one does not match: leave the run alone */
        pos[k] = j;
    }
    /* stable sort of the run by call position */
    for (size_t a = 1; a < n_run; a++)
        for (size_t b = a; b > 0 && pos[b - 1] > pos[b]; b--) {
            size_t t = pos[b]; pos[b] = pos[b - 1]; pos[b - 1] = t;
            t = order[b]; order[b] = order[b - 1]; order[b - 1] = t;
        }
    free(pos);
    return 1;
}

static int render_k3(wr *w, const json_t *msgs, const xtml_options *o) {
    int rc;
    if (o->tools && json_array_size(o->tools) > 0 &&
        (rc = fenced(w, "tool-declare", "# Tools\nHere are the available tools, described in JSONSchema.\n\n", o->tools)))
        return rc;
    if (o->thinking && o->effort) {
        char body[400];
        int n = snprintf(body, sizeof body,
                         "`thinking_effort` guides on how much to think in your thinking channel (not including the "
                         "response channel), supported values include `low`, `medium`, `high`, and `max`.\nNow the "
                         "system is invoked with `thinking_effort=%s`.",
                         o->effort);
        if ((rc = sys_msg(w, "thinking-effort", body, (size_t)n))) return rc;
    }
    size_t n = json_array_size(msgs);
    const json_t *last_calls = NULL;
    for (size_t i = 0; i < n; i++) {
        char path[64];
        snprintf(path, sizeof path, "messages[%zu]", i);
        const json_t *m = json_array_get(msgs, i);
        const char *role = str_or(m, "role", NULL);
        if (!role) return bad(w, path, "%s: a message needs a string role", path);
        char p[96];
        snprintf(p, sizeof p, "%s.content", path);
        if (!strcmp(role, "system") || !strcmp(role, "user") || !strcmp(role, "developer")) {
            const char *r = !strcmp(role, "user") ? "user" : "system";
            if (!strcmp(r, "system") && json_is_array(json_object_get(m, "tools"))) {
                if ((rc = fenced(w, "tool-declare",
                                 "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n"
                                 "You have access to all existing and extended tools.\nHere are the specs for the "
                                 "extended tools.\n\n",
                                 json_object_get(m, "tools"))))
                    return rc;
                if (!json_object_get(m, "content") || json_is_null(json_object_get(m, "content"))) continue;
            }
            if ((rc = open_tag(w, "message", "role", r, "name", str_or(m, "name", NULL), NULL)) ||
                (rc = put_content(w, json_object_get(m, "content"), p, 0)) || (rc = end_msg(w)))
                return rc;
        } else if (!strcmp(role, "assistant")) {
            if ((rc = put_assistant(w, m, path, o->thinking))) return rc;
            last_calls = json_object_get(m, "tool_calls");
        } else if (!strcmp(role, "tool")) {
            size_t run = 0;
            while (i + run < n && !strcmp(str_or(json_array_get(msgs, i + run), "role", ""), "tool")) run++;
            size_t *order = malloc(run * sizeof *order);
            if (!order) return nomem(w);
            int matched = tool_order(msgs, i, run, last_calls, order);
            if (matched < 0) { free(order); return nomem(w); }
            for (size_t k = 0; k < run; k++) {
                size_t at = order[k];
                const json_t *tm = json_array_get(msgs, at);
                snprintf(path, sizeof path, "messages[%zu]", at);
                snprintf(p, sizeof p, "%s.content", path);
                const char *name = str_or(tm, "tool", str_or(tm, "name", NULL));
                if (matched || !name) {
                    const json_t *call = json_array_get(last_calls, matched ? (size_t)0 : k);
                    if (matched) { /* the call this result answers */
                        const char *id = str_or(tm, "tool_call_id", "");
                        for (size_t c = 0; c < json_array_size(last_calls); c++)
                            if (!strcmp(id, str_or(json_array_get(last_calls, c), "id", ""))) call = json_array_get(last_calls, c);
                    }
                    const char *cn = str_or(json_object_get(call, "function"), "name", NULL);
                    if (cn) name = cn;
                }
                if (!name) {
                    free(order);
                    return bad(w, path, "%s: cannot tell which tool this result is for (no tool_call_id matching a "
                               "call of the previous assistant message, no name)", path);
                }
                char idx[24];
                snprintf(idx, sizeof idx, "%zu", k + 1);
                if ((rc = open_tag(w, "message", "role", "tool", "tool", name, "index", idx, NULL)) ||
                    (rc = put_content(w, json_object_get(tm, "content"), p, 0)) || (rc = end_msg(w))) {
                    free(order);
                    return rc;
                }
            }
            free(order);
            i += run - 1;
        } else {
            snprintf(p, sizeof p, "%s.role", path);
            return bad(w, p, "%s: unknown role '%.40s' (system, developer, user, assistant, tool)", p, role);
        }
    }
    if (o->tool_choice && !strcmp(o->tool_choice, "required")) {
        const char *b = "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.";
        if ((rc = sys_msg(w, "tool-choice", b, strlen(b)))) return rc;
    } else if (o->tool_choice && !strcmp(o->tool_choice, "none")) {
        const char *b = "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.";
        if ((rc = sys_msg(w, "tool-choice", b, strlen(b)))) return rc;
    }
    if (o->response_format) {
        const char *base = "The system is invoked with `response_format=%s`.\nYour response must be raw JSON data "
                           "without markdown code blocks (```json) or any additional formatting.";
        char head[320];
        int hn = snprintf(head, sizeof head, base, o->response_format);
        if (!strcmp(o->response_format, "json_schema") && o->json_schema) {
            char h2[400];
            snprintf(h2, sizeof h2, "%s\nThe JSON data must match the following schema:\n", head);
            if ((rc = fenced(w, "response-format", h2, o->json_schema))) return rc;
        } else if ((rc = sys_msg(w, "response-format", head, (size_t)hn))) return rc;
    }
    if ((rc = open_tag(w, "message", "role", "assistant", NULL))) return rc;
    return open_tag(w, o->thinking ? "think" : "response", NULL);
}

/* K2: chat.h's turns; content must be plain text there. */
static int render_k2(wr *w, const json_t *msgs, const xtml_options *o) {
    size_t n = json_array_size(msgs);
    int rc;
    if (o->default_system && (n == 0 || strcmp(str_or(json_array_get(msgs, 0), "role", ""), "system")) &&
        (rc = chat_render_turn(w->tok, CHAT_TEMPLATE_K2, "system", o->default_system, strlen(o->default_system),
                               w->out, w->err)))
        return rc;
    for (size_t i = 0; i < n; i++) {
        char path[64], p[96];
        snprintf(path, sizeof path, "messages[%zu]", i);
        const json_t *m = json_array_get(msgs, i);
        const char *role = str_or(m, "role", NULL);
        snprintf(p, sizeof p, "%s.role", path);
        if (!role) return bad(w, path, "%s: a message needs a string role", path);
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "tool"))
            return bad(w, p, "%s: unknown role '%.40s' (system, user, assistant, tool)", p, role);
        const json_t *c = json_object_get(m, "content");
        snprintf(p, sizeof p, "%s.content", path);
        if (c && !json_is_null(c) && !json_is_string(c))
            return bad(w, p, "%s: the K2 template takes string content", p);
        const char *txt = json_is_string(c) ? json_string_value(c) : "";
        if ((rc = chat_render_turn(w->tok, CHAT_TEMPLATE_K2, role, txt, json_is_string(c) ? json_string_length(c) : 0,
                                   w->out, w->err))) {
            snprintf(w->param, w->paramlen, "%s", p);
            return rc;
        }
    }
    return chat_render_generation_prompt(w->tok, CHAT_TEMPLATE_K2, 0, w->out, w->err);
}

int xtml_render_chat(const tokenizer *tok, chat_template t, const json_t *messages, const xtml_options *o,
                     chat_ids *out, k3_error *err, char *param, size_t paramlen) {
    wr w = {tok, out, tokenizer_special_id(tok, "<|open|>"), tokenizer_special_id(tok, "<|close|>"),
            tokenizer_special_id(tok, "<|sep|>"), tokenizer_special_id(tok, "<|end_of_msg|>"), err, param, paramlen};
    if (param && paramlen) param[0] = 0;
    if (!json_is_array(messages) || json_array_size(messages) == 0)
        return bad(&w, "messages", "messages must be a non-empty array");
    size_t n0 = out->n;
    int rc;
    if (t == CHAT_TEMPLATE_K3) {
        if (w.open < 0 || w.close < 0 || w.sep < 0 || w.end < 0)
            return bad(&w, "", "the tokenizer lacks the K3 control tokens");
        rc = render_k3(&w, messages, o);
    } else rc = render_k2(&w, messages, o);
    if (rc) out->n = n0;
    return rc;
}

int xtml_forced_call(const tokenizer *tok, int thinking, const char *name, chat_ids *after, chat_ids *force,
                     k3_error *err) {
    char param[8];
    wr w = {tok, after, tokenizer_special_id(tok, "<|open|>"), tokenizer_special_id(tok, "<|close|>"),
            tokenizer_special_id(tok, "<|sep|>"), tokenizer_special_id(tok, "<|end_of_msg|>"), err, param, sizeof param};
    if (w.open < 0 || w.close < 0 || w.sep < 0) return k3_refuse(err, "the tokenizer lacks the K3 control tokens");
    int rc;
    if (thinking && (rc = close_tag(&w, "think"))) return rc;
    w.out = force;
    if (thinking && (rc = open_tag(&w, "response", NULL))) return rc;
    if ((rc = close_tag(&w, "response")) || (rc = open_tag(&w, "tools", NULL))) return rc;
    if (name) return open_tag(&w, "call", "tool", name, "index", "1", NULL);
    if ((rc = put_id(&w, w.open)) || (rc = put_str(&w, "call")) || (rc = put_str(&w, " tool"))) return rc;
    return put_str(&w, "=\"");
}
