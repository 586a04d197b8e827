/* fuzz_dir.h - a private directory for the harnesses whose parser reads files by name
 * (fuzz_tokenizer, fuzz_checkpoint): fuzz_dir_make creates it once under TMPDIR (else /tmp) and
 * removes it, with the files written through fuzz_dir_write, at exit (libFuzzer ends with exit()).
 * Any failure aborts (a harness that cannot write its input finds nothing). One directory per
 * process; the harness's only state besides its own. */
#ifndef K3_FUZZ_DIR_H
#define K3_FUZZ_DIR_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FUZZ_DIR_MAX_FILES 8
static char fuzz_dir[256];
static char fuzz_dir_files[FUZZ_DIR_MAX_FILES][64];
static size_t fuzz_dir_n;

static void fuzz_dir_remove(void) {
    char path[340];
    for (size_t i = 0; i < fuzz_dir_n; i++) {
        snprintf(path, sizeof path, "%s/%s", fuzz_dir, fuzz_dir_files[i]);
        unlink(path);
    }
    rmdir(fuzz_dir);
}

/* the directory's path, made on the first call */
static const char *fuzz_dir_make(const char *name) {
    if (fuzz_dir[0]) return fuzz_dir;
    const char *tmp = getenv("TMPDIR");
    snprintf(fuzz_dir, sizeof fuzz_dir, "%s/%s.XXXXXX", tmp && *tmp ? tmp : "/tmp", name);
    if (!mkdtemp(fuzz_dir)) abort();
    atexit(fuzz_dir_remove);
    return fuzz_dir;
}

/* writes n bytes as the directory's file `name` (remembered for the removal) */
static void fuzz_dir_write(const char *name, const void *p, size_t n) {
    size_t i = 0;
    while (i < fuzz_dir_n && strcmp(fuzz_dir_files[i], name)) i++;
    if (i == fuzz_dir_n) {
        if (fuzz_dir_n == FUZZ_DIR_MAX_FILES || strlen(name) >= sizeof fuzz_dir_files[0]) abort();
        strcpy(fuzz_dir_files[fuzz_dir_n++], name);
    }
    char path[340];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (n && fwrite(p, 1, n, f) != n) abort();
    if (fclose(f)) abort();
}

#endif
