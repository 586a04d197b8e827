/* server_http.c - routes, auth, limits, SSE, metrics of `k3 --serve` (contract: server_http.h). */
#define _GNU_SOURCE /* POLLRDHUP */
#include "coordinator/server_http.h"
#include "coordinator/chat_parse.h"
#include "coordinator/openai_api.h"
#include "coordinator/scheduler.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void server_config_default(server_config *c) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8080;
    c->parallel = 4;
    c->max_queue = 64;
    c->chunk = 64;
    c->max_context = 4096;
    c->default_max_tokens = 512;
    c->thinking = 1;
    c->model_name = "k3";
    c->body_limit = 4u << 20;
    c->snapshot_bytes = (uint64_t)512 << 20;
    c->timeout_s = 60;
}

enum { R_NONE, R_CHAT, R_COMPLETIONS, R_MODELS, R_HEALTH, R_METRICS, R_TOKENIZE, R_DETOKENIZE, R_PAGE, R_COUNT };
static const char *const ROUTE_NAME[R_COUNT] = {"other",   "chat_completions", "completions", "models", "health",
                                                "metrics", "tokenize",         "detokenize",  "page"};

#define N_TTFT 11
#define N_TPOT 10
static const double TTFT_B[N_TTFT] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};
static const double TPOT_B[N_TPOT] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};

typedef struct {
    pthread_mutex_t mu;
    uint64_t by_code[R_COUNT][6]; /* 2xx..5xx by first digit - 1 (index 1..5) */
    uint64_t prompt_tokens, gen_tokens, cancelled, finished;
    uint64_t ttft[N_TTFT + 1], tpot[N_TPOT + 1];
    double ttft_sum, tpot_sum;
    uint64_t ttft_n, tpot_n;
} metrics;

typedef struct {
    engine *en;
    const tokenizer *tok;
    server_config cfg;
    api_context api;
    scheduler *sched;
    snap_store *snaps;
    state_fingerprint fp;
    metrics m;
    volatile int stopping;
    pthread_mutex_t id_mu;
    uint64_t next_id;
} server;

static void count(server *sv, int route, unsigned code) {
    pthread_mutex_lock(&sv->m.mu);
    unsigned k = code / 100;
    if (k >= 1 && k <= 5) sv->m.by_code[route][k]++;
    pthread_mutex_unlock(&sv->m.mu);
}

static void observe(server *sv, const gen_request *r) {
    pthread_mutex_lock(&sv->m.mu);
    sv->m.prompt_tokens += r->n_prompt;
    sv->m.gen_tokens += r->n_out;
    sv->m.finished++;
    if (r->finish == FINISH_CANCEL) sv->m.cancelled++;
    if (r->n_out > 0) {
        double t = r->t_first - r->t_submit;
        int i = 0;
        while (i < N_TTFT && t > TTFT_B[i]) i++;
        sv->m.ttft[i]++;
        sv->m.ttft_sum += t;
        sv->m.ttft_n++;
    }
    if (r->n_out > 1) {
        double t = (r->t_done - r->t_first) / (double)(r->n_out - 1);
        int i = 0;
        while (i < N_TPOT && t > TPOT_B[i]) i++;
        sv->m.tpot[i]++;
        sv->m.tpot_sum += t;
        sv->m.tpot_n++;
    }
    pthread_mutex_unlock(&sv->m.mu);
}

/* ---- responses ---- */

static enum MHD_Result send_buf(struct MHD_Connection *c, unsigned code, const char *type, char *body, size_t n,
                                const char *retry_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    if (retry_after) MHD_add_response_header(r, "Retry-After", retry_after);
    enum MHD_Result ok = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_json(server *sv, int route, struct MHD_Connection *c, unsigned code, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return MHD_NO;
    count(sv, route, code);
    return send_buf(c, code, "application/json", s, strlen(s), NULL);
}

static enum MHD_Result send_error(server *sv, int route, struct MHD_Connection *c, unsigned code, const char *msg,
                                  const char *param) {
    const char *type = code == 401   ? "authentication_error"
                       : code == 404 ? "not_found_error"
                       : code == 429 ? "rate_limit_error"
                       : code >= 500 ? (code == 503 ? "service_unavailable_error" : "server_error")
                                     : "invalid_request_error";
    char *s = api_error_json(msg, type, param, NULL);
    if (!s) return MHD_NO;
    count(sv, route, code);
    return send_buf(c, code, "application/json", s, strlen(s), code == 429 || code == 503 ? "1" : NULL);
}

/* ---- auth ---- */

/* Constant time in the position of the first difference: every byte of the expected key is
 * compared, the given one indexed modulo its length, the lengths folded into the result. */
static int key_ok(const char *want, const char *got) {
    size_t wn = strlen(want), gn = got ? strlen(got) : 0;
    unsigned diff = (unsigned)(wn ^ gn);
    for (size_t i = 0; i < wn; i++) diff |= (unsigned char)want[i] ^ (unsigned char)(gn ? got[i % gn] : 0);
    return diff == 0 && got != NULL;
}

static int authorized(server *sv, struct MHD_Connection *c) {
    if (!sv->cfg.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7)) return key_ok(sv->cfg.api_key, NULL);
    return key_ok(sv->cfg.api_key, h + 7);
}

/* ---- generation state shared by streamed and whole replies ---- */

typedef struct {
    server *sv;
    gen_request *req;
    api_request ar;
    chat_parser cp;
    int fd;
    size_t fed;               /* output ids given to the parser */
    size_t sent_reasoning, sent_content, sent_calls, sent_lp;
    int stop_hit;             /* a stop string matched */
    size_t stop_at;           /* content is cut there */
    size_t stop_scan;         /* content scanned for stop strings up to here */
    size_t max_stop;
    int done;                 /* req finished and every id parsed */
    char id[48];
    long long created;
    /* stream output */
    int role_sent, final_sent, done_sent;
    char *out;
    size_t on, ocap, ooff;
    int observed;
    unsigned quiet;           /* 100 ms waits without output */
} gen_ctx;

