/* fuzz_openai.c - libFuzzer harness for the server's request parser: api_parse (validation, the
 * K3 XTML rendering of messages/tools/tool results, prompt encoding) on arbitrary bodies, for both
 * /v1/chat/completions and /v1/completions, with the m13 tokenizer (K3 specials). The first byte
 * picks the endpoint. Every input must either be accepted (then the request is freed) or refused
 * with a message; never a crash, a leak or undefined behaviour. */
#include "coordinator/openai_api.h"

#include <stdio.h>
#include <stdlib.h>

static tokenizer *tok;

/* sampler.c refers to it for greedy picks, which the parser never makes (generate.c would pull in
 * the whole engine) */
int32_t argmax_logits(const float *logits, size_t n);
int32_t argmax_logits(const float *logits, size_t n) {
    (void)logits;
    (void)n;
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tok) {
        k3_error err = {0};
        tok = tokenizer_load("tests/models/m13", &err);
        if (!tok) {
            fprintf(stderr, "fuzz_openai: %s (run from the repository root)\n", err.msg);
            abort();
        }
    }
    if (size < 1) return 0;
    api_context c = {tok, CHAT_TEMPLATE_K3, tokenizer_vocab_size(tok), 2048, 16, data[0] & 2};
    api_request r;
    char err[512], param[128];
    int rc = api_parse(&c, data[0] & 1, (const char *)data + 1, size - 1, &r, err, sizeof err, param, sizeof param);
    if (rc == 0) {
        if (r.prompt.n == 0 || r.max_tokens == 0 || r.prompt.n + r.max_tokens > c.max_context) abort();
        api_request_free(&r);
    } else if (!err[0]) abort(); /* a refusal always says why */
    return 0;
}
