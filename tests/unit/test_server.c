#define _GNU_SOURCE /* nftw (tests/unit/harness.h) */
/* test_server.c - the server's pure parts on the m13 tokenizer (K3 specials):
 * - xtml: the full rendering of K3-CHAT.md section 1 (tool-declare with 2 tools, thinking-effort,
 *   user, assistant with reasoning and a tool call, tool result, answer) decodes to the spec's text,
 *   and every attribute is its own segment; tool results are put in call order by tool_call_id;
 *   tool-choice / response-format messages; no-thinking leaves the think channel out;
 * - chat_parse: the assistant turn's ids (after the generation prompt) parse back to the same
 *   reasoning, content and tool call (a round trip by ids); marker TEXT in content stays content;
 * - openai_api: refusals name the field;
 * - tool_choice: a named choice must be declared (400 naming tool_choice); named / "required" give
 *   the forced ids of xtml_forced_call, which are exactly the renderer's ids of an assistant turn
 *   that calls the tool (after <|close|>think<|sep|> with thinking, at once without); "none" and
 *   a named choice filter the parsed calls;
 * - scheduler on m13 (in-process engine, 3 slots, 5 concurrent greedy requests): forced ids
 *   enter when their trigger has been generated (and at once with an empty trigger), carry
 *   logprob 0 and one top entry, and what follows them equals the same ids given as a prompt; a
 *   600-id prompt is fed 16 ids per step while a decoding sequence gets a token in every step. */
#include "check.h"
#include "harness.h"
#include "common/kernels.h"
#include "coordinator/chat_parse.h"
#include "coordinator/experts_local.h"
#include "coordinator/openai_api.h"
#include "coordinator/plan.h"
#include "coordinator/scheduler.h"
#include "coordinator/trunk.h"
#include "coordinator/xtml.h"

#include <stdlib.h>
#include <string.h>

static tokenizer *tok;

static char *decode(const chat_ids *v) {
    char *s = NULL;
    size_t n;
    if (tokenizer_decode(tok, v->ids, v->n, &s, &n, NULL)) return NULL;
    return s;
}

static int render(const char *messages_json, const xtml_options *o, chat_ids *out, char *param) {
    json_t *m = json_loads(messages_json, 0, NULL);
    k3_error err = {0};
    int rc = xtml_render_chat(tok, CHAT_TEMPLATE_K3, m, o, out, &err, param, 128);
    if (rc) printf("render: %s (%s)\n", err.msg, param);
    json_decref(m);
    return rc;
}

static const char *SPEC_MESSAGES =
    "[{\"role\":\"user\",\"content\":\"What's the weather in Paris for the next 3 days?\"},"
    "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"The user wants a 3-day forecast for Paris; call "
    "get_weather.\",\"tool_calls\":[{\"id\":\"call_abc\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
    "\"arguments\":\"{\\\"city\\\": \\\"Paris\\\", \\\"days\\\": 3}\"}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"call_abc\",\"content\":\"{\\\"forecast\\\": [\\\"sun\\\", \\\"clouds\\\", "
    "\\\"rain\\\"]}\"},"
    "{\"role\":\"assistant\",\"content\":\"Paris: sun, then clouds, then rain.\",\"reasoning_content\":\"Got the "
    "forecast; summarise it.\"}]";

static const char *SPEC_TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Get the weather forecast for a "
    "city.\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":"
    "\"integer\"}},\"required\":[\"city\",\"days\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"description\":\"Get the current time in an IANA "
    "timezone.\",\"parameters\":{\"type\":\"object\",\"properties\":{\"timezone\":{\"type\":\"string\"}},\"required\":"
    "[\"timezone\"]}}}]";

static const char *SPEC_TEXT =
    "<|open|>message role=\"system\" type=\"tool-declare\"<|sep|># Tools\nHere are the available tools, described in "
    "JSONSchema.\n\n```json\n[{\"function\":{\"description\":\"Get the weather forecast for a "
    "city.\",\"name\":\"get_weather\",\"parameters\":{\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":"
    "\"integer\"}},\"required\":[\"city\",\"days\"],\"type\":\"object\"}},\"type\":\"function\"},{\"function\":{"
    "\"description\":\"Get the current time in an IANA "
    "timezone.\",\"name\":\"get_time\",\"parameters\":{\"properties\":{\"timezone\":{\"type\":\"string\"}},\"required\":"
    "[\"timezone\"],\"type\":\"object\"}},\"type\":\"function\"}]\n```<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"system\" type=\"thinking-effort\"<|sep|>`thinking_effort` guides on how much to think in "
    "your thinking channel (not including the response channel), supported values include `low`, `medium`, `high`, "
    "and `max`.\nNow the system is invoked with `thinking_effort=max`.<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"user\"<|sep|>What's the weather in Paris for the next 3 days?<|close|>message<|sep|>"
    "<|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>The user wants a 3-day forecast for Paris; call "
    "get_weather.<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|><|open|>call "
    "tool=\"get_weather\" index=\"1\"<|sep|><|open|>argument key=\"city\" "
    "type=\"string\"<|sep|>Paris<|close|>argument<|sep|><|open|>argument key=\"days\" "
    "type=\"number\"<|sep|>3<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>"
    "<|end_of_msg|>"
    "<|open|>message role=\"tool\" tool=\"get_weather\" index=\"1\"<|sep|>{\"forecast\": [\"sun\", \"clouds\", "
    "\"rain\"]}<|close|>message<|sep|><|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>Got the forecast; summarise it.<|close|>think<|sep|>"
    "<|open|>response<|sep|>Paris: sun, then clouds, then rain.<|close|>response<|sep|><|close|>message<|sep|>"
    "<|end_of_msg|>"
    "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>";

