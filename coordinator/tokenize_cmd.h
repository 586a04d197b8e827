/* Job: the tokenizer CLI behind `bin/k3 --tok DIR --encode FILE | --decode FILE [--no-special]`.
 * Contract:
 *   encode: reads FILE (UTF-8 text), prints its token ids space-separated on one line (then '\n') on
 *           stdout. Special-token texts become special ids unless no_special (then they are plain
 *           text, like Kimi's disallowed_special=()). An empty file prints an empty line.
 *   decode: reads FILE holding token ids (decimal, separated by any whitespace, e.g. an encode line)
 *           and writes the decoded bytes to stdout, unmodified (no newline added).
 * Exactly one of encode_file / decode_file must be non-NULL. Returns the process exit code:
 *   0 ok; 2 usage error or refused input (FILE unreadable, invalid UTF-8 with its byte offset, a
 *   malformed or out-of-range id, an unusable tokenizer directory); 1 failure (out of memory,
 *   stdout write error). Errors go to stderr (k3_exit_status of the one k3_error). */
#ifndef K3_TOKENIZE_CMD_H
#define K3_TOKENIZE_CMD_H

int tokenize_command(const char *tok_dir, const char *encode_file, const char *decode_file, int no_special);

#endif
