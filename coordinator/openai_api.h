/* openai_api.h - OpenAI request bodies to generation requests (validation, rendering) and the
 * JSON of replies.
 *
 * Contract
 * - api_parse reads an untrusted body (any bytes, len given) of POST /v1/chat/completions (chat=1)
 *   or POST /v1/completions (chat=0). Every refusal is a 400 with a message naming the field in
 *   `param` ("max_tokens", "messages[1].role", "prompt[3]", ...): malformed JSON, wrong types,
 *   unknown roles, n != 1, values out of range, token ids outside [0, vocab), a prompt + max_tokens
 *   past the context limit. Unknown fields are ignored (clients send many).
 * - Fields: model (string), messages | prompt (text, array of ids, or [text]), max_tokens /
 *   max_completion_tokens, temperature, top_p, top_k, min_p, seed, presence_penalty and
 *   frequency_penalty ([-2, 2]), repetition_penalty ((0, 10], vLLM's: prompt and reply ids),
 *   logit_bias ({"<id>": [-100, 100]}, ids in [0, vocab) given once, at most K3_MAX_LOGIT_BIAS;
 *   param "logit_bias.<key>"), stop (string or array of at most
 *   16 non-empty strings), stream, stream_options.include_usage, logprobs (chat: bool; completions:
 *   integer = top count), top_logprobs (0..20), n (1), reasoning_effort ("none" | "low" | "high" |
 *   "max"), thinking (bool or {"type": "enabled" | "disabled"}), tools, tool_choice, response_format,
 *   return_token_ids (bool, k3 extension: prompt_token_ids / token_ids in the reply),
 *   parallel_tool_calls (bool, default true; false: only the reply's first complete call is
 *   returned, as vLLM does).
 * - tool_choice: "auto" (default), "none" (the tool-choice message; calls are not returned),
 *   "required" (the tool-choice message, and the reply is forced into a call: with one tool, a
 *   call to it), {"type": "function", "function": {"name": X}} (no message, as K3-CHAT.md says;
 *   the reply is forced into a call to X). X must be among tools; named/required need K3.
 * - The prompt: chat -> xtml_render_chat (K3 XTML or K2) ending in the generation prompt;
 *   completions -> the text encoded with special-token text allowed (like --prompt), or the ids.
 *   Stop ids: the template's (chat_stop_ids), for both endpoints.
 * - Return 0, -1 (400: message in err, field in param) or -2 (out of memory). */
#ifndef K3_OPENAI_API_H
#define K3_OPENAI_API_H

#include "coordinator/chat.h"
#include "coordinator/sampler.h"
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const tokenizer *tok;
    chat_template tmpl;
    size_t vocab;              /* the model's */
    size_t max_context;        /* prompt + max_tokens limit */
    size_t default_max_tokens;
    int default_thinking;
} api_context;

typedef struct {
    int chat, stream, include_usage, logprobs, top_logprobs, thinking, return_token_ids, has_tools;
    size_t max_tokens;
    sampler_config sampling;
    char **stop;
    size_t n_stop;
    chat_ids prompt;
    int32_t *stop_ids;
    size_t n_stop_ids;
    /* tool_choice (chat, K3): named or "required" -> the ids that force the call (xtml_forced_call:
     * `force` once the output ends with `force_after`, at once when that is empty); tool_name: the
     * named function (only calls to it are returned); "none" -> tool_choice_none (a tools channel
     * the model opens anyway is dropped: no tool_calls, not in content) */
    chat_ids force, force_after;
    char *tool_name;
    int tool_choice_none;
    int single_call; /* parallel_tool_calls false: only the reply's first call is returned */
} api_request;

int api_parse(const api_context *c, int chat, const char *body, size_t len, api_request *r, char *err, size_t errlen,
              char *param, size_t paramlen);
void api_request_free(api_request *r);

/* {"error": {"message", "type", "param", "code"}} as a malloc'd string. */
char *api_error_json(const char *message, const char *type, const char *param, const char *code);

#endif