static size_t find_ids(const chat_ids *v, const int32_t *pat, size_t m, size_t from) {
    for (size_t i = from; i + m <= v->n; i++)
        if (!memcmp(v->ids + i, pat, m * sizeof *pat)) return i;
    return (size_t)-1;
}

static void test_spec_rendering(void) {
    json_t *tools = json_loads(SPEC_TOOLS, 0, NULL);
    xtml_options o = {.thinking = 1, .effort = "max", .tools = tools};
    chat_ids v = {0};
    char param[128];
    CHECK(render(SPEC_MESSAGES, &o, &v, param) == 0, "render the spec conversation");
    char *s = decode(&v);
    CHECK(s && !strcmp(s, SPEC_TEXT), "the spec's section 1 text; got\n%s", s ? s : "(null)");
    /* attributes are separate segments: ` role` `="` `user` `"` each encoded alone */
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    tokenizer_encode(tok, " role", 5, 0, &a, &na, NULL);
    tokenizer_encode(tok, "user", 4, 0, &b, &nb, NULL);
    chat_ids pat = {0};
    chat_ids_append(&pat, a, na);
    int32_t q[8];
    int32_t *qi = NULL;
    size_t nq = 0;
    tokenizer_encode(tok, "=\"", 2, 0, &qi, &nq, NULL);
    chat_ids_append(&pat, qi, nq);
    chat_ids_append(&pat, b, nb);
    (void)q;
    CHECK(find_ids(&v, pat.ids, pat.n, 0) != (size_t)-1, "' role' '=\"' 'user' as separate segments");
    free(a), free(b), free(qi), free(s);
    chat_ids_free(&pat);

    /* parse back the first assistant turn: from after its think open to its end */
    int32_t open = tokenizer_special_id(tok, "<|open|>"), end = tokenizer_special_id(tok, "<|end_of_msg|>");
    size_t at = 0;
    for (int k = 0; k < 3; k++) at = find_ids(&v, &end, 1, at) + 1; /* after 3 messages */
    size_t think = find_ids(&v, &open, 1, at + 1);                   /* <|open|>think */
    int32_t sep = tokenizer_special_id(tok, "<|sep|>");
    size_t body = find_ids(&v, &sep, 1, think) + 1;                  /* open, "think", sep */
    size_t stop = find_ids(&v, &end, 1, body);
    chat_parser p;
    chat_parser_init(&p, tok, CHAT_TEMPLATE_K3, 1);
    for (size_t i = body; i < stop; i++) chat_parser_feed(&p, v.ids[i]);
    chat_parser_finish(&p);
    CHECK(p.reasoning.p && !strcmp(p.reasoning.p, "The user wants a 3-day forecast for Paris; call get_weather."),
          "reasoning '%s'", p.reasoning.p ? p.reasoning.p : "");
    CHECK(p.content.n == 0, "no content, got '%s'", p.content.p);
    CHECK(p.n_calls == 1, "one call, got %zu", p.n_calls);
    if (p.n_calls == 1) {
        CHECK(!strcmp(p.calls[0].name, "get_weather"), "name %s", p.calls[0].name);
        CHECK(!strcmp(p.calls[0].arguments, "{\"city\": \"Paris\", \"days\": 3}"), "arguments %s", p.calls[0].arguments);
    }
    chat_parser_free(&p);
    chat_ids_free(&v);

    /* thinking off: no effort message, no think channel, generation prompt opens response */
    o.thinking = 0;
    o.effort = NULL;
    o.tools = NULL;
    CHECK(render("[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\","
                 "\"reasoning_content\":\"hmm\"},{\"role\":\"user\",\"content\":\"again\"}]",
                 &o, &v, param) == 0, "render without thinking");
    s = decode(&v);
    CHECK(s && !strcmp(s, "<|open|>message role=\"user\"<|sep|>hi<|close|>message<|sep|><|end_of_msg|>"
                          "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>yo<|close|>response<|sep|>"
                          "<|close|>message<|sep|><|end_of_msg|><|open|>message role=\"user\"<|sep|>again<|close|>"
                          "message<|sep|><|end_of_msg|><|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>"),
          "no-thinking rendering; got %s", s);
    free(s);
    chat_ids_free(&v);
    json_decref(tools);
}

