/* outputs.c - output paths and stdout checked (see outputs.h). */
#include "coordinator/outputs.h"
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int outputs_init(void) {
    signal(SIGXFSZ, SIG_IGN);
    int stdout_closed = 0;
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
        if (fd == 1) stdout_closed = 1;
        int nfd = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY); /* lowest free descriptor: fd */
        if (nfd >= 0 && nfd != fd) close(nfd);
    }
    if (stdout_closed) {
        fprintf(stderr, "k3: stdout is closed: there is nowhere to write the results\n");
        return -1;
    }
    return 0;
}

int outputs_check_path(const char *flag, const char *path, k3_error *err) {
    if (!path) return 0;
    if (!*path) return k3_fail(err, "%s: empty path", flag);
    struct stat st;
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) return k3_fail(err, "%s %s: is a directory", flag, path);
        if (access(path, W_OK) != 0) return k3_fail(err, "%s %s: not writable: %s", flag, path, strerror(errno));
        return 0;
    }
    if (errno != ENOENT) return k3_fail(err, "%s %s: %s", flag, path, strerror(errno));
    /* a new file: its directory must exist and be writable */
    char *dir = strdup(path);
    if (!dir) return k3_fail(err, "out of memory");
    char *slash = strrchr(dir, '/');
    const char *d = ".";
    if (slash == dir) d = "/";
    else if (slash) { *slash = 0; d = dir; }
    int rc = 0;
    if (stat(d, &st) != 0) rc = k3_fail(err, "%s %s: directory %s: %s", flag, path, d, strerror(errno));
    else if (!S_ISDIR(st.st_mode)) rc = k3_fail(err, "%s %s: %s is not a directory", flag, path, d);
    else if (access(d, W_OK | X_OK) != 0) rc = k3_fail(err, "%s %s: cannot create files in %s: %s", flag, path, d, strerror(errno));
    free(dir);
    return rc;
}

int outputs_check_paths(const char *json_path, const char *logits_path, const char *trace_path, k3_error *err) {
    return outputs_check_path("--json", json_path, err) || outputs_check_path("--dump-logits", logits_path, err) ||
           outputs_check_path("--dump-expert-trace", trace_path, err);
}

int outputs_write_file(const char *path, const void *data, size_t len, k3_error *err) {
    FILE *f = fopen(path, "wb");
    if (!f) return k3_fail(err, "cannot write %s: %s", path, strerror(errno));
    size_t w = len ? fwrite(data, 1, len, f) : 0;
    int e = w == len && fflush(f) == 0 ? 0 : errno;
    if (fclose(f) != 0 && !e) e = errno;
    if (e || w != len) return k3_fail(err, "cannot write %s: %s", path, strerror(e ? e : EIO));
    return 0;
}

int outputs_finish(int status) {
    int bad = fflush(stdout) != 0 || ferror(stdout);
    int e = errno;
    if (fclose(stdout) != 0 && !bad) { bad = 1; e = errno; }
    if (!bad) return status;
    fprintf(stderr, "k3: cannot write to stdout: %s: results lost\n", strerror(e ? e : EIO));
    return status == 0 ? 1 : status;
}