static int client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static void scan_stops(gen_ctx *g) {
    if (!g->ar.n_stop || g->stop_hit) return;
    const char *t = g->cp.content.p;
    size_t n = g->cp.content.n;
    if (!t) return;
    size_t from = g->stop_scan > g->max_stop ? g->stop_scan - g->max_stop : 0;
    size_t best = (size_t)-1;
    for (size_t i = 0; i < g->ar.n_stop; i++) {
        const char *s = g->ar.stop[i];
        size_t sl = strlen(s);
        for (size_t p = from; p + sl <= n; p++)
            if (!memcmp(t + p, s, sl)) {
                if (p < best) best = p;
                break;
            }
    }
    g->stop_scan = n;
    if (best != (size_t)-1) {
        g->stop_hit = 1;
        g->stop_at = best;
        sched_cancel(g->sv->sched, g->req);
    }
}

/* Feeds new output ids to the parser; returns 1 if anything changed. Waits up to wait_ms for news. */
static int advance(gen_ctx *g, int wait_ms) {
    gen_request *r = g->req;
    pthread_mutex_lock(&r->mu);
    if (wait_ms > 0 && r->n_out == g->fed && !r->done) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)wait_ms * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    }
    size_t n = r->n_out, from = g->fed;
    int done = r->done;
    int changed = n > from || (done && !g->done);
    for (size_t i = from; i < n; i++) chat_parser_feed(&g->cp, r->out[i]);
    pthread_mutex_unlock(&r->mu);
    g->fed = n;
    if (done && !g->done) {
        chat_parser_finish(&g->cp);
        g->done = 1;
    }
    scan_stops(g);
    if (g->done && !g->observed) {
        g->observed = 1;
        observe(g->sv, r);
    }
    return changed;
}

static const char *finish_reason(const gen_ctx *g) {
    if (g->stop_hit) return "stop";
    switch (g->req->finish) {
    case FINISH_STOP: return g->cp.n_calls ? "tool_calls" : "stop";
    case FINISH_LENGTH: return "length";
    default: return NULL;
    }
}

static json_t *jstr(const char *s, size_t n) {
    json_t *v = json_stringn(s ? s : "", s ? n : 0);
    return v ? v : json_string("");
}

static json_t *ids_array(const int32_t *ids, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

/* The text of one token as JSON (well-formed: ill-formed bytes as U+FFFD) and its bytes. */
static void token_json(const tokenizer *tok, int32_t id, json_t **text, json_t **bytes) {
    const char *b = "";
    size_t n = 0;
    tokenizer_token_bytes(tok, id, &b, &n);
    char buf[UTF8_STREAM_MAX_OUT(256)];
    size_t m = 0;
    if (n <= 256) {
        utf8_stream us;
        utf8_stream_init(&us, 1);
        m = utf8_stream_push(&us, b, n, buf);
        m += utf8_stream_flush(&us, buf + m);
    }
    *text = jstr(buf, m);
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; i < n; i++) json_array_append_new(*bytes, json_integer((unsigned char)b[i]));
    }
}

/* Chat logprobs {"content": [...]} for output tokens [a, b) (under no lock: those entries are final). */
static json_t *chat_logprobs(gen_ctx *g, size_t a, size_t b) {
    gen_request *r = g->req;
    json_t *arr = json_array();
    size_t k = (size_t)r->top_logprobs;
    pthread_mutex_lock(&r->mu);
    for (size_t i = a; i < b; i++) {
        json_t *e = json_object(), *t, *by;
        token_json(g->sv->tok, r->out[i], &t, &by);
        json_object_set_new(e, "token", t);
        json_object_set_new(e, "logprob", json_real(r->logprob[i]));
        json_object_set_new(e, "bytes", by);
        json_t *tops = json_array();
        for (size_t j = 0; j < k; j++) {
            if (r->top_id[i * k + j] < 0) continue; /* a forced id has one entry */
            json_t *te = json_object(), *tt, *tb;
            token_json(g->sv->tok, r->top_id[i * k + j], &tt, &tb);
            json_object_set_new(te, "token", tt);
            json_object_set_new(te, "logprob", json_real(r->top_lp[i * k + j]));
            json_object_set_new(te, "bytes", tb);
            json_array_append_new(tops, te);
        }
        json_object_set_new(e, "top_logprobs", tops);
        json_array_append_new(arr, e);
    }
    pthread_mutex_unlock(&r->mu);
    json_t *o = json_object();
    json_object_set_new(o, "content", arr);
    return o;
}

/* Completions logprobs {"tokens", "token_logprobs", "top_logprobs"} for tokens [a, b). */
static json_t *text_logprobs(gen_ctx *g, size_t a, size_t b) {
    gen_request *r = g->req;
    size_t k = (size_t)r->top_logprobs;
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array();
    pthread_mutex_lock(&r->mu);
    for (size_t i = a; i < b; i++) {
        json_t *t;
        token_json(g->sv->tok, r->out[i], &t, NULL);
        json_array_append_new(toks, t);
        json_array_append_new(lps, json_real(r->logprob[i]));
        json_t *m = json_object();
        for (size_t j = 0; j < k; j++) {
            if (r->top_id[i * k + j] < 0) continue;
            json_t *tt;
            token_json(g->sv->tok, r->top_id[i * k + j], &tt, NULL);
            json_object_set_new(m, json_string_value(tt), json_real(r->top_lp[i * k + j]));
            json_decref(tt);
        }
        json_array_append_new(tops, m);
    }
    pthread_mutex_unlock(&r->mu);
    json_t *o = json_object();
    json_object_set_new(o, "tokens", toks);
    json_object_set_new(o, "token_logprobs", lps);
    json_object_set_new(o, "top_logprobs", tops);
    return o;
}

static json_t *usage_json(const gen_ctx *g) {
    const gen_request *r = g->req;
    size_t out = r->n_out + (r->stop_id >= 0 ? 1 : 0);
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer((json_int_t)r->n_prompt));
    json_object_set_new(u, "completion_tokens", json_integer((json_int_t)out));
    json_object_set_new(u, "total_tokens", json_integer((json_int_t)(r->n_prompt + out)));
    json_t *d = json_object();
    json_object_set_new(d, "cached_tokens", json_integer((json_int_t)r->n_cached));
    json_object_set_new(u, "prompt_tokens_details", d);
    return u;
}

