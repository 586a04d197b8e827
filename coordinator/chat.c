/* chat.c - chat templates to token ids, template detection, stop ids (contract: chat.h). */
#include "coordinator/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const K3_SPECIALS[] = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", NULL};
static const char *const K2_SPECIALS[] = {"<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
                                          "<|im_end|>", NULL};

int chat_ids_append(chat_ids *v, const int32_t *ids, size_t n) {
    if (v->n + n > v->cap) {
        size_t cap = v->cap ? v->cap : 64;
        while (cap < v->n + n) cap *= 2;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        if (!p) return CHAT_ENOMEM;
        v->ids = p;
        v->cap = cap;
    }
    if (n) memcpy(v->ids + v->n, ids, n * sizeof *ids);
    v->n += n;
    return CHAT_OK;
}

void chat_ids_free(chat_ids *v) {
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

int chat_template_parse(const char *name, chat_template *t, char *err, size_t errlen) {
    if (!strcmp(name, "auto")) *t = CHAT_TEMPLATE_AUTO;
    else if (!strcmp(name, "k3")) *t = CHAT_TEMPLATE_K3;
    else if (!strcmp(name, "k2") || !strcmp(name, "kimi-linear")) *t = CHAT_TEMPLATE_K2;
    else {
        snprintf(err, errlen, "--template wants auto|k3|k2, got '%s'", name);
        return -1;
    }
    return 0;
}

const char *chat_template_name(chat_template t) {
    switch (t) {
    case CHAT_TEMPLATE_K3: return "k3";
    case CHAT_TEMPLATE_K2: return "k2";
    default: return "auto";
    }
}

chat_template chat_template_detect(const tokenizer *tok) {
    if (tokenizer_special_id(tok, "<|open|>") >= 0) return CHAT_TEMPLATE_K3;
    if (tokenizer_special_id(tok, "<|im_user|>") >= 0) return CHAT_TEMPLATE_K2;
    return CHAT_TEMPLATE_AUTO;
}

int chat_template_resolve(const tokenizer *tok, chat_template want, chat_template *got, char *err, size_t errlen) {
    chat_template t = want;
    if (t == CHAT_TEMPLATE_AUTO) {
        t = chat_template_detect(tok);
        if (t == CHAT_TEMPLATE_AUTO) {
            snprintf(err, errlen,
                     "no chat template fits this tokenizer: it names neither <|open|> (K3) nor <|im_user|> (K2)");
            return CHAT_EINPUT;
        }
    }
    if (t != CHAT_TEMPLATE_K3 && t != CHAT_TEMPLATE_K2) {
        snprintf(err, errlen, "unknown chat template %d", (int)t);
        return CHAT_EINPUT;
    }
    const char *const *need = t == CHAT_TEMPLATE_K3 ? K3_SPECIALS : K2_SPECIALS;
    for (int i = 0; need[i]; i++)
        if (tokenizer_special_id(tok, need[i]) < 0) {
            snprintf(err, errlen, "the %s chat template needs the special token %s, which this tokenizer lacks",
                     chat_template_name(t), need[i]);
            return CHAT_EINPUT;
        }
    *got = t;
    return CHAT_OK;
}

const char *chat_default_system(chat_template t) {
    return t == CHAT_TEMPLATE_K2 ? "You are Kimi, an AI assistant created by Moonshot AI." : NULL;
}

static int role_ok(const char *role) {
    size_t n = strlen(role);
    if (n == 0 || n > 32) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = role[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
              c == '-'))
            return 0;
    }
    return 1;
}

/* Appends the ids of text; a NUL-terminated structural segment when len == (size_t)-1. */
static int append_text(const tokenizer *tok, const char *text, size_t len, int allow_special, chat_ids *out,
                       char *err, size_t errlen) {
    if (len == (size_t)-1) len = strlen(text);
    int32_t *ids = NULL;
    size_t n = 0;
    char e[256];
    int rc = tokenizer_encode(tok, text, len, allow_special, &ids, &n, e, sizeof e);
    if (rc == TOK_ENOMEM) {
        free(ids);
        snprintf(err, errlen, "out of memory encoding a chat message");
        return CHAT_ENOMEM;
    }
    if (rc != TOK_OK) {
        free(ids);
        snprintf(err, errlen, "%s", e);
        return CHAT_EINPUT;
    }
    rc = chat_ids_append(out, ids, n);
    free(ids);
    if (rc) snprintf(err, errlen, "out of memory for chat ids");
    return rc;
}