static void test_tool_order_and_system_messages(void) {
    /* results given in the reverse of the call order are rendered in call order, index 1, 2 */
    const char *msgs =
        "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
        "{\"id\":\"A\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}},"
        "{\"id\":\"B\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"not json\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"B\",\"content\":\"rb\"},{\"role\":\"tool\",\"tool_call_id\":\"A\","
        "\"content\":\"ra\"}]";
    json_t *schema = json_loads("{\"type\":\"object\",\"properties\":{\"b\":{},\"a\":{}}}", 0, NULL);
    xtml_options o = {.thinking = 0, .tool_choice = "required", .response_format = "json_schema", .json_schema = schema};
    chat_ids v = {0};
    char param[128];
    CHECK(render(msgs, &o, &v, param) == 0, "render tool results");
    char *s = decode(&v);
    const char *want =
        "<|open|>message role=\"user\"<|sep|>q<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
        "<|open|>call tool=\"f\" index=\"1\"<|sep|><|close|>call<|sep|><|open|>call tool=\"g\" index=\"2\"<|sep|>"
        "<|open|>json type=\"object\"<|sep|>not json<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>"
        "<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"tool\" tool=\"f\" index=\"1\"<|sep|>ra<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"tool\" tool=\"g\" index=\"2\"<|sep|>rb<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"system\" type=\"tool-choice\"<|sep|>The system is invoked with `tool_choice=required`."
        "\nYou MUST call tools in the next message.<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"system\" type=\"response-format\"<|sep|>The system is invoked with "
        "`response_format=json_schema`.\nYour response must be raw JSON data without markdown code blocks (```json) or "
        "any additional formatting.\nThe JSON data must match the following schema:\n```json\n{\"properties\":{\"a\":{},"
        "\"b\":{}},\"type\":\"object\"}\n```<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>";
    CHECK(s && !strcmp(s, want), "tool results in call order; got\n%s", s ? s : "(null)");
    free(s);
    chat_ids_free(&v);
    json_decref(schema);
    o = (xtml_options){.thinking = 0}; /* no longer points at the freed schema */
    /* attribute escaping: & then " */
    CHECK(render("[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"x\",\"function\":{\"name\":"
                 "\"a&\\\"b\",\"arguments\":{\"k\":[1,{\"z\":true}]}}}]}]",
                 &o, &v, param) == 0, "escaping");
    s = decode(&v);
    CHECK(s && strstr(s, "tool=\"a&amp;&quot;b\"") && strstr(s, "key=\"k\" type=\"array\"<|sep|>[1, {\"z\": true}]"),
          "escaped attribute and array argument; got %s", s);
    /* and parse that call back */
    chat_parser p;
    chat_parser_init(&p, tok, CHAT_TEMPLATE_K3, 0);
    int32_t sep = tokenizer_special_id(tok, "<|sep|>");
    size_t from = 0, k = 0;
    for (size_t i = 0; i < v.n && k < 4; i++) /* skip message-open sep and response-open sep */
        if (v.ids[i] == sep && ++k == 2) from = i + 1;
    for (size_t i = from; i < v.n; i++) chat_parser_feed(&p, v.ids[i]);
    chat_parser_finish(&p);
    CHECK(p.n_calls == 1 && !strcmp(p.calls[0].name, "a&\"b") && !strcmp(p.calls[0].arguments, "{\"k\": [1, {\"z\": true}]}"),
          "parsed back: %zu %s %s", p.n_calls, p.n_calls ? p.calls[0].name : "", p.n_calls ? p.calls[0].arguments : "");
    chat_parser_free(&p);
    free(s);
    chat_ids_free(&v);
}

static void test_marker_text_is_content(void) {
    /* "<|close|>response<|sep|>" typed as text: plain BPE, never structure */
    chat_parser p;
    chat_parser_init(&p, tok, CHAT_TEMPLATE_K3, 0);
    int32_t *ids = NULL;
    size_t n = 0;
    const char *t = "a<|close|>response<|sep|>b";
    tokenizer_encode(tok, t, strlen(t), 0, &ids, &n, NULL);
    for (size_t i = 0; i < n; i++) chat_parser_feed(&p, ids[i]);
    chat_parser_finish(&p);
    CHECK(p.content.p && !strcmp(p.content.p, t), "marker text stays content: '%s'", p.content.p);
    free(ids);
    chat_parser_free(&p);
}

/* ids of the model's output: <|open|> / <|close|> / <|sep|> as control ids, the rest plain BPE */
static void feed_markup(chat_parser *p, const char *const *parts, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int id = tokenizer_special_id(tok, parts[i]);
        if (id >= 0) {
            chat_parser_feed(p, id);
            continue;
        }
        /* well-formed runs encoded, each ill-formed byte as its byte token (the encoder takes UTF-8 only) */
        const char *t = parts[i];
        size_t len = strlen(t);
        while (len > 0) {
            size_t good = utf8_valid_prefix(t, len);
            int32_t *ids = NULL;
            size_t m = 0;
            if (good) tokenizer_encode(tok, t, good, 0, &ids, &m, NULL);
            for (size_t k = 0; k < m; k++) chat_parser_feed(p, ids[k]);
            free(ids);
            t += good, len -= good;
            if (len == 0) break;
            for (size_t v = 0; v < tokenizer_vocab_size(tok); v++) {
                const char *b;
                size_t bn;
                if (!tokenizer_token_bytes(tok, (int32_t)v, &b, &bn) && bn == 1 && b[0] == t[0]) {
                    chat_parser_feed(p, (int32_t)v);
                    break;
                }
            }
            t++, len--;
        }
    }
}