static json_t *call_json(const gen_ctx *g, size_t i, int with_index) {
    json_t *c = json_object(), *f = json_object();
    char id[96];
    snprintf(id, sizeof id, "call_%s_%zu", g->id + 9, i + 1); /* after "chatcmpl-" */
    if (with_index) json_object_set_new(c, "index", json_integer((json_int_t)i));
    json_object_set_new(c, "id", json_string(id));
    json_object_set_new(c, "type", json_string("function"));
    const cp_call *k = &g->cp.calls[i];
    json_object_set_new(f, "name", jstr(k->name, strlen(k->name)));
    json_object_set_new(f, "arguments", jstr(k->arguments, strlen(k->arguments)));
    json_object_set_new(c, "function", f);
    return c;
}

static size_t content_limit(const gen_ctx *g, int final) {
    size_t n = g->cp.content.n;
    if (g->stop_hit) return g->stop_at < n ? g->stop_at : n;
    if (final || !g->ar.n_stop) return n;
    /* hold back what could still become a stop string; never split a code point */
    size_t keep = n > g->max_stop ? n - g->max_stop : 0;
    while (keep > 0 && ((unsigned char)g->cp.content.p[keep] & 0xC0) == 0x80) keep--;
    return keep;
}

static json_t *whole_reply(gen_ctx *g) {
    json_t *o = json_object(), *ch = json_object(), *choices = json_array();
    const char *fr = finish_reason(g);
    size_t cn = content_limit(g, 1);
    json_object_set_new(o, "id", json_string(g->id));
    json_object_set_new(o, "object", json_string(g->ar.chat ? "chat.completion" : "text_completion"));
    json_object_set_new(o, "created", json_integer(g->created));
    json_object_set_new(o, "model", json_string(g->sv->cfg.model_name));
    json_object_set_new(ch, "index", json_integer(0));
    if (g->ar.chat) {
        json_t *m = json_object();
        json_object_set_new(m, "role", json_string("assistant"));
        json_object_set_new(m, "content", cn ? jstr(g->cp.content.p, cn) : json_null());
        if (g->ar.thinking) json_object_set_new(m, "reasoning_content", jstr(g->cp.reasoning.p, g->cp.reasoning.n));
        if (g->cp.n_calls) {
            json_t *tc = json_array();
            for (size_t i = 0; i < g->cp.n_calls; i++) json_array_append_new(tc, call_json(g, i, 0));
            json_object_set_new(m, "tool_calls", tc);
        }
        json_object_set_new(ch, "message", m);
        json_object_set_new(ch, "logprobs", g->ar.logprobs ? chat_logprobs(g, 0, g->req->n_out) : json_null());
    } else {
        json_object_set_new(ch, "text", jstr(g->cp.content.p, cn));
        json_object_set_new(ch, "logprobs", g->ar.logprobs ? text_logprobs(g, 0, g->req->n_out) : json_null());
    }
    json_object_set_new(ch, "finish_reason", fr ? json_string(fr) : json_null());
    if (g->ar.return_token_ids) json_object_set_new(ch, "token_ids", ids_array(g->req->out, g->req->n_out));
    json_array_append_new(choices, ch);
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", usage_json(g));
    if (g->ar.return_token_ids) json_object_set_new(o, "prompt_token_ids", ids_array(g->req->prompt, g->req->n_prompt));
    return o;
}

static void gen_ctx_free(gen_ctx *g) {
    if (!g) return;
    if (g->req) {
        if (!g->observed) { /* the client went away before the end */
            pthread_mutex_lock(&g->sv->m.mu);
            g->sv->m.cancelled++;
            pthread_mutex_unlock(&g->sv->m.mu);
        }
        sched_cancel(g->sv->sched, g->req);
        gen_request_release(g->req);
    }
    api_request_free(&g->ar);
    chat_parser_free(&g->cp);
    free(g->out);
    free(g);
}

/* ---- streaming ---- */

static int out_add(gen_ctx *g, const char *s, size_t n) {
    if (g->on + n > g->ocap) {
        size_t nc = g->ocap ? g->ocap : 4096;
        while (nc < g->on + n) nc *= 2;
        char *p = realloc(g->out, nc);
        if (!p) return -1;
        g->out = p;
        g->ocap = nc;
    }
    memcpy(g->out + g->on, s, n);
    g->on += n;
    return 0;
}

static int out_event(gen_ctx *g, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return -1;
    int rc = out_add(g, "data: ", 6) || out_add(g, s, strlen(s)) || out_add(g, "\n\n", 2);
    free(s);
    return rc;
}

static json_t *chunk_head(gen_ctx *g) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(g->id));
    json_object_set_new(o, "object", json_string(g->ar.chat ? "chat.completion.chunk" : "text_completion"));
    json_object_set_new(o, "created", json_integer(g->created));
    json_object_set_new(o, "model", json_string(g->sv->cfg.model_name));
    return o;
}

/* Sets ch's "token_ids" to the ids generated since the last event, [sent_lp, ntok). */
static void put_new_ids(gen_ctx *g, json_t *ch, size_t ntok) {
    pthread_mutex_lock(&g->req->mu);
    json_object_set_new(ch, "token_ids", ids_array(g->req->out + g->sent_lp, ntok - g->sent_lp));
    pthread_mutex_unlock(&g->req->mu);
}

/* Sends chunk o with the one choice ch. */
static int send_choice(gen_ctx *g, json_t *o, json_t *ch) {
    json_t *cs = json_array();
    json_array_append_new(cs, ch);
    json_object_set_new(o, "choices", cs);
    return out_event(g, o);
}

