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
        if (!p) return -1;
        v->ids = p;
        v->cap = cap;
    }
    if (n) memcpy(v->ids + v->n, ids, n * sizeof *ids);
    v->n += n;
    return 0;
}

void chat_ids_free(chat_ids *v) {
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

int chat_template_parse(const char *name, chat_template *t, k3_error *err) {
    if (!strcmp(name, "auto")) *t = CHAT_TEMPLATE_AUTO;
    else if (!strcmp(name, "k3")) *t = CHAT_TEMPLATE_K3;
    else if (!strcmp(name, "k2") || !strcmp(name, "kimi-linear")) *t = CHAT_TEMPLATE_K2;
    else {
        k3_refuse(err, "--template wants auto|k3|k2, got '%s'", name);
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

int chat_template_resolve(const tokenizer *tok, chat_template want, chat_template *got, k3_error *err) {
    chat_template t = want;
    if (t == CHAT_TEMPLATE_AUTO) {
        t = chat_template_detect(tok);
        if (t == CHAT_TEMPLATE_AUTO) {
            k3_refuse(err,
                     "no chat template fits this tokenizer: it names neither <|open|> (K3) nor <|im_user|> (K2)");
            return -1;
        }
    }
    if (t != CHAT_TEMPLATE_K3 && t != CHAT_TEMPLATE_K2) {
        k3_refuse(err, "unknown chat template %d", (int)t);
        return -1;
    }
    const char *const *need = t == CHAT_TEMPLATE_K3 ? K3_SPECIALS : K2_SPECIALS;
    for (int i = 0; need[i]; i++)
        if (tokenizer_special_id(tok, need[i]) < 0) {
            k3_refuse(err, "the %s chat template needs the special token %s, which this tokenizer lacks",
                     chat_template_name(t), need[i]);
            return -1;
        }
    *got = t;
    return 0;
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
                       k3_error *err) {
    if (len == (size_t)-1) len = strlen(text);
    int32_t *ids = NULL;
    size_t n = 0;
    if (tokenizer_encode(tok, text, len, allow_special, &ids, &n, err)) {
        free(ids);
        return -1;
    }
    int rc;
    rc = chat_ids_append(out, ids, n);
    free(ids);
    if (rc) k3_nomem(err, "out of memory for chat ids");
    return rc;
}

static int check_template(const tokenizer *tok, chat_template t, k3_error *err) {
    chat_template got;
    if (t == CHAT_TEMPLATE_AUTO) {
        k3_refuse(err, "resolve the chat template first (chat_template_resolve)");
        return -1;
    }
    return chat_template_resolve(tok, t, &got, err);
}

int chat_render_turn(const tokenizer *tok, chat_template t, const char *role, const char *text, size_t len,
                     chat_ids *out, k3_error *err) {
    int rc = check_template(tok, t, err);
    if (rc) return rc;
    if (!role || !role_ok(role)) {
        k3_refuse(err, "chat role '%s' is not 1..32 characters of [A-Za-z0-9_.-]", role ? role : "(null)");
        return -1;
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
    if ((rc = append_text(tok, head, (size_t)-1, 1, out, err)) ||
        (rc = append_text(tok, text ? text : "", text ? len : 0, 0, out, err)) ||
        (rc = append_text(tok, tail, (size_t)-1, 1, out, err))) {
        out->n = n0;
        return rc;
    }
    return 0;
}

int chat_render_generation_prompt(const tokenizer *tok, chat_template t, int thinking, chat_ids *out, k3_error *err) {
    int rc = check_template(tok, t, err);
    if (rc) return rc;
    const char *s = t == CHAT_TEMPLATE_K2 ? "<|im_assistant|>assistant<|im_middle|>"
                    : thinking            ? "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>"
                                          : "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>";
    size_t n0 = out->n;
    if ((rc = append_text(tok, s, (size_t)-1, 1, out, err))) out->n = n0;
    return rc;
}

int32_t chat_end_id(const tokenizer *tok, chat_template t) {
    if (t == CHAT_TEMPLATE_K3) return tokenizer_special_id(tok, "<|end_of_msg|>");
    if (t == CHAT_TEMPLATE_K2) return tokenizer_special_id(tok, "<|im_end|>");
    return -1;
}

int chat_stop_ids(const tokenizer *tok, chat_template t, const int32_t *extra, size_t n_extra, int32_t **ids,
                  size_t *n, k3_error *err) {
    *ids = NULL;
    *n = 0;
    int rc = check_template(tok, t, err);
    if (rc) return rc;
    size_t V = tokenizer_vocab_size(tok);
    for (size_t i = 0; i < n_extra; i++)
        if (extra[i] < 0 || (size_t)extra[i] >= V) {
            k3_refuse(err, "stop id %d is outside the vocabulary [0, %zu)", extra[i], V);
            return -1;
        }
    int32_t *v = malloc((n_extra + 2) * sizeof *v);
    if (!v) {
        k3_nomem(err, "out of memory for stop ids");
        return -1;
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
    return 0;
}