static int check_template(const tokenizer *tok, chat_template t, char *err, size_t errlen) {
    chat_template got;
    if (t == CHAT_TEMPLATE_AUTO) {
        snprintf(err, errlen, "resolve the chat template first (chat_template_resolve)");
        return CHAT_EINPUT;
    }
    return chat_template_resolve(tok, t, &got, err, errlen);
}

int chat_render_turn(const tokenizer *tok, chat_template t, const char *role, const char *text, size_t len,
                     chat_ids *out, char *err, size_t errlen) {
    int rc = check_template(tok, t, err, errlen);
    if (rc) return rc;
    if (!role || !role_ok(role)) {
        snprintf(err, errlen, "chat role '%s' is not 1..32 characters of [A-Za-z0-9_.-]", role ? role : "(null)");
        return CHAT_EINPUT;
    }
    char head[128];
    const char *tail;
    if (t == CHAT_TEMPLATE_K3) {
        snprintf(head, sizeof head, "<|open|>message role=\"%s\"<|sep|>", role);
        tail = "<|close|>message<|sep|><|end_of_msg|>";
    } else {
        if (!strcmp(role, "user")) snprintf(head, sizeof head, "<|im_user|>user<|im_middle|>");
        else if (!strcmp(role, "assistant")) snprintf(head, sizeof head, "<|im_assistant|>assistant<|im_middle|>");
        else snprintf(head, sizeof head, "<|im_system|>%s<|im_middle|>", role);
        tail = "<|im_end|>";
    }
    size_t n0 = out->n;
    if ((rc = append_text(tok, head, (size_t)-1, 1, out, err, errlen)) ||
        (rc = append_text(tok, text ? text : "", text ? len : 0, 0, out, err, errlen)) ||
        (rc = append_text(tok, tail, (size_t)-1, 1, out, err, errlen))) {
        out->n = n0;
        return rc;
    }
    return CHAT_OK;
}

int chat_render_generation_prompt(const tokenizer *tok, chat_template t, int thinking, chat_ids *out, char *err,
                                  size_t errlen) {
    int rc = check_template(tok, t, err, errlen);
    if (rc) return rc;
    const char *s = t == CHAT_TEMPLATE_K2 ? "<|im_assistant|>assistant<|im_middle|>"
                    : thinking            ? "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>"
                                          : "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>";
    size_t n0 = out->n;
    if ((rc = append_text(tok, s, (size_t)-1, 1, out, err, errlen))) out->n = n0;
    return rc;
}

int32_t chat_end_id(const tokenizer *tok, chat_template t) {
    if (t == CHAT_TEMPLATE_K3) return tokenizer_special_id(tok, "<|end_of_msg|>");
    if (t == CHAT_TEMPLATE_K2) return tokenizer_special_id(tok, "<|im_end|>");
    return -1;
}

int chat_stop_ids(const tokenizer *tok, chat_template t, const int32_t *extra, size_t n_extra, int32_t **ids,
                  size_t *n, char *err, size_t errlen) {
    *ids = NULL;
    *n = 0;
    int rc = check_template(tok, t, err, errlen);
    if (rc) return rc;
    size_t V = tokenizer_vocab_size(tok);
    for (size_t i = 0; i < n_extra; i++)
        if (extra[i] < 0 || (size_t)extra[i] >= V) {
            snprintf(err, errlen, "stop id %d is outside the vocabulary [0, %zu)", extra[i], V);
            return CHAT_EINPUT;
        }
    int32_t *v = malloc((n_extra + 2) * sizeof *v);
    if (!v) {
        snprintf(err, errlen, "out of memory for stop ids");
        return CHAT_ENOMEM;
    }
    size_t m = 0;
    int32_t base[2] = {chat_end_id(tok, t), tokenizer_special_id(tok, "[EOS]")};
    for (size_t i = 0; i < 2 + n_extra; i++) {
        int32_t id = i < 2 ? base[i] : extra[i - 2];
        if (id < 0) continue;
        int dup = 0;
        for (size_t j = 0; j < m; j++) dup |= v[j] == id;
        if (!dup) v[m++] = id;
    }
    *ids = v;
    *n = m;
    return CHAT_OK;
}
