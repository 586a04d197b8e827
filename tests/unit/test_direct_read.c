/* test_direct_read.c - common/direct_read: the one shard reader of the trunk and the expert cache.
 * O_DIRECT windows (aligned and unaligned ranges, an unaligned tail at the end of the file, a file
 * shorter than one block), the fallback when the filesystem refuses O_DIRECT (a ramfs mounted for the test when
 * running as root, else /dev/shm), the
 * fallback when the kernel refuses an alignment (EINVAL, misaligned buffer), short reads of a
 * truncated file and read errors named with file, offset and tensor. The pool (several reads in
 * flight, dr_pool): the same cases through 0, 1 and 4 reader threads with pieces smaller than the
 * reads (many pieces per read, several reads queued at once, urgent ones among them): the same
 * bytes and data pointers as direct_read, the same messages, EINTR and short preads injected
 * through direct_pread_fn, an injected EIO naming its piece's offset. */
#include "common/direct_read.h"
#include "tests/unit/check.h"
#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

static uint8_t byte_at(uint64_t i) { return (uint8_t)(i * 131 + (i >> 9) * 7 + 3); }

static int make_file(const char *path, uint64_t size) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return -1;
    uint8_t *b = malloc(size ? size : 1);
    for (uint64_t i = 0; i < size; i++) b[i] = byte_at(i);
    int ok = write(fd, b, size) == (ssize_t)size;
    free(b);
    close(fd);
    return ok ? 0 : -1;
}

static int same(const uint8_t *d, uint64_t off, uint64_t len) {
    for (uint64_t i = 0; i < len; i++)
        if (d[i] != byte_at(off + i)) return 0;
    return 1;
}

/* One range through the O_DIRECT descriptor (or buffered if dfd < 0); returns direct_read's value. */
static int read_range(const char *path, int dfd, int bfd, uint64_t off, uint64_t len, uint8_t *buf, k3_error *e,
                      int *ok) {
    const uint8_t *d = NULL;
    int refused = 0;
    k3_error_clear(e);
    int rc = direct_read(path, dfd, bfd, off, len, buf, &d, &refused, "tensor 't'", e);
    *ok = rc == 0 && d && same(d, off, len);
    return rc;
}

static void ranges(const char *path, uint64_t size, int want_direct) {
    int dfd = direct_open(path), bfd = open(path, O_RDONLY);
    CHECK(bfd >= 0, "open %s", path);
    if (want_direct == 1) CHECK(dfd >= 0, "O_DIRECT refused on %s (expected to work here)", path);
    if (want_direct == 0) CHECK(dfd < 0, "O_DIRECT accepted on %s (expected the fallback)", path);
    uint8_t *buf;
    if (posix_memalign((void **)&buf, DIRECT_ALIGN, size + 3 * DIRECT_ALIGN)) return;
    k3_error e;
    const uint64_t cases[][2] = {{0, size},          {0, 1},    {1, 1},         {4095, 2},     {4096, 4096},
                                 {100, size - 100},  {size - 1, 1}, {size - 37, 37}, {0, 0},       {4097, 9000 < size - 4097 ? 9000 : size - 4097}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t off = cases[i][0], len = cases[i][1];
        if (off + len > size) continue;
        int ok;
        CHECK(read_range(path, dfd, bfd, off, len, buf, &e, &ok) == 0 && ok, "%s: [%llu, +%llu): %s", path,
              (unsigned long long)off, (unsigned long long)len, e.msg);
        CHECK(direct_window(off, len) <= size + 2 * DIRECT_ALIGN, "window");
    }
    /* past the end: a short read naming the file, offset and tensor */
    int ok;
    CHECK(read_range(path, dfd, bfd, size - 10, 20, buf, &e, &ok) == -1 && e.kind == K3_EFAIL &&
              strstr(e.msg, "short read in shard") && strstr(e.msg, path) && strstr(e.msg, "tensor 't'") &&
              strstr(e.msg, "truncated"),
          "read past the end: %s", e.msg);
    /* the buffered path alone gives the same bytes */
    CHECK(read_range(path, -1, bfd, 3, size - 3, buf, &e, &ok) == 0 && ok, "buffered: %s", e.msg);
    if (dfd >= 0) {
        /* a misaligned buffer: the kernel refuses (EINVAL); without bfd -1 and refused, err untouched */
        const uint8_t *d = NULL;
        int refused = 0;
        k3_error_clear(&e);
        int rc = direct_read(path, dfd, -1, 0, 100, buf + 1, &d, &refused, NULL, &e);
        CHECK(rc == -1 && refused == 1 && !e.set, "EINVAL without bfd: rc %d refused %d '%s'", rc, refused, e.msg);
        refused = 0;
        rc = direct_read(path, dfd, bfd, 5, 100, buf + 1, &d, &refused, NULL, &e);
        CHECK(rc == 0 && refused == 1 && d == buf + 1 && same(d, 5, 100), "EINVAL with bfd: buffered fallback");
        close(dfd);
    }
    /* a read error (a descriptor that is not open) names file and offset */
    int closed = bfd;
    close(bfd);
    CHECK(read_range(path, -1, closed, 4096, 10, buf, &e, &ok) == -1 && strstr(e.msg, "read error in shard") &&
              strstr(e.msg, "offset 4096"),
          "read error: %s", e.msg);
    free(buf);
}