/* Appends the events for what is new; at the end the finish chunk, usage and [DONE]. */
static int stream_events(gen_ctx *g) {
    size_t cn = content_limit(g, g->done);
    size_t rn = g->cp.reasoning.n;
    size_t ntok = g->req->n_out;
    int new_text = cn > g->sent_content || (g->ar.chat && rn > g->sent_reasoning);
    int new_calls = g->cp.n_calls > g->sent_calls;
    int new_lp = g->ar.logprobs && ntok > g->sent_lp && !g->stop_hit;
    if (!g->role_sent && (g->ar.chat || g->ar.return_token_ids)) {
        json_t *o = chunk_head(g), *ch = json_object(), *cs = json_array();
        json_object_set_new(ch, "index", json_integer(0));
        if (g->ar.chat) {
            json_t *d = json_object();
            json_object_set_new(d, "role", json_string("assistant"));
            json_object_set_new(d, "content", json_string(""));
            json_object_set_new(ch, "delta", d);
        } else json_object_set_new(ch, "text", json_string(""));
        json_object_set_new(ch, "logprobs", json_null());
        json_object_set_new(ch, "finish_reason", json_null());
        json_array_append_new(cs, ch);
        json_object_set_new(o, "choices", cs);
        if (g->ar.return_token_ids) json_object_set_new(o, "prompt_token_ids", ids_array(g->req->prompt, g->req->n_prompt));
        if (out_event(g, o)) return -1;
        g->role_sent = 1;
    }
    if (new_text || new_calls || new_lp) {
        json_t *o = chunk_head(g), *ch = json_object();
        json_object_set_new(ch, "index", json_integer(0));
        if (g->ar.chat) {
            json_t *d = json_object();
            if (rn > g->sent_reasoning)
                json_object_set_new(d, "reasoning_content", jstr(g->cp.reasoning.p + g->sent_reasoning, rn - g->sent_reasoning));
            if (cn > g->sent_content) json_object_set_new(d, "content", jstr(g->cp.content.p + g->sent_content, cn - g->sent_content));
            if (new_calls) {
                json_t *tc = json_array();
                for (size_t i = g->sent_calls; i < g->cp.n_calls; i++) json_array_append_new(tc, call_json(g, i, 1));
                json_object_set_new(d, "tool_calls", tc);
            }
            json_object_set_new(ch, "delta", d);
            json_object_set_new(ch, "logprobs", new_lp ? chat_logprobs(g, g->sent_lp, ntok) : json_null());
        } else {
            json_object_set_new(ch, "text", jstr(g->cp.content.p + g->sent_content, cn - g->sent_content));
            json_object_set_new(ch, "logprobs", new_lp ? text_logprobs(g, g->sent_lp, ntok) : json_null());
        }
        json_object_set_new(ch, "finish_reason", json_null());
        if (g->ar.return_token_ids) put_new_ids(g, ch, ntok);
        if (send_choice(g, o, ch)) return -1;
        g->sent_content = cn;
        g->sent_reasoning = rn;
        g->sent_calls = g->cp.n_calls;
        g->sent_lp = ntok;
    } else if (g->ar.return_token_ids && ntok > g->sent_lp && !g->stop_hit) {
        /* ids that did not change any text yet (held bytes, markup): still reported in order */
        json_t *o = chunk_head(g), *ch = json_object();
        json_object_set_new(ch, "index", json_integer(0));
        if (g->ar.chat) json_object_set_new(ch, "delta", json_object());
        else json_object_set_new(ch, "text", json_string(""));
        json_object_set_new(ch, "finish_reason", json_null());
        put_new_ids(g, ch, ntok);
        if (send_choice(g, o, ch)) return -1;
        g->sent_lp = ntok;
    }
    if (g->done && !g->final_sent) {
        const char *fr = finish_reason(g);
        if (!fr) {
            const char *msg = g->req->error[0] ? g->req->error : "the request was cancelled";
            json_t *o = json_object(), *e = json_object();
            json_object_set_new(e, "message", jstr(msg, strlen(msg)));
            json_object_set_new(e, "type", json_string(g->sv->stopping ? "service_unavailable_error" : "server_error"));
            json_object_set_new(o, "error", e);
            if (out_event(g, o)) return -1;
        } else {
            json_t *o = chunk_head(g), *ch = json_object(), *cs = json_array();
            json_object_set_new(ch, "index", json_integer(0));
            if (g->ar.chat) json_object_set_new(ch, "delta", json_object());
            else json_object_set_new(ch, "text", json_string(""));
            json_object_set_new(ch, "logprobs", json_null());
            json_object_set_new(ch, "finish_reason", json_string(fr));
            json_array_append_new(cs, ch);
            json_object_set_new(o, "choices", cs);
            if (out_event(g, o)) return -1;
            if (g->ar.include_usage) {
                o = chunk_head(g);
                json_object_set_new(o, "choices", json_array());
                json_object_set_new(o, "usage", usage_json(g));
                if (out_event(g, o)) return -1;
            }
        }
        if (out_add(g, "data: [DONE]\n\n", 14)) return -1;
        g->final_sent = 1;
    }
    return 0;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    gen_ctx *g = cls;
    for (;;) {
        if (g->ooff < g->on) {
            size_t n = g->on - g->ooff < max ? g->on - g->ooff : max;
            memcpy(buf, g->out + g->ooff, n);
            g->ooff += n;
            if (g->ooff == g->on) g->ooff = g->on = 0;
            return (ssize_t)n;
        }
        if (g->final_sent) return MHD_CONTENT_READER_END_OF_STREAM;
        if (client_gone(g->fd)) return MHD_CONTENT_READER_END_WITH_ERROR;
        advance(g, 100);
        if (stream_events(g)) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (g->on > g->ooff) g->quiet = 0;
        else if (++g->quiet >= 150 && out_add(g, ": keep-alive\n\n", 14) == 0) g->quiet = 0; /* ~15 s */
    }
}

static void stream_free(void *cls) { gen_ctx_free(cls); }

/* ---- generation routes ---- */

