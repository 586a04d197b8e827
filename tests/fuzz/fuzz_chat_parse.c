/* fuzz_chat_parse.c - libFuzzer harness for the model-output parser (coordinator/chat_parse: ids
 * back to reasoning_content, content and tool_calls), with the m13 tokenizer (K3 specials). The
 * model's ids are untrusted: a random-weight test model, a fine-tune or a sampler at high
 * temperature can emit any sequence, and the server turns what the parser returns into JSON.
 *
 * Input: byte 0 = flags (bit 0 thinking on, bit 1 the K2 template instead of K3, bit 2
 * drop_calls, bit 3 only_name "get_weather", bit 4 max_calls 1); then a stream where a byte
 * below 0xC0 picks one of a dictionary of pieces (the control ids, tag texts such as
 * `call tool="get_weather"`, argument values, quotes and entities, ill-formed and split UTF-8, a
 * marker spelled as plain text), and a byte from 0xC0 takes the next two bytes as a raw id (any
 * id, also past the vocabulary).
 *
 * Checked after every id: reasoning and content only grow, and what a streamer has already sent
 * (everything up to the last length) never changes (checked at the end against the deltas
 * collected on the way); n_calls never shrinks. At the end: reasoning, content, every call's name
 * and arguments are well-formed UTF-8 and NUL-terminated at their length; drop_calls keeps no
 * call; only_name keeps only calls of that name; max_calls 1 at most one; K2 keeps no reasoning
 * and no call. Never a
 * crash, a leak or undefined behaviour. */
#include "coordinator/chat_parse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* sampler.c (pulled in by the tokenizer's sources list) refers to it; the parser never samples */
int32_t argmax_logits(const float *logits, size_t n);
int32_t argmax_logits(const float *logits, size_t n) {
    (void)logits;
    (void)n;
    abort();
}

static tokenizer *tok;
#define MAX_PIECES 64
static int32_t *piece_ids[MAX_PIECES];
static size_t piece_n[MAX_PIECES], n_pieces;

static void add_special(const char *name) {
    int id = tokenizer_special_id(tok, name);
    if (id < 0 || n_pieces == MAX_PIECES) return;
    piece_ids[n_pieces] = malloc(sizeof(int32_t));
    if (!piece_ids[n_pieces]) abort();
    piece_ids[n_pieces][0] = id;
    piece_n[n_pieces++] = 1;
}

/* a piece of text as the model could emit it: well-formed UTF-8 by the encoder, any other byte
 * as its byte token (the encoder takes UTF-8 only) */
static void add_text(const char *text, size_t len) {
    if (n_pieces == MAX_PIECES) return;
    int32_t *ids = malloc((len + 1) * sizeof *ids * 4);
    size_t n = 0;
    if (!ids) abort();
    while (len > 0) {
        const size_t good = utf8_valid_prefix(text, len);
        if (good) {
            k3_error err = {0};
            int32_t *e = NULL;
            size_t m = 0;
            if (tokenizer_encode(tok, text, good, 0, &e, &m, &err)) {
                fprintf(stderr, "fuzz_chat_parse: encoding a piece: %s\n", err.msg);
                abort();
            }
            int32_t *q = realloc(ids, (n + m + len + 1) * sizeof *ids);
            if (!q) abort();
            ids = q;
            memcpy(ids + n, e, m * sizeof *ids);
            n += m;
            free(e);
            text += good, len -= good;
            continue;
        }
        size_t v = 0;
        for (; v < tokenizer_vocab_size(tok); v++) {
            const char *b;
            size_t bn;
            if (!tokenizer_token_bytes(tok, (int32_t)v, &b, &bn) && bn == 1 && b[0] == text[0]) break;
        }
        if (v == tokenizer_vocab_size(tok)) abort(); /* a byte-level vocabulary has every byte */
        ids[n++] = (int32_t)v;
        text++, len--;
    }
    piece_ids[n_pieces] = ids;
    piece_n[n_pieces++] = n;
}
#define TEXT(s) add_text(s, sizeof(s) - 1)