/* ---- the pool ---- */

static atomic_int inject_mode; /* 0 none, 1 EINTR and short reads, 2 EIO at eio_at */
static atomic_int inject_count;
static _Atomic long long eio_at;

static ssize_t flaky_pread(int fd, void *buf, size_t n, off_t off) {
    int mode = atomic_load(&inject_mode), c = atomic_fetch_add(&inject_count, 1);
    if (mode == 1) {
        if (c % 3 == 0) { errno = EINTR; return -1; }
        if (c % 3 == 1 && n >= 2 * DIRECT_ALIGN) n = n / 2 / DIRECT_ALIGN * DIRECT_ALIGN; /* a short (aligned) read */
    }
    if (mode == 2 && off <= (off_t)atomic_load(&eio_at) && (long long)(off + (off_t)n) > atomic_load(&eio_at)) {
        errno = EIO;
        return -1;
    }
    return pread(fd, buf, n, off);
}

/* Reads several ranges of path through a pool (all in flight together, every other one urgent),
 * compares each with direct_read of the same range. */
static void pool_ranges(const char *path, uint64_t size, int threads, uint64_t piece, int mode) {
    int dfd = direct_open(path), bfd = open(path, O_RDONLY);
    CHECK(bfd >= 0, "open %s", path);
    k3_error e = {0};
    dr_pool *p = dr_pool_create(threads, piece, &e);
    CHECK(p != NULL, "pool: %s", e.msg);
    if (!p) { close(bfd); if (dfd >= 0) close(dfd); return; }
    CHECK(dr_pool_threads(p) == threads, "threads %d", dr_pool_threads(p));
    uint64_t cases[][2] = {{0, size}, {1, size - 1}, {4095, 2}, {4096, 3 * 4096}, {100, size - 100},
                           {size - 37, 37}, {0, 0}, {5000, size > 5011 ? size - 5000 - 11 : 0}};
    enum { NC = sizeof cases / sizeof cases[0] };
    for (int i = 0; i < NC; i++)
        if (cases[i][0] + cases[i][1] > size) cases[i][0] = cases[i][1] = 0; /* does not fit this file */
    for (int pass = 0; pass < 2; pass++) { /* pass 0: O_DIRECT when available; pass 1: buffered */
        dr_read rd[NC];
        uint8_t *buf[NC];
        for (int i = 0; i < NC; i++) {
            if (posix_memalign((void **)&buf[i], DIRECT_ALIGN, size + 3 * DIRECT_ALIGN)) buf[i] = NULL;
            rd[i] = (dr_read){.path = path, .dfd = pass ? -1 : dfd, .bfd = bfd, .off = cases[i][0], .len = cases[i][1],
                              .buf = buf[i], .what = "tensor 't'"};
        }
        atomic_store(&inject_mode, mode);
        for (int i = 0; i < NC; i++) dr_submit(p, &rd[i], i % 2);
        for (int i = 0; i < NC; i++) {
            int rc = dr_wait(p, &rd[i]);
            CHECK(dr_poll(p, &rd[i]) == 1, "done after wait");
            CHECK(rc == 0 && rd[i].data && same(rd[i].data, cases[i][0], cases[i][1]),
                  "%s threads %d piece %llu pass %d mode %d: [%llu, +%llu): rc %d %s", path, threads,
                  (unsigned long long)piece, pass, mode, (unsigned long long)cases[i][0], (unsigned long long)cases[i][1], rc,
                  rd[i].err.msg);
            atomic_store(&inject_mode, 0);
            const uint8_t *d = NULL;
            k3_error e2 = {0};
            uint8_t *b2;
            if (!posix_memalign((void **)&b2, DIRECT_ALIGN, size + 3 * DIRECT_ALIGN)) {
                direct_read(path, pass ? -1 : dfd, bfd, cases[i][0], cases[i][1], b2, &d, NULL, NULL, &e2);
                CHECK(rc != 0 || (d && rd[i].data - rd[i].buf == d - b2), "the same data offset as direct_read");
                free(b2);
            }
            atomic_store(&inject_mode, mode);
        }
        atomic_store(&inject_mode, 0);
        /* past the end: the same short-read message as direct_read */
        dr_read r = {.path = path, .dfd = pass ? -1 : dfd, .bfd = bfd, .off = size - 10, .len = 20, .buf = buf[0], .what = "tensor 't'"};
        dr_submit(p, &r, 0);
        CHECK(dr_wait(p, &r) == -1 && r.err.kind == K3_EFAIL && strstr(r.err.msg, "short read in shard") &&
                  strstr(r.err.msg, path) && strstr(r.err.msg, "tensor 't'") && strstr(r.err.msg, "truncated"),
              "pool read past the end: %s", r.err.msg);
        const uint8_t *d = NULL;
        k3_error e2 = {0};
        direct_read(path, pass ? -1 : dfd, bfd, size - 10, 20, buf[1], &d, NULL, "tensor 't'", &e2);
        CHECK(!strcmp(e2.msg, r.err.msg), "same message: '%s' vs '%s'", r.err.msg, e2.msg);
        /* an I/O error in one piece names the piece's offset */
        if (size > 2 * piece + 1) {
            atomic_store(&eio_at, (long long)piece + 1);
            atomic_store(&inject_mode, 2);
            r = (dr_read){.path = path, .dfd = pass ? -1 : dfd, .bfd = bfd, .off = 0, .len = size, .buf = buf[0], .what = "tensor 't'"};
            dr_submit(p, &r, 1);
            char want[64];
            snprintf(want, sizeof want, "at offset %llu ", (unsigned long long)piece);
            CHECK(dr_wait(p, &r) == -1 && strstr(r.err.msg, "read error in shard") && strstr(r.err.msg, want) &&
                      strstr(r.err.msg, "Input/output error"),
                  "EIO in a piece: %s", r.err.msg);
            atomic_store(&inject_mode, 0);
        }
        for (int i = 0; i < NC; i++) free(buf[i]);
        if (dfd < 0) break;
    }
    if (dfd >= 0) {
        /* a misaligned buffer: EINVAL on the O_DIRECT pieces -> the buffered fallback, as direct_read */
        uint8_t *buf;
        if (!posix_memalign((void **)&buf, DIRECT_ALIGN, size + 3 * DIRECT_ALIGN)) {
            dr_read r = {.path = path, .dfd = dfd, .bfd = bfd, .off = 5, .len = 100, .buf = buf + 1};
            dr_submit(p, &r, 0);
            CHECK(dr_wait(p, &r) == 0 && r.direct_refused == 1 && r.data == buf + 1 && same(r.data, 5, 100), "pool EINVAL with bfd");
            r = (dr_read){.path = path, .dfd = dfd, .bfd = -1, .off = 5, .len = 100, .buf = buf + 1};
            dr_submit(p, &r, 0);
            CHECK(dr_wait(p, &r) == -1 && r.direct_refused == 1 && !r.err.set, "pool EINVAL without bfd: '%s'", r.err.msg);
            free(buf);
        }
        close(dfd);
    }
    dr_pool_free(p);
    close(bfd);
}