static void test_attribute_bytes_well_formed(void) {
    /* a tool name and an argument key with ill-formed UTF-8 (the model can emit any byte tokens):
     * U+FFFD like every other text, so the server's JSON keeps the call and the argument */
    static const char *const parts[] = {"<|open|>", "tools", "<|sep|>", "<|open|>", "call tool=\"get\xffw\"", "<|sep|>",
                                        "<|open|>", "argument key=\"c\xe2\x82\" type=\"string\"", "<|sep|>", "Paris",
                                        "<|close|>", "argument", "<|sep|>", "<|close|>", "call", "<|sep|>",
                                        "<|close|>", "tools", "<|sep|>"};
    chat_parser p;
    chat_parser_init(&p, tok, CHAT_TEMPLATE_K3, 0);
    feed_markup(&p, parts, sizeof parts / sizeof parts[0]);
    chat_parser_finish(&p);
    CHECK(p.n_calls == 1, "one call, got %zu", p.n_calls);
    if (p.n_calls == 1) {
        CHECK(!strcmp(p.calls[0].name, "get\xef\xbf\xbdw"), "name with U+FFFD, got '%s'", p.calls[0].name);
        CHECK(!strcmp(p.calls[0].arguments, "{\"c\xef\xbf\xbd\": \"Paris\"}"), "key with U+FFFD, got '%s'",
              p.calls[0].arguments);
    }
    chat_parser_free(&p);

    /* an argument left open by a json child, then another argument, then a call left open by the
     * end: each argument's key freed once (make asan: no leak), the json child's text the arguments */
    static const char *const open_args[] = {"<|open|>", "tools", "<|sep|>", "<|open|>", "call tool=\"f\"", "<|sep|>",
                                            "<|open|>", "argument key=\"a\"", "<|sep|>", "1", "<|open|>", "json",
                                            "<|sep|>", "{}", "<|open|>", "argument key=\"b\" type=\"number\"",
                                            "<|sep|>", "2", "<|open|>", "call tool=\"g\"", "<|sep|>", "<|open|>",
                                            "argument key=\"c\"", "<|sep|>", "3"};
    chat_parser_init(&p, tok, CHAT_TEMPLATE_K3, 0);
    feed_markup(&p, open_args, sizeof open_args / sizeof open_args[0]);
    chat_parser_finish(&p);
    CHECK(p.n_calls == 2 && !strcmp(p.calls[0].arguments, "{}") && !strcmp(p.calls[1].arguments, "{\"c\": \"3\"}"),
          "open arguments: %zu calls, '%s'", p.n_calls, p.n_calls ? p.calls[0].arguments : "");
    chat_parser_free(&p);
}

/* parallel_tool_calls false: only the first complete call is kept (max_calls 1) */
static void test_single_call(void) {
    static const char *const two[] = {"<|open|>", "tools", "<|sep|>", "<|open|>", "call tool=\"a\"", "<|sep|>",
                                      "<|close|>", "call", "<|sep|>", "<|open|>", "call tool=\"b\"", "<|sep|>",
                                      "<|close|>", "call", "<|sep|>", "<|close|>", "tools", "<|sep|>"};
    for (size_t max = 0; max <= 1; max++) {
        chat_parser p;
        chat_parser_init(&p, tok, CHAT_TEMPLATE_K3, 0);
        p.max_calls = max;
        feed_markup(&p, two, sizeof two / sizeof two[0]);
        chat_parser_finish(&p);
        CHECK(p.n_calls == (max ? 1u : 2u) && !strcmp(p.calls[0].name, "a"), "max_calls %zu: %zu calls", max, p.n_calls);
        chat_parser_free(&p);
    }
}

static void refused(int chat, const char *body, const char *param) {
    api_context c = {tok, CHAT_TEMPLATE_K3, tokenizer_vocab_size(tok), 512, 16, 1};
    api_request r;
    char err[512], got[128];
    int rc = api_parse(&c, chat, body, strlen(body), &r, err, sizeof err, got, sizeof got);
    CHECK(rc == -1 && !strcmp(got, param), "%s: rc %d param '%s' (want '%s'): %s", body, rc, got, param, err);
    if (!rc) api_request_free(&r);
}

