/* xtml.h - rendering an OpenAI-style conversation (jansson values) to K3 ids with the XTML markup of
 * shared/spec/K3-CHAT.md (sections 1-4), and to K2 ids through chat.h.
 *
 * Contract
 * - Segments as Moonshot's encoding_k3.py: the four control tokens (<|open|> <|close|> <|sep|>
 *   <|end_of_msg|>) are appended as their ids; every other piece (tag names, each attribute as the
 *   four segments ` key`, `="`, escaped value, `"`, and every text body) is BPE-encoded ON ITS OWN
 *   with special-token text disallowed, so typed markup never becomes a control id.
 * - Order: tool-declare (when tools are given), thinking-effort (thinking on and an effort set),
 *   the messages in their order (consecutive tool results re-ordered to the preceding assistant's
 *   call order by tool_call_id; left alone if any id does not match), tool-choice (required/none),
 *   response-format (json_object/json_schema), then the generation prompt (think or response).
 * - Tool JSON is deep-key-sorted and compact; argument values follow the spec's table (string raw,
 *   numbers/bools/null as JSON, objects and arrays with ", " / ": " separators in the given order).
 * - Validation: every problem is refused with a message naming the request field
 *   ("messages[2].tool_calls[0].function.arguments: ..."), never guessed: unknown roles, wrong types,
 *   a content part that is not text, a tool result whose tool name cannot be found.
 * - Errors (common/error.h): 0, or -1 with err filled: K3_EINPUT (the field path in param),
 *   K3_ENOMEM. */
#ifndef K3_XTML_H
#define K3_XTML_H

#include "coordinator/chat.h"
#include <jansson.h>

typedef struct {
    int thinking;             /* K3: think channel on */
    const char *effort;       /* "low" | "high" | "max" or NULL (no thinking-effort message) */
    const json_t *tools;      /* array or NULL */
    const char *tool_choice;  /* "auto" | "none" | "required" | NULL */
    const char *response_format;   /* NULL | "json_object" | "json_schema" */
    const json_t *json_schema;     /* the schema object for json_schema */
    const char *default_system;    /* K2: added when the conversation has no system message */
} xtml_options;

int xtml_render_chat(const tokenizer *tok, chat_template t, const json_t *messages, const xtml_options *o,
                     chat_ids *out, k3_error *err, char *param, size_t paramlen);

/* Forcing a tool call (tool_choice named or "required"; K3 only): `force` gets the ids that make
 * the assistant's reply a call, segment by segment as the renderer writes them:
 * [<|open|>response<|sep|>] <|close|>response<|sep|> <|open|>tools<|sep|> then, with a name,
 * <|open|>call tool="NAME" index="1"<|sep|> (the model writes the arguments), without one
 * <|open|>call tool=" (the model writes the name). With thinking, `after` gets the ids the model
 * ends its reasoning with (<|close|>think<|sep|>) and the forced ids follow them, so the model
 * still reasons first; without, `after` is left empty: the forced ids follow the generation
 * prompt at once. Appends to both; 0, or -1 (err: K3_EINPUT without the K3 control tokens,
 * K3_ENOMEM). */
int xtml_forced_call(const tokenizer *tok, int thinking, const char *name, chat_ids *after, chat_ids *force,
                     k3_error *err);

/* Python json.dumps(v, ensure_ascii=False) with default separators, keys in their order
 * (malloc'd, NULL when out of memory). */
char *xtml_json_default(const json_t *v);

#endif
