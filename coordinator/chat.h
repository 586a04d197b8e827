/* chat.h - rendering a conversation to token ids: the K3 XTML template and the K2 / Kimi Linear
 * <|im_*|> template, template detection, stop ids (docs/CHAT.md).
 *
 * Contract
 * - K3 (shared/spec/TOKENIZER.md, "Chat (K3)"): a message is
 *     <|open|>message role="ROLE"<|sep|> CONTENT <|close|>message<|sep|><|end_of_msg|>
 *   and the generation prompt is <|open|>message role="assistant"<|sep|> followed by
 *   <|open|>think<|sep|> (thinking) or <|open|>response<|sep|> (no thinking).
 * - K2 (the jinja files in shared/tools/tokenizer-oracle/templates/): a message is
 *     <|im_user|>user<|im_middle|> CONTENT <|im_end|>            (role "user")
 *     <|im_assistant|>assistant<|im_middle|> CONTENT <|im_end|>  (role "assistant")
 *     <|im_system|>ROLE<|im_middle|> CONTENT <|im_end|>          (any other role: system, tool, ...)
 *   and the generation prompt is <|im_assistant|>assistant<|im_middle|> (thinking is ignored: a K2
 *   thinking model opens <think> itself). The jinja templates add a default system message when the
 *   conversation does not start with one; chat_default_system gives the K2-Instruct/Thinking text.
 * - Structural segments (everything but CONTENT) are encoded with special-token text allowed;
 *   CONTENT is encoded with it disallowed, so a user typing "<|open|>" gets plain BPE, never the
 *   special id. For content without special-token text the ids equal those of encoding the whole
 *   rendered text with specials allowed (specials delimit every segment).
 * - ROLE must be 1..32 characters of [A-Za-z0-9_.-].
 * - Render functions APPEND to a chat_ids buffer; on failure the buffer is left as it was.
 * - Errors (common/error.h): 0, or -1 with err filled: K3_EINPUT (bad role, invalid UTF-8
 *   content, missing special, bad stop id, bad template name), K3_ENOMEM. */
#ifndef K3_CHAT_H
#define K3_CHAT_H

#include "coordinator/tokenizer.h"
#include <stddef.h>
#include <stdint.h>


typedef enum { CHAT_TEMPLATE_AUTO = 0, CHAT_TEMPLATE_K3 = 1, CHAT_TEMPLATE_K2 = 2 } chat_template;

/* A growable id buffer. Zero-initialise; chat_ids_free releases it. */
typedef struct {
    int32_t *ids;
    size_t n, cap;
} chat_ids;

int chat_ids_append(chat_ids *v, const int32_t *ids, size_t n); /* 0, or -1 when out of memory */
void chat_ids_free(chat_ids *v);

/* "auto" | "k3" | "k2" (also "kimi-linear" = k2). 0, or -1 with a message. */
int chat_template_parse(const char *name, chat_template *t, k3_error *err);
const char *chat_template_name(chat_template t); /* "auto", "k3", "k2" */
/* K3 if the tokenizer names <|open|>, else K2 if it names <|im_user|>, else CHAT_TEMPLATE_AUTO
 * (meaning: none). */
chat_template chat_template_detect(const tokenizer *tok);
/* want AUTO -> detect; then checks that every special the template uses exists (the message names
 * the missing one). 0 or -1 (K3_EINPUT). */
int chat_template_resolve(const tokenizer *tok, chat_template want, chat_template *got, k3_error *err);
/* The system text the template's jinja adds when none is given: K2 "You are Kimi, an AI assistant
 * created by Moonshot AI.", K3 NULL (none). */
const char *chat_default_system(chat_template t);

/* One whole message: header, content (len bytes, specials disallowed), end. */
int chat_render_turn(const tokenizer *tok, chat_template t, const char *role, const char *text, size_t len,
                     chat_ids *out, k3_error *err);
/* The assistant header the model continues from. */
int chat_render_generation_prompt(const tokenizer *tok, chat_template t, int thinking, chat_ids *out, k3_error *err);

/* Stop ids, looked up by name: K3 <|end_of_msg|>, K2 <|im_end|>, then [EOS] when the tokenizer has
 * it, then the extra ids (each must be < the tokenizer's vocabulary; duplicates dropped). The first
 * id is the template's end of message (chat_end_id). *ids malloc'd. */
int chat_stop_ids(const tokenizer *tok, chat_template t, const int32_t *extra, size_t n_extra, int32_t **ids,
                  size_t *n, k3_error *err);
/* The end-of-message id (<|end_of_msg|> or <|im_end|>), -1 if the tokenizer lacks it. */
int32_t chat_end_id(const tokenizer *tok, chat_template t);

#endif
