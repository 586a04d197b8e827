/* test_server.c - the server's pure parts on the m13 tokenizer (K3 specials):
 * - xtml: the full rendering of K3-CHAT.md section 1 (tool-declare with 2 tools, thinking-effort,
 *   user, assistant with reasoning and a tool call, tool result, answer) decodes to the spec's text,
 *   and every attribute is its own segment; tool results are put in call order by tool_call_id;
 *   tool-choice / response-format messages; no-thinking leaves the think channel out;
 * - chat_parse: the assistant turn's ids (after the generation prompt) parse back to the same
 *   reasoning, content and tool call (a round trip by ids); marker TEXT in content stays content;
 * - openai_api: refusals name the field. */
#include "check.h"
#include "coordinator/chat_parse.h"
#include "coordinator/openai_api.h"
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
    test_api_refusals();
    tokenizer_free(tok);
    return check_report("test_server");
}