static void init(void) {
    k3_error err = {0};
    tok = tokenizer_load("tests/models/m13", &err);
    if (!tok) {
        fprintf(stderr, "fuzz_chat_parse: %s (run from the repository root)\n", err.msg);
        abort();
    }
    add_special("<|open|>");
    add_special("<|close|>");
    add_special("<|sep|>");
    add_special("<|end_of_msg|>");
    add_special("<|im_end|>");
    TEXT("think");
    TEXT("response");
    TEXT("tools");
    TEXT("message");
    TEXT("call");
    TEXT("call tool=\"get_weather\"");
    TEXT("call tool=\"\"");
    TEXT("call tool=\"a&quot;b&amp;quot;\"");
    TEXT(" tool=\"");
    TEXT("argument key=\"city\" type=\"string\"");
    TEXT("argument key=\"days\" type=\"number\"");
    TEXT("argument key=\"o\" type=\"object\"");
    TEXT("argument type=\"boolean\"");
    TEXT(" key=\"");
    TEXT("json");
    TEXT("\"");
    TEXT(" ");
    TEXT("Paris");
    TEXT("3");
    TEXT("{\"a\": [1, 2], \"b\": null}");
    TEXT("{\"a\": ");
    TEXT("true");
    TEXT("&quot;");
    TEXT("&amp;");
    TEXT("\xc3\xa9");
    TEXT("\xe2\x82");     /* the first two bytes of a three-byte code point */
    TEXT("\xac");         /* ... and its last */
    TEXT("\xff\xfe\xc0"); /* never well-formed */
    TEXT("\xf0\x9f\x98\x80");
    TEXT("<|open|>think<|sep|>"); /* markers typed as text: plain BPE, never structure */
    TEXT("<|close|>response<|sep|>");
    TEXT("\n");
}

typedef struct {
    char *p;
    size_t n, cap;
} grow_buf;

static void grow_add(grow_buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t c = (b->n + n + 1) * 2;
        char *q = realloc(b->p, c);
        if (!q) abort();
        b->p = q, b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

/* what a streamer sends: the bytes past what it sent before; the buffer must only grow */
static void follow(const cp_buf *now, grow_buf *sent) {
    if (now->n < sent->n) abort();
    if (now->n > sent->n) grow_add(sent, now->p + sent->n, now->n - sent->n);
}

static void check_text(const char *p, size_t n) {
    if (!p) {
        if (n) abort();
        return;
    }
    if (p[n] != 0) abort();
    if (utf8_valid_prefix(p, n) != n) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tok) init();
    if (size < 1) return 0;
    const int flags = data[0];
    chat_parser p;
    chat_parser_init(&p, tok, (flags & 2) ? CHAT_TEMPLATE_K2 : CHAT_TEMPLATE_K3, flags & 1);
    p.drop_calls = (flags & 4) != 0;
    p.only_name = (flags & 8) ? "get_weather" : NULL;
    p.max_calls = (flags & 16) ? 1 : 0;
    grow_buf sent_r = {0}, sent_c = {0};
    size_t calls = 0;
    for (size_t i = 1; i < size;) {
        const int32_t *ids;
        size_t n;
        int32_t raw;
        if (data[i] < 0xC0) {
            ids = piece_ids[data[i] % n_pieces];
            n = piece_n[data[i] % n_pieces];
            i++;
        } else {
            if (i + 3 > size) break;
            raw = (int32_t)(((data[i] & 0x3f) << 16) | (data[i + 1] << 8) | data[i + 2]);
            ids = &raw;
            n = 1;
            i += 3;
        }
        for (size_t k = 0; k < n; k++) {
            if (chat_parser_feed(&p, ids[k])) abort(); /* no allocation fails here */
            follow(&p.reasoning, &sent_r);
            follow(&p.content, &sent_c);
            if (p.n_calls < calls) abort();
            calls = p.n_calls;
        }
    }
    if (chat_parser_finish(&p)) abort();
    follow(&p.reasoning, &sent_r);
    follow(&p.content, &sent_c);
    if (p.n_calls < calls) abort();
    if (sent_r.n && memcmp(sent_r.p, p.reasoning.p, sent_r.n)) abort(); /* sent bytes changed */
    if (sent_c.n && memcmp(sent_c.p, p.content.p, sent_c.n)) abort();
    check_text(p.reasoning.p, p.reasoning.n);
    check_text(p.content.p, p.content.n);
    for (size_t c = 0; c < p.n_calls; c++) {
        if (!p.calls[c].name || !p.calls[c].arguments) abort();
        check_text(p.calls[c].name, strlen(p.calls[c].name));
        check_text(p.calls[c].arguments, strlen(p.calls[c].arguments));
        if (p.only_name && strcmp(p.calls[c].name, p.only_name)) abort();
    }
    if (p.drop_calls && p.n_calls) abort();
    if (p.max_calls && p.n_calls > p.max_calls) abort();
    if ((flags & 2) && (p.n_calls || p.reasoning.n)) abort();
    chat_parser_free(&p);
    free(sent_r.p);
    free(sent_c.p);
    return 0;
}
