/* ring.c - shared-memory rings between coordinator and expert servers (see ring.h). */
#define _GNU_SOURCE
#include "common/ring.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <linux/futex.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define ALIGN_UP(x, a) (((x) + (a)-1) / (a) * (a))
#define CTL_BYTES 4096u

static uint64_t slot_bytes(uint64_t hdr_cap, uint64_t payload_cap) {
    return ALIGN_UP(sizeof(ring_slot_head) + hdr_cap, 64) + ALIGN_UP(payload_cap, 64);
}

static size_t total_bytes(uint32_t n, uint64_t hdr_cap, uint64_t req_cap, uint64_t resp_cap) {
    return CTL_BYTES + (size_t)n * (slot_bytes(hdr_cap, req_cap) + slot_bytes(hdr_cap, resp_cap));
}

static void set_geometry(ring *r, uint32_t n, uint64_t hdr_cap, uint64_t req_cap, uint64_t resp_cap) {
    r->n_slots = n;
    r->hdr_cap = hdr_cap;
    r->req_cap = req_cap;
    r->resp_cap = resp_cap;
    r->req_slot_bytes = slot_bytes(hdr_cap, req_cap);
    r->resp_slot_bytes = slot_bytes(hdr_cap, resp_cap);
}

static int init_ctl(ring *r, k3_error *err) {
    (void)err;
    ring_ctl *c = r->ctl;
    c->magic = RING_MAGIC;
    c->n_slots = r->n_slots;
    c->hdr_cap = r->hdr_cap;
    c->req_payload_cap = r->req_cap;
    c->resp_payload_cap = r->resp_cap;
    c->req_slot_bytes = r->req_slot_bytes;
    c->resp_slot_bytes = r->resp_slot_bytes;
    atomic_store(&c->req_items, 0);
    atomic_store(&c->resp_items, 0);
    atomic_store(&c->heartbeat, 0);
    atomic_store(&c->stat_requests, 0);
    atomic_store(&c->stat_hits, 0);
    atomic_store(&c->stat_misses, 0);
    atomic_store(&c->stat_bytes_read, 0);
    atomic_store(&c->stat_compute_ns, 0);
    atomic_store(&c->stat_wait_ns, 0);
    atomic_store(&c->stat_hint_reads, 0);
    atomic_store(&c->stat_hint_hits, 0);
    atomic_store(&c->stat_hint_wasted, 0);
    atomic_store(&c->preloaded, 0);
    atomic_store(&c->preload_state, 0);
    for (uint32_t i = 0; i < r->n_slots; i++) {
        atomic_store(&ring_req_slot(r, i)->seq, 0);
        atomic_store(&ring_resp_slot(r, i)->seq, 0);
    }
    return 0;
}

int ring_create(ring *r, uint32_t n_slots, uint64_t hdr_cap, uint64_t req_cap, uint64_t resp_cap, k3_error *err) {
    memset(r, 0, sizeof *r);
    r->fd = -1;
    if (n_slots == 0 || n_slots > 64) return k3_fail(err, "ring: bad slot count %u", n_slots);
    char name[96];
    unsigned rnd = 0;
    int fd = -1;
    for (int attempt = 0; attempt < 16 && fd < 0; attempt++) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        rnd = (unsigned)(ts.tv_nsec ^ (ts.tv_sec << 20) ^ ((unsigned)attempt * 2654435761u));
        snprintf(name, sizeof name, "/k3.%d.%08x", (int)getpid(), rnd);
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST) return k3_fail(err, "shm_open %s: %s", name, strerror(errno));
    }
    if (fd < 0) return k3_fail(err, "shm_open: could not find a free name");
    shm_unlink(name); /* the name existed only for this moment; the fd carries the object */
    r->size = total_bytes(n_slots, hdr_cap, req_cap, resp_cap);
    set_geometry(r, n_slots, hdr_cap, req_cap, resp_cap);
    if (ftruncate(fd, (off_t)r->size) != 0) {
        int e = errno;
        close(fd);
        return k3_fail(err, "/dev/shm: cannot size a %zu-byte expert-server ring: %s%s", r->size, strerror(e),
                       e == EFBIG ? " (the file-size limit, ulimit -f, is below it)" : "");
    }
    /* reserve every page now: a sparse ring on a full /dev/shm would SIGBUS on first touch */
    int fe = posix_fallocate(fd, 0, (off_t)r->size);
    if (fe != 0) {
        close(fd);
        return k3_fail(err, "/dev/shm: cannot reserve %zu bytes for an expert-server ring (%s); free space in /dev/shm "
                       "(df /dev/shm) or run with --workers 0", r->size, strerror(fe));
    }
    void *m = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) { close(fd); return k3_fail(err, "mmap of the ring: %s", strerror(errno)); }
    r->fd = fd;
    r->base = m;
    r->ctl = m;
    if (init_ctl(r, err)) { ring_close(r); return -1; }
    return 0;
}

int ring_reset(ring *r, k3_error *err) { return init_ctl(r, err); }

