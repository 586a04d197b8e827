/* test_direct_read.c - common/direct_read: the one shard reader of the trunk and the expert cache.
 * O_DIRECT windows (aligned and unaligned ranges, an unaligned tail at the end of the file, a file
 * shorter than one block), the fallback when the filesystem refuses O_DIRECT (a ramfs mounted for the test when
 * running as root, else /dev/shm), the
 * fallback when the kernel refuses an alignment (EINVAL, misaligned buffer), short reads of a
 * truncated file and read errors named with file, offset and tensor. */
#include "common/direct_read.h"
#include "tests/unit/check.h"
#include <errno.h>
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