static void pool_cases(const char *path, uint64_t size) {
    const int threads[] = {0, 1, 4};
    for (int t = 0; t < 3; t++)
        for (int mode = 0; mode < 2; mode++) {
            pool_ranges(path, size, threads[t], 4096, mode);
            pool_ranges(path, size, threads[t], 8192, mode);
            pool_ranges(path, size, threads[t], DR_PIECE_DEFAULT, mode);
        }
}

int main(void) {
    const char *tmp = getenv("K3_TEST_TMP");
    char dir[512], p1[600], p2[600], p3[700];
    snprintf(dir, sizeof dir, "%s/direct_read.XXXXXX", tmp && *tmp ? tmp : "/var/tmp");
    if (!mkdtemp(dir)) { printf("mkdtemp %s failed\n", dir); return 1; }
    snprintf(p1, sizeof p1, "%s/big.bin", dir);
    snprintf(p2, sizeof p2, "%s/short.bin", dir);
    CHECK(make_file(p1, 3 * 4096 + 123) == 0, "write %s", p1);
    CHECK(make_file(p2, 1000) == 0, "write %s", p2);
    int fd = direct_open(p1);
    int disk_direct = fd >= 0;
    if (fd >= 0) close(fd);
    else printf("note: %s refuses O_DIRECT; the disk cases run buffered\n", dir);
    ranges(p1, 3 * 4096 + 123, disk_direct); /* unaligned tail at the end of the file */
    ranges(p2, 1000, disk_direct);           /* shorter than one block */
    direct_pread_fn = flaky_pread;           /* EINTR, short reads and EIO can be injected from here on */
    pool_cases(p1, 3 * 4096 + 123);
    pool_cases(p2, 1000);
    {   /* many reads of a larger file in flight at once through 4 threads */
        char p4[700];
        snprintf(p4, sizeof p4, "%s/large.bin", dir);
        CHECK(make_file(p4, 1 << 20) == 0, "write %s", p4);
        pool_cases(p4, 1 << 20);
        unlink(p4);
    }
    /* a filesystem that refuses O_DIRECT: ramfs (mounted here when we may), else /dev/shm (tmpfs
     * refuses it before Linux 6.6; later kernels accept it, and the case runs as it comes) */
    char mnt[600];
    snprintf(mnt, sizeof mnt, "%s/ramfs", dir);
    int mounted = mkdir(mnt, 0700) == 0 && mount("ramfs", mnt, "ramfs", 0, NULL) == 0;
    if (mounted) snprintf(p3, sizeof p3, "%s/nodirect.bin", mnt);
    else snprintf(p3, sizeof p3, "/dev/shm/k3_direct_read_%d.bin", (int)getpid());
    if (make_file(p3, 2 * 4096 + 5) == 0) {
        int d3 = direct_open(p3);
        if (d3 >= 0) close(d3);
        printf("%s: O_DIRECT %s\n", mounted ? "ramfs" : "/dev/shm", d3 >= 0 ? "accepted (kernel >= 6.6 tmpfs)" : "refused: buffered fallback");
        ranges(p3, 2 * 4096 + 5, mounted ? 0 : -1);
        unlink(p3);
    } else printf("note: no ramfs or /dev/shm here; the no-O_DIRECT case is skipped\n");
    if (mounted) umount2(mnt, MNT_DETACH);
    rmdir(mnt);
    unlink(p1);
    unlink(p2);
    rmdir(dir);
    return check_report("test_direct_read");
}
