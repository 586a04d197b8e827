/* Job: the Kimi (K2 / Kimi Linear / K3) tokenizer: tiktoken-style rank BPE over raw bytes with
 * Kimi's pre-tokenisation pattern and special ids after the ranks (spec: shared/spec/TOKENIZER.md,
 * design notes: docs/TOKENIZER.md).
 *
 * Contract
 * - tokenizer_load(dir) reads DIR/tiktoken.model (lines "base64(token bytes) rank"; ranks must be
 *   exactly 0..N-1, every single byte must be a token; empty lines are skipped) and
 *   DIR/tokenizer_config.json (added_tokens_decoder: "id" -> {"content": ...}). N = n_base. Special
 *   ids are n_base + k for k in 0..n_special-1, n_special = 256 (more if the config names ids past
 *   n_base + 255, up to 1024); unnamed slots are "<|reserved_token_<id>|>" and are still specials.
 *   On failure it returns NULL and writes a message naming the file (and line) into err.
 * - A loaded tokenizer is immutable: every function below may be called from several threads at once.
 * - tokenizer_encode: text must be valid UTF-8 (NUL bytes allowed, len counts bytes). Invalid UTF-8 is
 *   refused (K3_EINPUT) with "invalid UTF-8 at byte offset N" (N = offset of the first byte of the
 *   first ill-formed sequence, counted from text; truncated sequences at the end are ill-formed too).
 *   Nothing is guessed or replaced. The text is cut like Kimi's Python wrapper (400,000-code-point
 *   slices, then runs of more than 25,000 code points of the same Python-isspace class); each piece is
 *   encoded on its own. With allow_special, exact occurrences of special-token texts inside a piece
 *   become their ids (leftmost first, longest on a tie) and the pattern never runs across them;
 *   without it special texts are plain text. Each segment is split with the Kimi pattern (Unicode
 *   16.0 classes, no regex engine) and each piece is rank-BPE encoded with tiktoken's semantics.
 *   *ids is malloc'd (free() it; non-NULL even when *n == 0).
 * - tokenizer_decode concatenates token bytes (a special decodes to its text); ids out of range are
 *   refused (K3_EINPUT). The result is raw bytes: it may be invalid UTF-8 if the ids are; use a
 *   utf8_stream to print by complete code points.
 * - Errors (common/error.h): 0 on success, -1 (NULL for tokenizer_load) with err filled: kind
 *   K3_EINPUT for bad input (a malformed tokenizer file, invalid UTF-8, an id out of range),
 *   K3_ENOMEM when out of memory. err may be NULL. */
#ifndef K3_TOKENIZER_H
#define K3_TOKENIZER_H

#include "common/error.h"
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>


/* Kimi wrapper limits (tokenization_kimi.py). */
#define TOK_MAX_ENCODE_CHARS 400000
#define TOK_MAX_SAME_CLASS_RUN 25000

typedef struct tokenizer tokenizer;

tokenizer *tokenizer_load(const char *dir, k3_error *err);
void tokenizer_free(tokenizer *t);

size_t tokenizer_vocab_size(const tokenizer *t); /* n_base + n_special */
size_t tokenizer_n_base(const tokenizer *t);
size_t tokenizer_n_special(const tokenizer *t);

/* Id of the special token whose text is content, or -1. */
int tokenizer_special_id(const tokenizer *t, const char *content);
/* 1 if id is a special id, else 0. */
int tokenizer_is_special(const tokenizer *t, int32_t id);

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int allow_special,
                     int32_t **ids, size_t *n, k3_error *err);

/* Bytes of one token (not NUL-terminated; valid while t lives). 0, or -1 if id is out of range. */
int tokenizer_token_bytes(const tokenizer *t, int32_t id, const char **bytes, size_t *len);

/* Concatenated token bytes into a malloc'd buffer (*out NUL-terminated for convenience, *out_len
 * excludes the NUL). */
int tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *out_len,
                     k3_error *err);

/* ---- UTF-8 helpers ---- */

/* len if s[0..len) is well-formed UTF-8 (Unicode table 3-7: no overlongs, no surrogates, <= U+10FFFF),
 * else the offset of the first byte of the first ill-formed sequence. */
size_t utf8_valid_prefix(const char *s, size_t len);

/* Streaming output by complete code points. Feed token bytes as they come; the stream writes only
 * complete, well-formed code points and holds back an incomplete tail (at most 3 bytes) until the
 * next push or the flush. A sequence that can no longer become well-formed is written as U+FFFD
 * (replace_invalid != 0, one U+FFFD per maximal ill-formed subpart) or passed through as the raw
 * bytes (replace_invalid == 0); either way never half a code point of a valid sequence. */
typedef struct utf8_stream {
    unsigned char pend[4];
    unsigned npend, need; /* bytes held, total length of the sequence they start */
    int replace_invalid;
} utf8_stream;

/* Worst-case bytes written by one push of len bytes (or by a flush with len = 0). */
#define UTF8_STREAM_MAX_OUT(len) (3 * ((size_t)(len) + 4))

void utf8_stream_init(utf8_stream *s, int replace_invalid);
size_t utf8_stream_push(utf8_stream *s, const void *in, size_t len, char *out);
size_t utf8_stream_flush(utf8_stream *s, char *out);

/* Token streaming (every caller that prints generated text: --prompt runs, --chat): writes the
 * bytes of token id through s to out and flushes out; an id the tokenizer does not know writes
 * nothing. No allocation. */
void utf8_stream_write_token(utf8_stream *s, const tokenizer *tok, int32_t id, FILE *out);
/* Writes the held tail (utf8_stream_flush) to out and flushes out. */
void utf8_stream_write_end(utf8_stream *s, FILE *out);

/* ---- internals exposed for tests and tools ---- */

/* Splits valid UTF-8 text with the Kimi pattern as one segment (no specials, no chunking). *ends gets
 * the byte offset just past each piece (malloc'd). 0, or -1 (invalid UTF-8: K3_EINPUT;
 * K3_ENOMEM). */
int tokenizer_pretokenize(const char *text, size_t len, size_t **ends, size_t *n, k3_error *err);

/* Rank BPE of one piece of bytes (len >= 1). method: 0 automatic, 1 the quadratic tiktoken scan,
 * 2 the heap version used for long pieces (both give the same ids). *ids malloc'd. 0, or -1
 * (len 0 or out of memory). */
int tokenizer_bpe_piece(const tokenizer *t, const void *bytes, size_t len, int method, int32_t **ids,
                        size_t *n);

#endif
