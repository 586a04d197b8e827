/* Job: the tokenizer CLI (encode a file to ids, decode ids to bytes); contract in tokenize_cmd.h.
 * Every helper returns 0 or -1 with a k3_error; tokenize_command alone maps it to an exit status. */
#include "coordinator/tokenize_cmd.h"
#include "coordinator/tokenizer.h"
#include "common/file_read.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *slurp(const char *path, size_t *len, k3_error *err)
{
    k3_error e = {0};
    char *buf = file_read_stream(path, (size_t)1 << 31, len, &e); /* a pipe is fine, a directory is not */
    if (!buf) k3_refuse(err, "%s", e.msg); /* an unreadable input file is a refused input */
    return buf;
}

static int write_out(const char *p, size_t n, k3_error *err)
{
    if ((n && fwrite(p, 1, n, stdout) != n) || fflush(stdout)) return k3_fail(err, "writing stdout: %s", strerror(errno));
    return 0;
}

static int do_encode(const tokenizer *t, const char *path, int no_special, k3_error *err)
{
    size_t len;
    char *text = slurp(path, &len, err);
    if (!text) return -1;
    int32_t *ids;
    size_t n;
    k3_error te = {0};
    int rc = tokenizer_encode(t, text, len, !no_special, &ids, &n, &te);
    free(text);
    if (rc) return k3_fail_as(err, te.kind, "%s: %s", path, te.msg);
    char *out = malloc(n * 12 + 2);
    if (!out) {
        free(ids);
        return k3_nomem(err, "out of memory for %zu ids", n);
    }
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        char tmp[16];
        int l = snprintf(tmp, sizeof tmp, "%s%ld", i ? " " : "", (long)ids[i]);
        memcpy(out + w, tmp, (size_t)l);
        w += (size_t)l;
    }
    out[w++] = '\n';
    free(ids);
    rc = write_out(out, w, err);
    free(out);
    return rc;
}

static int do_decode(const tokenizer *t, const char *path, k3_error *err)
{
    size_t len;
    char *text = slurp(path, &len, err);
    if (!text) return -1;
    int32_t *ids = malloc((len / 2 + 1) * sizeof *ids);
    if (!ids) {
        free(text);
        return k3_nomem(err, "out of memory for the ids of %s", path);
    }
    size_t n = 0, i = 0;
    int rc = 0;
    while (i < len) {
        char c = text[i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') {
            i++;
            continue;
        }
        size_t st = i;
        int64_t v = 0;
        while (i < len && text[i] >= '0' && text[i] <= '9') {
            if (v <= INT32_MAX) v = v * 10 + (text[i] - '0');
            i++;
        }
        int sep = i == len || text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r' ||
                  text[i] == '\v' || text[i] == '\f';
        if (i == st || !sep || v >= (int64_t)tokenizer_vocab_size(t)) {
            size_t e = i;
            while (e < len && e - st < 24 && text[e] != ' ' && text[e] != '\n') e++;
            rc = k3_refuse(err, "%s: bad token id \"%.*s\" at byte offset %zu (ids are 0..%zu)", path,
                           (int)(e > st ? e - st : 1), text + st, st, tokenizer_vocab_size(t) - 1);
            break;
        }
        ids[n++] = (int32_t)v;
    }
    free(text);
    if (rc) {
        free(ids);
        return rc;
    }
    char *out;
    size_t olen;
    k3_error te = {0};
    rc = tokenizer_decode(t, ids, n, &out, &olen, &te);
    free(ids);
    if (rc) return k3_fail_as(err, te.kind, "%s: %s", path, te.msg);
    rc = write_out(out, olen, err);
    free(out);
    return rc;
}

int tokenize_command(const char *tok_dir, const char *encode_file, const char *decode_file, int no_special)
{
    if (!tok_dir || (!encode_file) == (!decode_file)) {
        fprintf(stderr, "usage: k3 --tok DIR (--encode FILE [--no-special] | --decode FILE)\n");
        return 2;
    }
    k3_error err = {0};
    tokenizer *t = tokenizer_load(tok_dir, &err);
    int rc = !t ? -1 : encode_file ? do_encode(t, encode_file, no_special, &err) : do_decode(t, decode_file, &err);
    tokenizer_free(t);
    if (!rc) return 0;
    fprintf(stderr, "k3: %s\n", err.msg);
    return k3_exit_status(&err);
}