static enum MHD_Result generate(server *sv, int route, struct MHD_Connection *c, const char *body, size_t len) {
    char err[512], param[128];
    gen_ctx *g = calloc(1, sizeof *g);
    if (!g) return send_error(sv, route, c, 500, "out of memory", NULL);
    g->sv = sv;
    int rc = api_parse(&sv->api, route == R_CHAT, body, len, &g->ar, err, sizeof err, param, sizeof param);
    if (rc) {
        free(g);
        return rc == -2 ? send_error(sv, route, c, 500, "out of memory", NULL) : send_error(sv, route, c, 400, err, param);
    }
    chat_parser_init(&g->cp, sv->tok, route == R_CHAT ? sv->api.tmpl : CHAT_TEMPLATE_K2, g->ar.thinking);
    g->cp.drop_calls = g->ar.tool_choice_none;
    g->cp.only_name = g->ar.tool_name; /* g->ar lives as long as the parser */
    g->cp.max_calls = g->ar.single_call ? 1 : 0;
    for (size_t i = 0; i < g->ar.n_stop; i++)
        if (strlen(g->ar.stop[i]) > g->max_stop) g->max_stop = strlen(g->ar.stop[i]);
    gen_request *r = gen_request_new();
    if (!r) {
        gen_ctx_free(g);
        return send_error(sv, route, c, 500, "out of memory", NULL);
    }
    g->req = r;
    r->prompt = g->ar.prompt.ids;
    r->n_prompt = g->ar.prompt.n;
    g->ar.prompt.ids = NULL;
    g->ar.prompt.n = g->ar.prompt.cap = 0;
    r->stops = g->ar.stop_ids;
    r->n_stops = g->ar.n_stop_ids;
    g->ar.stop_ids = NULL;
    g->ar.n_stop_ids = 0;
    r->force = g->ar.force.ids;
    r->n_force = g->ar.force.n;
    r->force_after = g->ar.force_after.ids;
    r->n_force_after = g->ar.force_after.n;
    memset(&g->ar.force, 0, sizeof g->ar.force);
    memset(&g->ar.force_after, 0, sizeof g->ar.force_after);
    r->max_tokens = g->ar.max_tokens;
    r->sampling = g->ar.sampling;
    r->want_logprobs = g->ar.logprobs;
    r->top_logprobs = g->ar.top_logprobs;
    pthread_mutex_lock(&sv->id_mu);
    uint64_t id = ++sv->next_id;
    pthread_mutex_unlock(&sv->id_mu);
    snprintf(g->id, sizeof g->id, "%s-%llx%06llx", route == R_CHAT ? "chatcmpl" : "cmpl-k3",
             (unsigned long long)time(NULL), (unsigned long long)id);
    g->created = (long long)time(NULL);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    g->fd = ci ? ci->connect_fd : -1;
    rc = sv->stopping ? SCHED_ESHUTDOWN : sched_submit(sv->sched, r);
    if (rc != SCHED_OK) {
        gen_request_release(r);
        g->req = NULL;
        gen_ctx_free(g);
        if (rc == SCHED_EFULL) return send_error(sv, route, c, 429, "the request queue is full; retry later", NULL);
        return send_error(sv, route, c, 503, "the server is shutting down", NULL);
    }
    /* the client waits on the engine from here on: no idle timeout (the slow-client limit applied
     * while it sent its request); streams carry a comment line when no token came for a while */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned int)0);
    if (g->ar.stream) {
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, g, stream_free);
        if (!resp) {
            gen_ctx_free(g);
            return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
        enum MHD_Result ok = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        count(sv, route, 200);
        return ok;
    }
    while (!g->done) {
        if (client_gone(g->fd)) {
            gen_ctx_free(g); /* cancels */
            count(sv, route, 499); /* client closed the request */
            return MHD_NO;
        }
        advance(g, 100);
    }
    enum MHD_Result res;
    if (!finish_reason(g)) {
        const char *msg = g->req->error[0] ? g->req->error : "the request was cancelled";
        res = send_error(sv, route, c, sv->stopping ? 503 : 500, msg, NULL);
    } else res = send_json(sv, route, c, 200, whole_reply(g));
    gen_ctx_free(g);
    return res;
}

/* ---- small routes ---- */

static json_t *models_json(server *sv) {
    json_t *o = json_object(), *a = json_array(), *m = json_object();
    json_object_set_new(m, "id", json_string(sv->cfg.model_name));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer(0));
    json_object_set_new(m, "owned_by", json_string("k3"));
    json_object_set_new(m, "max_model_len", json_integer((json_int_t)sv->cfg.max_context));
    json_array_append_new(a, m);
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", a);
    return o;
}

static enum MHD_Result tokenize(server *sv, struct MHD_Connection *c, const char *body, size_t len) {
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(o)) {
        json_decref(o);
        return send_error(sv, R_TOKENIZE, c, 400, "the body must be a JSON object", NULL);
    }
    const json_t *msgs = json_object_get(o, "messages");
    char err[512], param[128];
    json_t *res = NULL;
    if (msgs) { /* the chat rendering, exactly as /v1/chat/completions would feed it */
        api_request ar;
        json_t *copy = json_deep_copy(o);
        json_object_del(copy, "max_tokens");
        json_object_del(copy, "max_completion_tokens");
        char *s = json_dumps(copy, JSON_COMPACT);
        json_decref(copy);
        int rc = s ? api_parse(&sv->api, 1, s, strlen(s), &ar, err, sizeof err, param, sizeof param) : -2;
        free(s);
        if (rc) {
            json_decref(o);
            return rc == -2 ? send_error(sv, R_TOKENIZE, c, 500, "out of memory", NULL)
                            : send_error(sv, R_TOKENIZE, c, 400, err, param);
        }
        res = json_object();
        json_object_set_new(res, "tokens", ids_array(ar.prompt.ids, ar.prompt.n));
        json_object_set_new(res, "count", json_integer((json_int_t)ar.prompt.n));
        api_request_free(&ar);
    } else {
        const char *key = json_object_get(o, "prompt") ? "prompt" : json_object_get(o, "content") ? "content" : "text";
        const json_t *t = json_object_get(o, key);
        const json_t *sp = json_object_get(o, "add_special_tokens");
        if (!json_is_string(t)) {
            json_decref(o);
            return send_error(sv, R_TOKENIZE, c, 400, "give \"prompt\" (a string) or \"messages\"", "prompt");
        }
        if (sp && !json_is_boolean(sp)) {
            json_decref(o);
            return send_error(sv, R_TOKENIZE, c, 400, "add_special_tokens must be true or false", "add_special_tokens");
        }
        int32_t *ids = NULL;
        size_t n = 0;
        k3_error te = {0};
        int rc = tokenizer_encode(sv->tok, json_string_value(t), json_string_length(t), sp ? json_is_true(sp) : 1, &ids,
                                  &n, &te);
        if (rc) {
            free(ids);
            json_decref(o);
            return send_error(sv, R_TOKENIZE, c, te.kind == K3_ENOMEM ? 500 : 400, te.msg, key);
        }
        res = json_object();
        json_object_set_new(res, "tokens", ids_array(ids, n));
        json_object_set_new(res, "count", json_integer((json_int_t)n));
        free(ids);
    }
    json_object_set_new(res, "max_model_len", json_integer((json_int_t)sv->cfg.max_context));
    json_decref(o);
    return send_json(sv, R_TOKENIZE, c, 200, res);
}

