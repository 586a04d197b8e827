/* chat_parse.c - output ids to reasoning / content / tool_calls (contract: chat_parse.h). */
#include "coordinator/chat_parse.h"
#include "coordinator/xtml.h"

#include <stdlib.h>
#include <string.h>

enum { CH_NONE, CH_THINK, CH_RESPONSE, CH_TOOLS, CH_ARG, CH_JSON };

static int buf_add(cp_buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 64;
        while (nc < b->n + n + 1) nc *= 2;
        char *q = realloc(b->p, nc);
        if (!q) return -1;
        b->p = q;
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

static int stream_add(cp_buf *b, utf8_stream *us, const char *s, size_t n) {
    char tmp[UTF8_STREAM_MAX_OUT(64)];
    while (n > 0) {
        size_t k = n < 64 ? n : 64;
        size_t m = utf8_stream_push(us, s, k, tmp);
        if (buf_add(b, tmp, m)) return -1;
        s += k;
        n -= k;
    }
    return 0;
}

/* A malloc'd copy of raw bytes made well-formed UTF-8. */
static char *clean_utf8(const char *s, size_t n) {
    char *o = malloc(UTF8_STREAM_MAX_OUT(n) + 1);
    if (!o) return NULL;
    utf8_stream us;
    utf8_stream_init(&us, 1);
    size_t m = utf8_stream_push(&us, s, n, o);
    m += utf8_stream_flush(&us, o + m);
    o[m] = 0;
    return o;
}

void chat_parser_init(chat_parser *p, const tokenizer *tok, chat_template t, int thinking) {
    memset(p, 0, sizeof *p);
    p->tok = tok;
    p->k3 = t == CHAT_TEMPLATE_K3;
    p->open = tokenizer_special_id(tok, "<|open|>");
    p->close = tokenizer_special_id(tok, "<|close|>");
    p->sep = tokenizer_special_id(tok, "<|sep|>");
    p->chan = p->k3 && thinking ? CH_THINK : CH_RESPONSE;
    utf8_stream_init(&p->us_reasoning, 1);
    utf8_stream_init(&p->us_content, 1);
}

/* Attribute value `key` from tag text (unescaped, then made well-formed UTF-8 like every other
 * text: the tag's bytes are the model's, and an ill-formed name or key would not survive the
 * server's JSON), malloc'd, or NULL. */
static char *attr(const char *t, const char *key) {
    size_t kl = strlen(key);
    for (const char *q = t; (q = strstr(q, key)); q++) {
        if (q == t || !(q[-1] == ' ')) continue;
        if (strncmp(q + kl, "=\"", 2)) continue;
        const char *v = q + kl + 2, *e = strchr(v, '"');
        if (!e) return NULL;
        char *o = malloc((size_t)(e - v) + 1);
        if (!o) return NULL;
        size_t m = 0;
        /* &quot; first, then &amp; (a single left-to-right pass gives the same result for these two) */
        for (const char *c = v; c < e;) {
            if (!strncmp(c, "&quot;", 6)) o[m++] = '"', c += 6;
            else if (!strncmp(c, "&amp;", 5)) o[m++] = '&', c += 5;
            else o[m++] = *c++;
        }
        char *w = clean_utf8(o, m);
        free(o);
        return w;
    }
    return NULL;
}

static int tag_is(const char *t, const char *name) {
    size_t n = strlen(name);
    return !strncmp(t, name, n) && (t[n] == 0 || t[n] == ' ');
}

static void end_arg(chat_parser *p) {
    if (p->arg_key && p->call_args) {
        char *v = clean_utf8(p->arg_val.p ? p->arg_val.p : "", p->arg_val.n);
        json_t *jv = NULL;
        if (!v) p->oom = 1;
        else if (!p->arg_type || !strcmp(p->arg_type, "string")) jv = json_string(v);
        else {
            jv = json_loads(v, JSON_DECODE_ANY, NULL);
            if (!jv) jv = json_string(v);
        }
        if (jv) json_object_set_new(p->call_args, p->arg_key, jv);
        free(v);
    }
    free(p->arg_key);
    free(p->arg_type);
    p->arg_key = p->arg_type = NULL;
    p->arg_val.n = 0;
}

static void end_call(chat_parser *p) {
    if (!p->in_call) return;
    end_arg(p); /* an argument still open (its tag left unclosed, or interrupted by another) */
    if (p->call_name && (p->drop_calls || (p->only_name && strcmp(p->call_name, p->only_name)) ||
                         (p->max_calls && p->n_calls >= p->max_calls))) {
        free(p->call_name);
        p->call_name = NULL;
    }
    if (p->call_name) {
        char *args = p->call_json ? clean_utf8(p->call_raw.p ? p->call_raw.p : "", p->call_raw.n)
                                  : xtml_json_default(p->call_args);
        if (p->n_calls == p->cap_calls) {
            size_t nc = p->cap_calls ? 2 * p->cap_calls : 4;
            cp_call *c = realloc(p->calls, nc * sizeof *c);
            if (c) p->calls = c, p->cap_calls = nc;
        }
        if (!args || p->n_calls == p->cap_calls) {
            p->oom = 1;
            free(args);
            free(p->call_name);
        } else {
            p->calls[p->n_calls].name = p->call_name;
            p->calls[p->n_calls].arguments = args;
            p->n_calls++;
        }
    }
    p->call_name = NULL;
    json_decref(p->call_args);
    p->call_args = NULL;
    p->call_raw.n = 0;
    p->in_call = p->call_json = 0;
    p->chan = CH_TOOLS;
}

static void on_tag(chat_parser *p, int opening) {
    const char *t = p->tagtext.p ? p->tagtext.p : "";
    if (opening) {
        if (tag_is(t, "think")) p->chan = CH_THINK;
        else if (tag_is(t, "response")) p->chan = CH_RESPONSE;
        else if (tag_is(t, "tools")) p->chan = CH_TOOLS;
        else if (tag_is(t, "call")) {
            end_call(p);
            p->in_call = 1;
            p->call_name = attr(t, "tool");
            p->call_args = json_object();
            p->chan = CH_TOOLS;
        } else if (tag_is(t, "argument") && p->in_call) {
            end_arg(p); /* the one before, also one left open by a tag */
            p->arg_key = attr(t, "key");
            p->arg_type = attr(t, "type");
            p->arg_val.n = 0;
            p->chan = CH_ARG;
        } else if (tag_is(t, "json") && p->in_call) {
            p->call_json = 1;
            p->call_raw.n = 0;
            p->chan = CH_JSON;
        }
        return;
    }
    if (tag_is(t, "think") || tag_is(t, "response") || tag_is(t, "tools")) {
        if (tag_is(t, "tools")) end_call(p);
        p->chan = CH_NONE;
    } else if (tag_is(t, "argument")) {
        end_arg(p);
        p->chan = CH_TOOLS;
    } else if (tag_is(t, "json")) p->chan = CH_TOOLS;
    else if (tag_is(t, "call")) end_call(p);
    else if (tag_is(t, "message")) {
        end_call(p);
        p->ended = 1;
    }
}

static void text(chat_parser *p, const char *b, size_t n) {
    int rc = 0;
    switch (p->chan) {
    case CH_THINK: rc = stream_add(&p->reasoning, &p->us_reasoning, b, n); break;
    case CH_ARG: rc = buf_add(&p->arg_val, b, n); break;
    case CH_JSON: rc = buf_add(&p->call_raw, b, n); break;
    case CH_TOOLS: break; /* between calls: nothing carries meaning */
    default: rc = stream_add(&p->content, &p->us_content, b, n); break;
    }
    if (rc) p->oom = 1;
}

int chat_parser_feed(chat_parser *p, int32_t id) {
    const char *b;
    size_t n;
    if (p->ended) return 0;
    if (tokenizer_token_bytes(p->tok, id, &b, &n)) return 0;
    if (!p->k3) {
        if (stream_add(&p->content, &p->us_content, b, n)) p->oom = 1;
        return p->oom ? -1 : 0;
    }
    if (id == p->open || id == p->close) {
        p->tag = id == p->open ? 1 : 2; /* an unfinished tag before is dropped */
        p->tagtext.n = 0;
        if (buf_add(&p->tagtext, "", 0)) p->oom = 1;
    } else if (p->tag) {
        if (id == p->sep) {
            on_tag(p, p->tag == 1);
            p->tag = 0;
        } else if (tokenizer_is_special(p->tok, id)) p->tag = 0;
        else if (buf_add(&p->tagtext, b, n)) p->oom = 1;
    } else if (id != p->sep && !tokenizer_is_special(p->tok, id)) text(p, b, n);
    return p->oom ? -1 : 0;
}

int chat_parser_finish(chat_parser *p) {
    char tmp[UTF8_STREAM_MAX_OUT(0)];
    if (buf_add(&p->reasoning, tmp, utf8_stream_flush(&p->us_reasoning, tmp))) p->oom = 1;
    if (buf_add(&p->content, tmp, utf8_stream_flush(&p->us_content, tmp))) p->oom = 1;
    end_call(p);
    return p->oom ? -1 : 0;
}

void chat_parser_free(chat_parser *p) {
    free(p->tagtext.p);
    free(p->reasoning.p);
    free(p->content.p);
    free(p->call_name);
    json_decref(p->call_args);
    free(p->call_raw.p);
    free(p->arg_key);
    free(p->arg_type);
    free(p->arg_val.p);
    for (size_t i = 0; i < p->n_calls; i++) {
        free(p->calls[i].name);
        free(p->calls[i].arguments);
    }
    free(p->calls);
    memset(p, 0, sizeof *p);
}