static void test_api_refusals(void) {
    refused(1, "{\"messages\":", "");
    refused(1, "[1]", "");
    refused(1, "{\"messages\":[]}", "messages");
    refused(1, "{\"messages\":[{\"role\":\"x\",\"content\":\"a\"}]}", "messages[0].role");
    refused(1, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content");
    refused(1, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"max_tokens\":100000}", "max_tokens");
    refused(1, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"max_tokens\":0}", "max_tokens");
    refused(1, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"top_p\":0}", "top_p");
    refused(1, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"stop\":[1]}", "stop[0]");
    refused(1, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tools\":[{\"type\":\"x\"}]}", "tools[0]");
    refused(1, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"reasoning_effort\":\"medium\"}", "reasoning_effort");
    refused(1, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"stream\":1}", "stream");
    refused(1, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"top_logprobs\":3}", "top_logprobs");
    refused(0, "{\"prompt\":[1,-2]}", "prompt[1]");
    refused(0, "{\"prompt\":{}}", "prompt");
    refused(0, "{\"prompt\":\"a\",\"logprobs\":21}", "logprobs");
    refused(0, "{\"prompt\":\"\"}", "prompt");
    /* accepted: defaults and the prompt as ids */
    api_context c = {tok, CHAT_TEMPLATE_K3, tokenizer_vocab_size(tok), 512, 16, 1};
    api_request r;
    char err[256], param[64];
    const char *ok = "{\"prompt\":[1,2,3],\"max_tokens\":4,\"temperature\":0.5,\"seed\":7,\"stop\":\"x\"}";
    CHECK(api_parse(&c, 0, ok, strlen(ok), &r, err, sizeof err, param, sizeof param) == 0, "accepted: %s", err);
    CHECK(r.prompt.n == 3 && r.max_tokens == 4 && r.sampling.temperature == 0.5 && r.sampling.seed == 7 && r.n_stop == 1,
          "fields");
    api_request_free(&r);
}

static int parse_ok(const char *body, api_request *r) {
    api_context c = {tok, CHAT_TEMPLATE_K3, tokenizer_vocab_size(tok), 4096, 16, 1};
    char err[512], param[128];
    int rc = api_parse(&c, 1, body, strlen(body), r, err, sizeof err, param, sizeof param);
    if (rc) printf("parse: %s (%s)\n", err, param);
    return rc;
}

static char *chat_body(const char *extra) {
    json_t *o = json_object();
    json_object_set_new(o, "messages", json_loads("[{\"role\":\"user\",\"content\":\"Time in Paris?\"}]", 0, NULL));
    json_object_set_new(o, "tools", json_loads(SPEC_TOOLS, 0, NULL));
    json_t *x = json_loads(extra, 0, NULL);
    json_object_update(o, x);
    json_decref(x);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* presence_penalty, frequency_penalty, logit_bias: parsed into the sampler settings, refused naming
 * the field */
static void test_penalty_fields(void) {
    const char *m = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],";
    char b[512];
    static const struct {
        const char *extra, *param;
    } bad[] = {{"\"presence_penalty\":2.5}", "presence_penalty"},
               {"\"frequency_penalty\":\"1\"}", "frequency_penalty"},
               {"\"logit_bias\":[1]}", "logit_bias"},
               {"\"logit_bias\":{\"x\":1}}", "logit_bias.x"},
               {"\"logit_bias\":{\"-3\":1}}", "logit_bias.-3"},
               {"\"logit_bias\":{\"99999999\":1}}", "logit_bias.99999999"},
               {"\"logit_bias\":{\"5\":101}}", "logit_bias.5"},
               {"\"logit_bias\":{\"5\":true}}", "logit_bias.5"},
               {"\"logit_bias\":{\"5\":1,\"005\":2}}", "logit_bias.005"},
               {"\"repetition_penalty\":0}", "repetition_penalty"},
               {"\"repetition_penalty\":11}", "repetition_penalty"},
               {"\"parallel_tool_calls\":\"no\"}", "parallel_tool_calls"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(b, sizeof b, "%s%s", m, bad[i].extra);
        refused(1, b, bad[i].param);
    }
    api_request r;
    snprintf(b, sizeof b, "%s\"presence_penalty\":0.5,\"frequency_penalty\":-1.25,\"logit_bias\":{\"7\":-100,\"12\":3.5}}", m);
    if (parse_ok(b, &r) == 0) {
        CHECK(r.sampling.presence_penalty == 0.5 && r.sampling.frequency_penalty == -1.25 && r.sampling.n_bias == 2,
              "penalties %g %g, %zu biases", r.sampling.presence_penalty, r.sampling.frequency_penalty, r.sampling.n_bias);
        int seen7 = 0, seen12 = 0;
        for (size_t i = 0; i < r.sampling.n_bias; i++) {
            seen7 |= r.sampling.bias[i].id == 7 && r.sampling.bias[i].value == -100;
            seen12 |= r.sampling.bias[i].id == 12 && r.sampling.bias[i].value == 3.5;
        }
        CHECK(seen7 && seen12, "the two biases");
        api_request_free(&r);
    } else CHECK(0, "penalties and biases refused");
    snprintf(b, sizeof b, "%s\"parallel_tool_calls\":false}", m);
    if (parse_ok(b, &r) == 0) {
        CHECK(r.single_call == 1, "parallel_tool_calls false: one call");
        api_request_free(&r);
    } else CHECK(0, "parallel_tool_calls false refused");
    snprintf(b, sizeof b, "%s\"repetition_penalty\":1.25}", m);
    if (parse_ok(b, &r) == 0) {
        CHECK(r.sampling.repetition_penalty == 1.25, "repetition_penalty %g", r.sampling.repetition_penalty);
        api_request_free(&r);
    } else CHECK(0, "repetition_penalty 1.25 refused");
    snprintf(b, sizeof b, "%s\"repetition_penalty\":1}", m);
    if (parse_ok(b, &r) == 0) {
        CHECK(r.sampling.repetition_penalty == 0, "repetition_penalty 1 is off");
        api_request_free(&r);
    } else CHECK(0, "repetition_penalty 1 refused");
    snprintf(b, sizeof b, "%s\"presence_penalty\":null,\"logit_bias\":null}", m);
    if (parse_ok(b, &r) == 0) {
        CHECK(r.sampling.presence_penalty == 0 && r.sampling.n_bias == 0, "null fields are the defaults");
        api_request_free(&r);
    } else CHECK(0, "null penalty fields refused");
}

static void test_tool_choice(void) {
    const char *undeclared = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tools\":[{\"type\":\"function\","
                             "\"function\":{\"name\":\"f\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":{"
                             "\"name\":\"g\"}}}";
    refused(1, undeclared, "tool_choice");
    refused(1, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tool_choice\":{\"type\":\"function\","
               "\"function\":{\"name\":\"g\"}}}", "tool_choice");
    refused(1, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tool_choice\":\"required\"}", "tool_choice");
    api_request r;

    /* named, thinking on: after </think>, the forced ids are the renderer's own for that call */
    char *b = chat_body("{\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}");
    CHECK(parse_ok(b, &r) == 0, "named tool_choice accepted");
    free(b);
    char *after = decode(&r.force_after), *force = decode(&r.force), *prompt = decode(&r.prompt);
    CHECK(after && !strcmp(after, "<|close|>think<|sep|>"), "force_after '%s'", after ? after : "");
    CHECK(force && !strcmp(force, "<|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|><|open|>call "
                                  "tool=\"get_weather\" index=\"1\"<|sep|>"),
          "force '%s'", force ? force : "");
    CHECK(r.tool_name && !strcmp(r.tool_name, "get_weather"), "tool_name");
    CHECK(prompt && !strstr(prompt, "tool-choice"), "a named choice renders no tool-choice message");
    {
        json_t *tools = json_loads(SPEC_TOOLS, 0, NULL);
        xtml_options o = {.thinking = 1, .effort = "max", .tools = tools};
        chat_ids v = {0}, pat = {0};
        char param[128];
        render(SPEC_MESSAGES, &o, &v, param);
        chat_ids_append(&pat, r.force_after.ids, r.force_after.n);
        chat_ids_append(&pat, r.force.ids, r.force.n);
        CHECK(find_ids(&v, pat.ids, pat.n, 0) != (size_t)-1, "forced ids = the rendered assistant turn's ids");
        chat_ids_free(&v);
        chat_ids_free(&pat);
        json_decref(tools);
    }
    free(after), free(force), free(prompt);
    api_request_free(&r);

    /* named, thinking off: at once after the generation prompt's <|open|>response<|sep|> */
    b = chat_body("{\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}},\"thinking\":false}");
    CHECK(parse_ok(b, &r) == 0, "named tool_choice without thinking");
    free(b);
    force = decode(&r.force);
    CHECK(r.force_after.n == 0, "no trigger without thinking");
    CHECK(force && !strcmp(force, "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"get_time\" "
                                  "index=\"1\"<|sep|>"),
          "force '%s'", force ? force : "");
    free(force);
    api_request_free(&r);

    /* required, two tools: the model writes the name; the tool-choice message is there */
    b = chat_body("{\"tool_choice\":\"required\"}");
    CHECK(parse_ok(b, &r) == 0, "required accepted");
    free(b);
    force = decode(&r.force);
    prompt = decode(&r.prompt);
    CHECK(force && !strcmp(force, "<|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\""),
          "required force '%s'", force ? force : "");
    CHECK(!r.tool_name && prompt && strstr(prompt, "tool_choice=required"), "required: message, no name");
    free(force), free(prompt);
    api_request_free(&r);

    /* none: the message, no forcing, calls dropped by the parser */
    b = chat_body("{\"tool_choice\":\"none\"}");
    CHECK(parse_ok(b, &r) == 0 && r.tool_choice_none && r.force.n == 0, "none");
    free(b);
    api_request_free(&r);

    /* the parser keeps only the named tool's calls, and none with drop_calls */
    json_t *tools = json_loads(SPEC_TOOLS, 0, NULL);
    xtml_options o = {.thinking = 1, .effort = "max", .tools = tools};
    chat_ids v = {0};
    char param[128];
    render(SPEC_MESSAGES, &o, &v, param);
    int32_t open = tokenizer_special_id(tok, "<|open|>"), end = tokenizer_special_id(tok, "<|end_of_msg|>");
    int32_t sep = tokenizer_special_id(tok, "<|sep|>");
    size_t at = 0;
    for (int k = 0; k < 3; k++) at = find_ids(&v, &end, 1, at) + 1;
    size_t body = find_ids(&v, &sep, 1, find_ids(&v, &open, 1, at + 1)) + 1, stop = find_ids(&v, &end, 1, body);
    for (int mode = 0; mode < 3; mode++) {
        chat_parser p;
        chat_parser_init(&p, tok, CHAT_TEMPLATE_K3, 1);
        p.drop_calls = mode == 0;
        p.only_name = mode == 1 ? "get_time" : mode == 2 ? "get_weather" : NULL;
        for (size_t i = body; i < stop; i++) chat_parser_feed(&p, v.ids[i]);
        chat_parser_finish(&p);
        CHECK(p.n_calls == (mode == 2 ? 1u : 0u) && p.content.n == 0, "mode %d: %zu calls, content '%s'", mode,
              p.n_calls, p.content.p ? p.content.p : "");
        chat_parser_free(&p);
    }
    chat_ids_free(&v);
    json_decref(tools);
}

/* ---- the scheduler on m13 ---- */

static int32_t *ids_dup(const int32_t *a, size_t n) {
    int32_t *o = malloc((n ? n : 1) * sizeof *o);
    if (o && n) memcpy(o, a, n * sizeof *o);
    return o;
}

static gen_request *req(const int32_t *prompt, size_t n, size_t max_tokens) {
    gen_request *r = gen_request_new();
    r->prompt = ids_dup(prompt, n);
    r->n_prompt = n;
    r->max_tokens = max_tokens;
    sampler_config_default(&r->sampling);
    return r;
}

static void wait_done(gen_request *r) {
    pthread_mutex_lock(&r->mu);
    while (!r->done) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

static void test_scheduler_forced(void) {
    test_engine te;
    test_engine_open(&te, "tests/models/m13", 64, 4096);
    k3_error err = {0};
    sched_config sc = {.parallel = 3, .max_queue = 8, .chunk = 16, .max_context = 1024};
    scheduler *s = sched_create(&te.en, &sc, &err);
    CHECK(s != NULL, "sched_create: %s", err.msg);
    if (!s) {
        test_engine_close(&te);
        return;
    }
    int32_t P[20], F[3] = {400, 401, 402};
    for (int i = 0; i < 20; i++) P[i] = 300 + i;
    /* A: plain */
    gen_request *a = req(P, 20, 16);
    sched_submit(s, a);
    wait_done(a);
    CHECK(a->n_out == 16 && a->finish == FINISH_LENGTH, "A: %zu ids, finish %d", a->n_out, a->finish);
    /* the trigger: the first pair of A's ids (from index 2) that does not occur earlier */
    size_t j = 2;
    for (; j + 2 <= 10; j++) {
        int seen = 0;
        for (size_t i = 0; i < j; i++) seen |= a->out[i] == a->out[j] && a->out[i + 1] == a->out[j + 1];
        if (!seen) break;
    }
    size_t cut = j + 2; /* B's output: A's first `cut` ids, F, then the continuation */
    gen_request *b = req(P, 20, 16), *d = req(P, 20, 7);
    b->force_after = ids_dup(a->out + j, 2);
    b->n_force_after = 2;
    b->force = ids_dup(F, 3);
    b->n_force = 3;
    b->want_logprobs = 1;
    b->top_logprobs = 2;
    d->force = ids_dup(F, 3); /* no trigger: at once */
    d->n_force = 3;
    int32_t pc[40], pe[40];
    memcpy(pc, P, sizeof P);
    memcpy(pc + 20, a->out, cut * sizeof *pc);
    memcpy(pc + 20 + cut, F, sizeof F);
    memcpy(pe, P, sizeof P);
    memcpy(pe + 20, F, sizeof F);
    gen_request *c = req(pc, 23 + cut, 16 - cut - 3), *e = req(pe, 23, 4);
    gen_request *all[] = {b, c, d, e};
    for (int i = 0; i < 4; i++) CHECK(sched_submit(s, all[i]) == SCHED_OK, "submit %d", i);
    for (int i = 0; i < 4; i++) wait_done(all[i]);
    CHECK(b->n_out == 16 && !memcmp(b->out, a->out, cut * sizeof *b->out) && !memcmp(b->out + cut, F, sizeof F),
          "B: A's first %zu ids then the forced ids (%zu ids)", cut, b->n_out);
    CHECK(c->n_out == 16 - cut - 3 && !memcmp(b->out + cut + 3, c->out, c->n_out * sizeof *c->out),
          "B after the forced ids = the same ids as a prompt (C)");
    CHECK(b->logprob[cut] == 0 && b->top_id[cut * 2] == F[0] && b->top_id[cut * 2 + 1] == -1 && b->logprob[0] < 0,
          "forced ids: logprob 0, one top entry");
    CHECK(d->n_out == 7 && !memcmp(d->out, F, sizeof F) && e->n_out == 4 && !memcmp(d->out + 3, e->out, 4 * sizeof *e->out),
          "an empty trigger forces at once; the rest = the same ids as a prompt (E)");
    /* forced ids that fill max_tokens end the request at once */
    gen_request *f = req(P, 20, 2);
    f->force = ids_dup(F, 3);
    f->n_force = 3;
    sched_submit(s, f);
    wait_done(f);
    CHECK(f->n_out == 2 && f->finish == FINISH_LENGTH && f->out[0] == F[0] && f->out[1] == F[1],
          "forced ids cut at max_tokens: %zu ids, finish %d", f->n_out, f->finish);
    gen_request_release(f);

    /* a long prompt is fed in chunks of at most `chunk` ids, and a decoding sequence is in every
     * step while it prefills (one row each: it is never stalled) */
    int32_t L[600];
    for (int i = 0; i < 600; i++) L[i] = 1 + (i * 37) % 500;
    gen_request *lg = req(L, 600, 1), *dec = req(P, 20, 60);
    sched_submit(s, lg);
    sched_submit(s, dec);
    wait_done(lg);
    wait_done(dec);
    CHECK(lg->max_rows_step == sc.chunk && lg->n_steps == (600 + sc.chunk - 1) / sc.chunk,
          "the long prompt: %llu steps, at most %zu ids per step", (unsigned long long)lg->n_steps, lg->max_rows_step);
    CHECK(dec->n_steps == dec->step_last - dec->step_first + 1 && dec->n_steps == 60 + 1,
          "the decoding sequence was in every step from its first to its last (%llu steps, %llu..%llu)",
          (unsigned long long)dec->n_steps, (unsigned long long)dec->step_first, (unsigned long long)dec->step_last);
    CHECK(dec->step_first <= lg->step_last && lg->step_first <= dec->step_last, "the two overlapped (%llu..%llu, %llu..%llu)",
          (unsigned long long)lg->step_first, (unsigned long long)lg->step_last, (unsigned long long)dec->step_first,
          (unsigned long long)dec->step_last);
    gen_request_release(lg);
    gen_request_release(dec);
    gen_request_release(a);
    for (int i = 0; i < 4; i++) gen_request_release(all[i]);
    sched_destroy(s);
    test_engine_close(&te);
}

/* logit_bias and penalties through the scheduler on m13: a +100 bias takes every pick; penalties
 * change the reply; with n-gram speculation (sched_config.draft_max) the ids are those without it,
 * and speculation accepted proposals (negative penalties make the reply repeat) */
static void test_scheduler_adjusted(void) {
    test_engine te;
    test_engine_open(&te, "tests/models/m13", 64, 4096);
    k3_error err = {0};
    int32_t P[12];
    for (int i = 0; i < 12; i++) P[i] = 300 + 7 * i;
    gen_request *out[2][4] = {{0}};
    for (int spec = 0; spec < 2; spec++) {
        sched_config sc = {.parallel = 3, .max_queue = 8, .chunk = 16, .max_context = 1024, .draft_max = spec ? 4 : 0};
        scheduler *s = sched_create(&te.en, &sc, &err);
        CHECK(s != NULL, "sched_create: %s", err.msg);
        if (!s) break;
        gen_request *biased = req(P, 12, 8), *plain = req(P, 12, 24), *rep = req(P, 12, 24), *rp = req(P, 12, 24);
        biased->sampling.n_bias = 1;
        biased->sampling.bias[0] = (sampler_bias){77, 100.0};
        rep->sampling.frequency_penalty = -2.0;
        rep->sampling.presence_penalty = -2.0;
        rp->sampling.repetition_penalty = 0.2; /* < 1: the prompt's and the reply's ids favoured */
        gen_request *all[4] = {biased, plain, rep, rp};
        for (int i = 0; i < 4; i++) CHECK(sched_submit(s, all[i]) == SCHED_OK, "submit %d", i);
        for (int i = 0; i < 4; i++) wait_done(all[i]);
        CHECK(rp->n_out == 24 && memcmp(rp->out, plain->out, 24 * sizeof *rp->out), "repetition_penalty changes the reply");
        int all77 = biased->n_out == 8;
        for (size_t i = 0; i < biased->n_out; i++) all77 &= biased->out[i] == 77;
        CHECK(all77, "a +100 bias on id 77: every id 77 (%zu ids, first %d)", biased->n_out, biased->out[0]);
        CHECK(rep->n_out == 24 && plain->n_out == 24 && memcmp(rep->out, plain->out, 24 * sizeof *rep->out),
              "negative penalties change the reply");
        sched_stats st;
        sched_get_stats(s, &st);
        if (spec) CHECK(st.spec_accepted > 0, "speculation accepted %llu proposals", (unsigned long long)st.spec_accepted);
        sched_destroy(s);
        for (int i = 0; i < 4; i++) out[spec][i] = all[i];
    }
    for (int i = 0; i < 4; i++) {
        if (out[0][i] && out[1][i])
            CHECK(out[0][i]->n_out == out[1][i]->n_out &&
                      !memcmp(out[0][i]->out, out[1][i]->out, out[0][i]->n_out * sizeof *out[0][i]->out),
                  "request %d: the same ids with speculation", i);
        for (int k = 0; k < 2; k++)
            if (out[k][i]) gen_request_release(out[k][i]);
    }
    test_engine_close(&te);
}

int main(void) {
    k3_error err = {0};
    tok = tokenizer_load("tests/models/m13", &err);
    if (!tok) {
        printf("cannot load the m13 tokenizer: %s\n", err.msg);
        return 1;
    }
    test_spec_rendering();
    test_tool_order_and_system_messages();
    test_marker_text_is_content();
    test_attribute_bytes_well_formed();
    test_penalty_fields();
    test_single_call();
    test_api_refusals();
    test_tool_choice();
    test_scheduler_forced();
    test_scheduler_adjusted();
    tokenizer_free(tok);
    return check_report("test_server");
}
