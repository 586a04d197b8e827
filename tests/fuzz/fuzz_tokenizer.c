/* fuzz_tokenizer.c - libFuzzer harness for the tokenizer's loader and encoder
 * (coordinator/tokenizer: tiktoken.model ranks, tokenizer_config.json specials, the
 * pre-tokenizer and rank BPE). A model directory is untrusted: its tokenizer files are parsed at
 * every start, and whatever vocabulary they give, the encoder must stay in bounds and exact.
 *
 * Input: [2 bytes little-endian: length A][A bytes: tiktoken.model][2 bytes: length B][B bytes:
 * tokenizer_config.json][the rest: a text]. Lengths past the input are clamped. The two files are
 * written into a private directory (under TMPDIR, else /tmp) and tokenizer_load reads them.
 *
 * A refusal must carry a message and free everything. An accepted tokenizer must keep its
 * promises: vocab = base + specials, every id's bytes readable and every id past the vocabulary
 * refused; every special id found again by its text; and for the text (its well-formed UTF-8
 * prefix) the ids of tokenizer_encode without specials are base ids whose bytes concatenate to
 * the text exactly (tokenizer_decode too), and with specials allowed the bytes concatenate to the
 * text as well. Never a crash, a leak or undefined behaviour. FUZZ_TOKENIZER_SAY=1 prints what
 * each input gave (build/fuzz/fuzz_tokenizer FILE: is a seed accepted?). */
#include "coordinator/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/fuzz/fuzz_dir.h"


static size_t take(const uint8_t **p, size_t *left, const uint8_t **out) {
    size_t n = 0;
    if (*left >= 2) {
        n = (size_t)(*p)[0] | ((size_t)(*p)[1] << 8);
        *p += 2, *left -= 2;
    } else {
        *p += *left, *left = 0;
    }
    if (n > *left) n = *left;
    *out = *p;
    *p += n, *left -= n;
    return n;
}

/* the ids' bytes, concatenated, equal text[0..n) */
static void check_bytes(const tokenizer *t, const int32_t *ids, size_t m, const char *text, size_t n, int base_only) {
    size_t at = 0;
    for (size_t i = 0; i < m; i++) {
        const char *b;
        size_t bn;
        if (tokenizer_token_bytes(t, ids[i], &b, &bn)) abort();
        if (base_only && (size_t)ids[i] >= tokenizer_n_base(t)) abort();
        if (bn == 0 || bn > n - at || memcmp(b, text + at, bn)) abort();
        at += bn;
    }
    if (at != n) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *dir = fuzz_dir_make("fuzz_tokenizer");
    const uint8_t *p = data, *model, *config;
    size_t left = size;
    const size_t nm = take(&p, &left, &model), nc = take(&p, &left, &config);
    const char *text = (const char *)p;
    size_t nt = utf8_valid_prefix(text, left);
    fuzz_dir_write("tiktoken.model", model, nm);
    fuzz_dir_write("tokenizer_config.json", config, nc);

    k3_error err = {0};
    tokenizer *t = tokenizer_load(dir, &err);
    if (!t) {
        if (getenv("FUZZ_TOKENIZER_SAY")) fprintf(stderr, "refused: %s\n", err.msg);
        if (!err.msg[0]) abort(); /* a refusal always says why */
        return 0;
    }
    const size_t nb = tokenizer_n_base(t), ns = tokenizer_n_special(t), nv = tokenizer_vocab_size(t);
    if (getenv("FUZZ_TOKENIZER_SAY")) fprintf(stderr, "accepted: %zu base + %zu special ids\n", nb, ns);
    if (nv != nb + ns || nb == 0) abort();
    for (size_t id = 0; id < nv; id++) {
        const char *b;
        size_t bn;
        if (tokenizer_token_bytes(t, (int32_t)id, &b, &bn) || bn == 0) abort();
        if ((id >= nb) != (tokenizer_is_special(t, (int32_t)id) != 0)) abort();
        if (id >= nb) {
            char name[4096];
            if (bn >= sizeof name) continue;
            memcpy(name, b, bn);
            name[bn] = 0;
            if (tokenizer_special_id(t, name) != (int)id) abort();
        }
    }
    {
        const char *b;
        size_t bn;
        if (!tokenizer_token_bytes(t, (int32_t)nv, &b, &bn) || !tokenizer_token_bytes(t, -1, &b, &bn)) abort();
    }
    int32_t *ids = NULL;
    size_t m = 0;
    if (tokenizer_encode(t, text, nt, 0, &ids, &m, &err)) abort(); /* well-formed text is always encodable */
    check_bytes(t, ids, m, text, nt, 1);
    char *out = NULL;
    size_t on = 0;
    if (tokenizer_decode(t, ids, m, &out, &on, &err)) abort();
    if (on != nt || memcmp(out, text, nt) || out[on]) abort();
    free(out);
    free(ids);
    ids = NULL;
    if (tokenizer_encode(t, text, nt, 1, &ids, &m, &err)) abort();
    check_bytes(t, ids, m, text, nt, 0);
    free(ids);
    tokenizer_free(t);
    return 0;
}