int ring_ctl_intact(const ring *r) {
    const ring_ctl *c = r->ctl;
    return c->magic == RING_MAGIC && c->n_slots == r->n_slots && c->hdr_cap == r->hdr_cap &&
           c->req_payload_cap == r->req_cap && c->resp_payload_cap == r->resp_cap &&
           c->req_slot_bytes == r->req_slot_bytes && c->resp_slot_bytes == r->resp_slot_bytes;
}

int ring_attach(ring *r, int fd, uint64_t hdr_cap, uint64_t req_cap, uint64_t resp_cap, uint32_t n_slots, k3_error *err) {
    memset(r, 0, sizeof *r);
    r->fd = -1;
    struct stat st;
    size_t want = total_bytes(n_slots, hdr_cap, req_cap, resp_cap);
    if (n_slots == 0 || n_slots > 64) return k3_fail(err, "ring: bad slot count %u", n_slots);
    if (fstat(fd, &st) != 0) return k3_fail(err, "ring fd %d: %s", fd, strerror(errno));
    if ((size_t)st.st_size != want)
        return k3_fail(err, "ring fd %d: size %lld, expected %zu", fd, (long long)st.st_size, want);
    void *m = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return k3_fail(err, "mmap of the ring: %s", strerror(errno));
    r->fd = fd;
    r->size = want;
    r->base = m;
    r->ctl = m;
    set_geometry(r, n_slots, hdr_cap, req_cap, resp_cap);
    if (!ring_ctl_intact(r)) {
        ring_close(r);
        return k3_fail(err, "ring: control page does not match the hello message");
    }
    return 0;
}

void ring_close(ring *r) {
    if (r->base) munmap(r->base, r->size);
    if (r->fd >= 0) close(r->fd);
    memset(r, 0, sizeof *r);
    r->fd = -1;
}

/* Addresses come from this side's geometry only. */
ring_slot_head *ring_req_slot(const ring *r, uint64_t seq) {
    return (ring_slot_head *)(r->base + CTL_BYTES + (seq % r->n_slots) * r->req_slot_bytes);
}

ring_slot_head *ring_resp_slot(const ring *r, uint64_t seq) {
    return (ring_slot_head *)(r->base + CTL_BYTES + r->n_slots * r->req_slot_bytes + (seq % r->n_slots) * r->resp_slot_bytes);
}

unsigned char *ring_slot_payload(const ring *r, ring_slot_head *s) {
    return (unsigned char *)s + ALIGN_UP(sizeof(ring_slot_head) + r->hdr_cap, 64);
}

void ring_publish(ring_slot_head *s, uint64_t seq, uint64_t hdr_len, uint64_t payload_len, _Atomic uint32_t *items) {
    s->hdr_len = hdr_len;
    s->payload_len = payload_len;
    atomic_store_explicit(&s->seq, seq, memory_order_release);
    atomic_fetch_add_explicit(items, 1, memory_order_release);
    syscall(SYS_futex, items, FUTEX_WAKE, 1, NULL, NULL, 0);
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int ring_wait(_Atomic uint32_t *items, int timeout_ms) {
    double deadline = mono_s() + timeout_ms * 1e-3;
    for (;;) {
        uint32_t v = atomic_load_explicit(items, memory_order_acquire);
        if (v > 0) {
            if (atomic_compare_exchange_weak_explicit(items, &v, v - 1, memory_order_acquire, memory_order_relaxed)) return 1;
            continue;
        }
        double left = deadline - mono_s();
        if (left <= 0) return 0;
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        long rc = syscall(SYS_futex, items, FUTEX_WAIT, 0, &ts, NULL, 0);
        if (rc != 0 && errno != EAGAIN && errno != EINTR && errno != ETIMEDOUT) return -1;
    }
}

int ring_slot_lengths(const ring *r, ring_slot_head *s, uint64_t want_seq, uint64_t payload_cap, uint64_t *hdr_len,
                      uint64_t *payload_len, k3_error *err) {
    uint64_t seq = atomic_load_explicit(&s->seq, memory_order_acquire);
    if (seq != want_seq) return k3_fail(err, "ring slot carries sequence %llu, expected %llu", (unsigned long long)seq, (unsigned long long)want_seq);
    uint64_t h = s->hdr_len, p = s->payload_len;
    if (h == 0 || h > r->hdr_cap) return k3_fail(err, "ring slot header length %llu is out of range", (unsigned long long)h);
    if (p > payload_cap || p % sizeof(float)) return k3_fail(err, "ring slot payload length %llu is out of range", (unsigned long long)p);
    *hdr_len = h;
    *payload_len = p;
    return 0;
}

int ring_cleanup_stale(void) {
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        int pid;
        unsigned rnd;
        char tail;
        if (sscanf(de->d_name, "k3.%d.%8x%c", &pid, &rnd, &tail) != 2 || pid <= 0) continue;
        if (kill(pid, 0) == 0 || errno != ESRCH) continue; /* creator alive (or not ours to judge) */
        char name[300];
        snprintf(name, sizeof name, "/%s", de->d_name);
        if (shm_unlink(name) == 0) n++;
    }
    closedir(d);
    return n;
}

uint64_t payload_checksum(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}