static enum MHD_Result detokenize(server *sv, struct MHD_Connection *c, const char *body, size_t len) {
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL);
    const json_t *t = json_object_get(o, "tokens");
    if (!json_is_array(t)) {
        json_decref(o);
        return send_error(sv, R_DETOKENIZE, c, 400, "tokens must be an array of token ids", "tokens");
    }
    size_t n = json_array_size(t), V = tokenizer_vocab_size(sv->tok);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    for (size_t i = 0; ids && i < n; i++) {
        const json_t *v = json_array_get(t, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || (size_t)json_integer_value(v) >= V) {
            char p[40], m[128];
            snprintf(p, sizeof p, "tokens[%zu]", i);
            snprintf(m, sizeof m, "%s must be a token id in [0, %zu)", p, V);
            free(ids);
            json_decref(o);
            return send_error(sv, R_DETOKENIZE, c, 400, m, p);
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    json_decref(o);
    char *text = NULL;
    size_t tl = 0;
    if (!ids || tokenizer_decode(sv->tok, ids, n, &text, &tl, NULL)) {
        free(ids);
        free(text);
        return send_error(sv, R_DETOKENIZE, c, 500, "cannot decode", NULL);
    }
    free(ids);
    char *clean = malloc(UTF8_STREAM_MAX_OUT(tl) + 1);
    json_t *res = json_object();
    if (clean) {
        utf8_stream us;
        utf8_stream_init(&us, 1);
        size_t m = utf8_stream_push(&us, text, tl, clean);
        m += utf8_stream_flush(&us, clean + m);
        json_object_set_new(res, "prompt", jstr(clean, m));
    }
    free(clean);
    free(text);
    return send_json(sv, R_DETOKENIZE, c, 200, res);
}

static enum MHD_Result metrics_page(server *sv, struct MHD_Connection *c) {
    sched_stats ss;
    sched_get_stats(sv->sched, &ss);
    server_engine_stats es = {0};
    if (sv->cfg.engine_stats) sv->cfg.engine_stats(sv->cfg.engine_stats_ctx, &es);
    size_t cap = 16384, n = 0;
    char *b = malloc(cap);
    if (!b) return MHD_NO;
#define P(...) do { int w_ = snprintf(b + n, cap - n, __VA_ARGS__); if (w_ > 0 && (size_t)w_ < cap - n) n += (size_t)w_; } while (0)
    pthread_mutex_lock(&sv->m.mu);
    P("# HELP k3_requests_total HTTP requests by route and status class.\n# TYPE k3_requests_total counter\n");
    for (int r = 0; r < R_COUNT; r++)
        for (int k = 1; k <= 5; k++)
            if (sv->m.by_code[r][k]) P("k3_requests_total{route=\"%s\",code=\"%dxx\"} %llu\n", ROUTE_NAME[r], k,
                                      (unsigned long long)sv->m.by_code[r][k]);
    P("# TYPE k3_prompt_tokens_total counter\nk3_prompt_tokens_total %llu\n", (unsigned long long)sv->m.prompt_tokens);
    P("# TYPE k3_generated_tokens_total counter\nk3_generated_tokens_total %llu\n", (unsigned long long)sv->m.gen_tokens);
    P("# TYPE k3_requests_cancelled_total counter\nk3_requests_cancelled_total %llu\n", (unsigned long long)sv->m.cancelled);
    P("# HELP k3_time_to_first_token_seconds From queueing to the first generated token.\n"
      "# TYPE k3_time_to_first_token_seconds histogram\n");
    uint64_t cum = 0;
    for (int i = 0; i <= N_TTFT; i++) {
        cum += sv->m.ttft[i];
        if (i < N_TTFT) P("k3_time_to_first_token_seconds_bucket{le=\"%g\"} %llu\n", TTFT_B[i], (unsigned long long)cum);
        else P("k3_time_to_first_token_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    }
    P("k3_time_to_first_token_seconds_sum %.6f\nk3_time_to_first_token_seconds_count %llu\n", sv->m.ttft_sum,
      (unsigned long long)sv->m.ttft_n);
    P("# HELP k3_time_per_output_token_seconds Mean time between generated tokens of a request.\n"
      "# TYPE k3_time_per_output_token_seconds histogram\n");
    cum = 0;
    for (int i = 0; i <= N_TPOT; i++) {
        cum += sv->m.tpot[i];
        if (i < N_TPOT) P("k3_time_per_output_token_seconds_bucket{le=\"%g\"} %llu\n", TPOT_B[i], (unsigned long long)cum);
        else P("k3_time_per_output_token_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    }
    P("k3_time_per_output_token_seconds_sum %.6f\nk3_time_per_output_token_seconds_count %llu\n", sv->m.tpot_sum,
      (unsigned long long)sv->m.tpot_n);
    pthread_mutex_unlock(&sv->m.mu);
    P("# TYPE k3_queue_length gauge\nk3_queue_length %zu\n", ss.queued);
    P("# TYPE k3_active_sequences gauge\nk3_active_sequences %zu\n", ss.active);
    P("# TYPE k3_slots gauge\nk3_slots %zu\n", ss.parallel);
    P("# TYPE k3_steps_total counter\nk3_steps_total %llu\n", (unsigned long long)ss.steps);
    P("# TYPE k3_step_rows_total counter\nk3_step_rows_total %llu\n", (unsigned long long)ss.batch_rows);
    P("# TYPE k3_spec_passes_total counter\nk3_spec_passes_total %llu\n", (unsigned long long)ss.spec_passes);
    P("# TYPE k3_spec_proposed_total counter\nk3_spec_proposed_total %llu\n", (unsigned long long)ss.spec_proposed);
    P("# TYPE k3_spec_accepted_total counter\nk3_spec_accepted_total %llu\n", (unsigned long long)ss.spec_accepted);
    P("# TYPE k3_forward_seconds_total counter\nk3_forward_seconds_total %.6f\n", ss.forward_s);
    P("# TYPE k3_prefill_tokens_total counter\nk3_prefill_tokens_total %llu\n", (unsigned long long)ss.tokens_prefilled);
    P("# HELP k3_prefix_tokens_reused_total Prompt ids not fed because a slot's kept state or a snapshot had them.\n"
      "# TYPE k3_prefix_tokens_reused_total counter\nk3_prefix_tokens_reused_total %llu\n",
      (unsigned long long)ss.prefix_tokens_reused);
    P("# TYPE k3_snapshot_tokens_restored_total counter\nk3_snapshot_tokens_restored_total %llu\n",
      (unsigned long long)ss.snapshot_tokens_restored);
    P("# TYPE k3_snapshot_memory_hits_total counter\nk3_snapshot_memory_hits_total %llu\n",
      (unsigned long long)ss.snap.hits_mem);
    P("# HELP k3_snapshot_disk_hits_total Prefixes restored from snapshot files (--state-dir), e.g. after a restart.\n"
      "# TYPE k3_snapshot_disk_hits_total counter\nk3_snapshot_disk_hits_total %llu\n",
      (unsigned long long)ss.snap.hits_disk);
    P("# TYPE k3_snapshot_inserts_total counter\nk3_snapshot_inserts_total %llu\n", (unsigned long long)ss.snap.inserts);
    P("# TYPE k3_snapshot_files gauge\nk3_snapshot_files %zu\n", ss.snap.disk_files);
    P("# TYPE k3_snapshot_file_bytes gauge\nk3_snapshot_file_bytes %llu\n", (unsigned long long)ss.snap.disk_bytes);
    P("# TYPE k3_expert_servers gauge\nk3_expert_servers %d\n", es.n_workers);
    P("# TYPE k3_expert_server_restarts_total counter\nk3_expert_server_restarts_total %d\n", es.expert_restarts);
    P("# TYPE k3_expert_cache_hits_total counter\nk3_expert_cache_hits_total %llu\n", (unsigned long long)es.expert_hits);
    P("# TYPE k3_expert_cache_misses_total counter\nk3_expert_cache_misses_total %llu\n", (unsigned long long)es.expert_misses);
    uint64_t lk = es.expert_hits + es.expert_misses;
    P("# TYPE k3_expert_cache_hit_ratio gauge\nk3_expert_cache_hit_ratio %.6f\n", lk ? (double)es.expert_hits / (double)lk : 0.0);
    P("# TYPE k3_expert_bytes_read_total counter\nk3_expert_bytes_read_total %llu\n", (unsigned long long)es.expert_bytes_read);
    P("# TYPE k3_trunk_bytes_streamed_total counter\nk3_trunk_bytes_streamed_total %llu\n",
      (unsigned long long)es.trunk_bytes_streamed);
#undef P
    count(sv, R_METRICS, 200);
    return send_buf(c, 200, "text/plain; version=0.0.4", b, n, NULL);
}

/* ---- dispatch ---- */

typedef struct {
    int route;
    char *body;
    size_t n, cap;
    int too_big;
} conn_ctx;

static int route_of(const char *url, const char *method, int *method_ok) {
    static const struct { const char *path, *method; int route; } T[] = {
        {"/v1/chat/completions", "POST", R_CHAT}, {"/v1/completions", "POST", R_COMPLETIONS},
        {"/v1/models", "GET", R_MODELS},          {"/health", "GET", R_HEALTH},
        {"/metrics", "GET", R_METRICS},           {"/tokenize", "POST", R_TOKENIZE},
        {"/detokenize", "POST", R_DETOKENIZE},    {"/", "GET", R_PAGE},
        {"/index.html", "GET", R_PAGE}};
    for (size_t i = 0; i < sizeof T / sizeof *T; i++)
        if (!strcmp(url, T[i].path)) {
            *method_ok = !strcmp(method, T[i].method) || (!strcmp(method, "HEAD") && !strcmp(T[i].method, "GET"));
            return T[i].route;
        }
    *method_ok = 0;
    return R_NONE;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    server *sv = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) {
        if (!(cc = calloc(1, sizeof *cc))) return MHD_NO;
        *con_cls = cc;
        int mok;
        cc->route = route_of(url, method, &mok);
        if (cc->route == R_NONE) return send_error(sv, R_NONE, c, 404, "unknown path", NULL);
        if (!mok) return send_error(sv, cc->route, c, 405, "method not allowed on this path", NULL);
        /* refused before reading a byte of the body */
        if (cc->route != R_PAGE && cc->route != R_HEALTH && !authorized(sv, c))
            return send_error(sv, cc->route, c, 401, "missing or wrong API key (Authorization: Bearer KEY)", NULL);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > sv->cfg.body_limit) {
            char m[96];
            snprintf(m, sizeof m, "the request body is larger than %zu bytes", sv->cfg.body_limit);
            return send_error(sv, cc->route, c, 413, m, NULL);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cc->too_big && cc->n + *upload_size <= sv->cfg.body_limit) {
            if (cc->n + *upload_size + 1 > cc->cap) {
                size_t nc = cc->cap ? cc->cap : 4096;
                while (nc < cc->n + *upload_size + 1) nc *= 2;
                char *p = realloc(cc->body, nc);
                if (!p) return MHD_NO;
                cc->body = p;
                cc->cap = nc;
            }
            memcpy(cc->body + cc->n, upload, *upload_size);
            cc->n += *upload_size;
        } else cc->too_big = 1;
        *upload_size = 0;
        return MHD_YES;
    }
    int route = cc->route;
    if (cc->too_big) {
        char m[96];
        snprintf(m, sizeof m, "the request body is larger than %zu bytes", sv->cfg.body_limit);
        return send_error(sv, route, c, 413, m, NULL);
    }
    if (route == R_PAGE)
        return count(sv, route, 200), send_buf(c, 200, "text/html; charset=utf-8", strdup(k3_webpage_html),
                                               strlen(k3_webpage_html), NULL);
    if (route == R_HEALTH) {
        json_t *o = json_object();
        json_object_set_new(o, "status", json_string(sv->stopping ? "stopping" : "ok"));
        return send_json(sv, route, c, sv->stopping ? 503 : 200, o);
    }
    const char *body = cc->body ? cc->body : "";
    switch (route) {
    case R_MODELS: return send_json(sv, route, c, 200, models_json(sv));
    case R_METRICS: return metrics_page(sv, c);
    case R_TOKENIZE: return tokenize(sv, c, body, cc->n);
    case R_DETOKENIZE: return detokenize(sv, c, body, cc->n);
    default: return generate(sv, route, c, body, cc->n);
    }
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    (void)toe;
    conn_ctx *cc = *con_cls;
    if (cc) {
        free(cc->body);
        free(cc);
    }
    *con_cls = NULL;
}

int server_run(engine *en, const tokenizer *tok, const server_config *cfg, k3_error *err) {
    server *sv = calloc(1, sizeof *sv);
    if (!sv) return k3_fail(err, "out of memory"), 1;
    sv->en = en;
    sv->tok = tok;
    sv->cfg = *cfg;
    pthread_mutex_init(&sv->m.mu, NULL);
    pthread_mutex_init(&sv->id_mu, NULL);
    int status = 2;
    struct MHD_Daemon *d = NULL;
    if (chat_template_resolve(tok, cfg->tmpl, &sv->api.tmpl, err)) goto out;
    sv->api.tok = tok;
    sv->api.vocab = (size_t)en->model->cfg.vocab_size;
    if (tokenizer_vocab_size(tok) < sv->api.vocab) sv->api.vocab = tokenizer_vocab_size(tok);
    sv->api.max_context = cfg->max_context;
    sv->api.default_max_tokens = cfg->default_max_tokens;
    sv->api.default_thinking = cfg->thinking;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (inet_pton(AF_INET, cfg->host, &((struct sockaddr_in *)&ss)->sin_addr) == 1) {
        ((struct sockaddr_in *)&ss)->sin_family = AF_INET;
        ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)cfg->port);
    } else if (inet_pton(AF_INET6, cfg->host, &((struct sockaddr_in6 *)&ss)->sin6_addr) == 1) {
        ((struct sockaddr_in6 *)&ss)->sin6_family = AF_INET6;
        ((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)cfg->port);
        flags |= MHD_USE_IPv6;
    } else {
        k3_fail(err, "--host wants a numeric IPv4 or IPv6 address, got '%s'", cfg->host);
        goto out;
    }
    /* SIGTERM/SIGINT are taken by sigwait below; every thread started from here inherits the mask */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    status = 1;
    sched_config sc = {cfg->parallel, cfg->max_queue, cfg->chunk, cfg->max_context, NULL, cfg->draft_max, cfg->draft_per_position};
    if (cfg->state_dir && !cfg->fp) {
        k3_fail(err, "serve: a state directory needs the model's fingerprint");
        goto out;
    }
    if (cfg->snapshot_bytes || cfg->state_dir) {
        /* memory tier; files in state_dir too (keyed by the model's fingerprint) */
        snap_options so = {.cfg = &en->model->cfg, .fp = cfg->fp ? cfg->fp : &sv->fp, .mem_cap = cfg->snapshot_bytes,
                           .dir = cfg->state_dir, .disk_cap = cfg->state_dir_bytes, .max_positions = cfg->max_context,
                           .log = stderr};
        if (snap_store_open(&sv->snaps, &so, err)) goto out;
        sc.snaps = sv->snaps;
    }
    if (!(sv->sched = sched_create(en, &sc, err))) goto out;
    d = MHD_start_daemon(flags, 0, NULL, NULL, handler, sv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                         MHD_OPTION_NOTIFY_COMPLETED, completed, sv, MHD_OPTION_CONNECTION_TIMEOUT,
                         (unsigned)cfg->timeout_s, MHD_OPTION_CONNECTION_LIMIT,
                         (unsigned)(cfg->parallel + cfg->max_queue + 16), MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                         (size_t)65536, MHD_OPTION_LISTENING_ADDRESS_REUSE, 1, MHD_OPTION_END);
    if (!d) {
        k3_fail(err, "cannot listen on %s port %d (in use, or not an address of this machine)", cfg->host, cfg->port);
        status = 2;
        goto out;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(stderr, "k3: serving on http://%s%s%s:%u (%zu slots, queue %zu%s)\n", strchr(cfg->host, ':') ? "[" : "",
            cfg->host, strchr(cfg->host, ':') ? "]" : "", di ? (unsigned)di->port : (unsigned)cfg->port, cfg->parallel,
            cfg->max_queue, cfg->api_key ? ", API key required" : "");
    fflush(stderr);
    int sig = 0;
    sigdelset(&set, SIGPIPE);
    while (sigwait(&set, &sig) != 0) {
    }
    fprintf(stderr, "k3: %s: stopping the server\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    sv->stopping = 1;
    status = 0;
out:
    if (sv->sched) sched_stop(sv->sched); /* wakes every waiting connection */
    if (d) MHD_stop_daemon(d);
    sched_destroy(sv->sched);
    snap_store_free(sv->snaps);
    pthread_mutex_destroy(&sv->m.mu);
    pthread_mutex_destroy(&sv->id_mu);
    free(sv);
    return status;
}
