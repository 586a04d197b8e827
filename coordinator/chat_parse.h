/* chat_parse.h - the model's output ids back to OpenAI fields: reasoning_content, content and
 * tool_calls (shared/spec/K3-CHAT.md section 5), incrementally and BY TOKEN IDS.
 *
 * Contract
 * - K3: structure is recognised only from the control ids <|open|> / <|close|> followed by the tag
 *   text up to <|sep|>; marker text typed inside content (plain BPE) can never open or close an
 *   element. With thinking on, output starts in the think channel (the prompt opened it); without,
 *   in response. `think` text -> reasoning; `response` text -> content; `tools` holds `call`
 *   elements (tool="NAME", attributes unescaped &quot; then &amp;, ill-formed bytes -> U+FFFD)
 *   with `argument` children (type string: raw text; other types JSON-decoded, the raw text if
 *   that fails) or a `json` child (arguments = its text verbatim). Arguments of a call are serialised as Python's
 *   json.dumps (", " / ": ", emission order). A call without a tool name is dropped. Text outside
 *   every channel goes to content; after </message> everything is ignored.
 * - K2 (or any other template): every token's bytes are content.
 * - Text is accumulated as well-formed UTF-8 (ill-formed bytes -> U+FFFD, code points never split):
 *   reasoning / content grow as ids arrive, so a streamer sends the bytes past what it already sent.
 *   A tool call is complete (n_calls grows) when its </call> arrives (or at chat_parser_finish).
 * - drop_calls / only_name / max_calls (fields): calls that are not kept are dropped whole.
 * - chat_parser_finish flushes held bytes and closes an unterminated call. */
#ifndef K3_CHAT_PARSE_H
#define K3_CHAT_PARSE_H

#include "coordinator/chat.h"
#include <jansson.h>

typedef struct {
    char *p;
    size_t n, cap;
} cp_buf;

typedef struct {
    char *name;
    char *arguments; /* JSON text */
} cp_call;

typedef struct {
    const tokenizer *tok;
    int k3;
    int32_t open, close, sep;
    int chan;         /* where text goes now */
    int tag;          /* 0: not in a tag; 1: after <|open|>; 2: after <|close|> */
    int ended;        /* </message> seen */
    cp_buf tagtext;
    cp_buf reasoning, content;
    utf8_stream us_reasoning, us_content;
    /* the call being read */
    int in_call, call_json;
    char *call_name;
    json_t *call_args;
    cp_buf call_raw;
    char *arg_key, *arg_type;
    cp_buf arg_val;
    cp_call *calls;
    size_t n_calls, cap_calls;
    int oom;
    /* set after chat_parser_init (tool_choice): drop_calls -> no call is kept ("none": a tools
     * channel is dropped, neither calls nor content); only_name -> only calls to that tool are kept
     * (a named tool_choice; not owned) */
    int drop_calls;
    const char *only_name;
    size_t max_calls; /* 0: every call is kept; else calls past the first max_calls are dropped */
} chat_parser;

void chat_parser_init(chat_parser *p, const tokenizer *tok, chat_template t, int thinking);
/* 0, or -1 when out of memory. */
int chat_parser_feed(chat_parser *p, int32_t id);
int chat_parser_finish(chat_parser *p);
void chat_parser_free(chat_parser *p);

#endif
