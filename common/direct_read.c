/* direct_read.c - O_DIRECT / buffered range reads of shards (contract: direct_read.h). */
#define _GNU_SOURCE
#include "common/direct_read.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int direct_open(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    return fd >= 0 ? fd : -1;
}

uint64_t direct_window(uint64_t off, uint64_t len) {
    uint64_t a0 = off / DIRECT_ALIGN * DIRECT_ALIGN;
    uint64_t a1 = (off + len + DIRECT_ALIGN - 1) / DIRECT_ALIGN * DIRECT_ALIGN;
    return a1 - a0;
}

ssize_t (*direct_pread_fn)(int fd, void *buf, size_t n, off_t off) = pread;

ssize_t pread_full(int fd, void *buf, size_t n, off_t off) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = direct_pread_fn(fd, (char *)buf + got, n - got, off + (off_t)got);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

static int failed_errno(const char *path, uint64_t at, const char *what, ssize_t got, uint64_t want, int errnum,
                        k3_error *err) {
    char w[300] = "";
    if (what) snprintf(w, sizeof w, " (%s)", what);
    if (got < 0)
        return k3_fail(err, "read error in shard %s at offset %llu%s: %s", path, (unsigned long long)at, w, strerror(errnum));
    return k3_fail(err, "short read in shard %s at offset %llu%s: got %zd of %llu bytes (truncated shard?)", path,
                   (unsigned long long)at, w, got, (unsigned long long)want);
}

static int failed(const char *path, uint64_t at, const char *what, ssize_t got, uint64_t want, k3_error *err) {
    return failed_errno(path, at, what, got, want, errno, err);
}

int direct_read(const char *path, int dfd, int bfd, uint64_t off, uint64_t len, uint8_t *buf, const uint8_t **data,
                int *direct_refused, const char *what, k3_error *err) {
    if (dfd >= 0) {
        uint64_t a0 = off / DIRECT_ALIGN * DIRECT_ALIGN, n = direct_window(off, len);
        ssize_t got = pread_full(dfd, buf, n, (off_t)a0);
        if (got >= 0) {
            if ((uint64_t)got < off + len - a0) return failed(path, a0, what, got, off + len - a0, err);
            *data = buf + (off - a0);
            return 0;
        }
        if (errno != EINVAL) return failed(path, a0, what, -1, n, err);
        if (direct_refused) *direct_refused = 1; /* the alignment was refused: buffered below */
        if (bfd < 0) return -1;                  /* the caller retries with a buffered descriptor */
    }
    ssize_t got = pread_full(bfd, buf, len, (off_t)off);
    if (got < 0 || (uint64_t)got < len) return failed(path, off, what, got, len, err);
    *data = buf;
    return 0;
}

/* ---- several reads in flight ---- */

struct dr_pool {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    dr_read *head, *tail, *utail; /* reads with pieces not yet taken; utail: the last urgent one */
    int n_threads, stop;
    uint64_t piece;
    pthread_t *th;
};

int dr_pool_threads(const dr_pool *p) { return p ? p->n_threads : 0; }

/* Piece k of r: [r->a0 + k * piece, ...) of the window (O_DIRECT) or of [off, off + len) (buffered). */
static void read_piece(dr_pool *p, dr_read *r, int k, int *einval, k3_error *e) {
    int direct = r->dfd >= 0;
    uint64_t start = r->a0 + (uint64_t)k * p->piece, end = start + p->piece;
    if (end > r->a0 + r->span) end = r->a0 + r->span;
    uint64_t need_end = r->off + r->len; /* the bytes that must be there (the window may pass EOF) */
    uint64_t need = need_end > start ? (need_end < end ? need_end : end) - start : 0;
    ssize_t got = pread_full(direct ? r->dfd : r->bfd, r->buf + (start - r->a0), (size_t)(end - start), (off_t)start);
    if (got < 0) {
        int en = errno;
        if (direct && en == EINVAL) { *einval = 1; return; }
        failed_errno(r->path, start, r->what, -1, end - start, en, e);
        return;
    }
    if ((uint64_t)got < need) /* as direct_read: the bytes got from the read's start, of the bytes wanted */
        failed_errno(r->path, r->a0, r->what, (ssize_t)(start - r->a0) + got, need_end - r->a0, 0, e);
}

/* Called by the thread that finished r's last piece (mu not held). */
static void finish(dr_read *r) {
    if (r->failed) { r->rc = -1; return; }
    if (r->einval) {
        r->direct_refused = 1;
        if (r->bfd < 0) { r->rc = -1; return; }
        r->rc = direct_read(r->path, -1, r->bfd, r->off, r->len, r->buf, &r->data, NULL, r->what, &r->err);
        return;
    }
    r->data = r->dfd >= 0 ? r->buf + (r->off - r->a0) : r->buf;
    r->rc = 0;
}

static void *pool_main(void *arg) {
    dr_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && !p->head) pthread_cond_wait(&p->work, &p->mu);
        if (!p->head) break; /* stop, and nothing queued */
        dr_read *r = p->head;
        int k = r->next_piece++;
        if (r->next_piece == r->n_pieces) {
            p->head = r->qnext;
            if (!p->head) p->tail = NULL;
            if (p->utail == r) p->utail = NULL;
        }
        int skip = r->failed || r->einval;
        pthread_mutex_unlock(&p->mu);
        int einval = 0;
        k3_error e = {0};
        if (!skip) read_piece(p, r, k, &einval, &e);
        pthread_mutex_lock(&p->mu);
        if (e.set && !r->failed) { r->failed = 1; r->err = e; }
        if (einval) r->einval = 1;
        if (++r->pieces_done == r->n_pieces) {
            pthread_mutex_unlock(&p->mu);
            finish(r);
            pthread_mutex_lock(&p->mu);
            r->done = 1;
            pthread_cond_broadcast(&p->done);
        }
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

dr_pool *dr_pool_create(int n_threads, uint64_t piece_bytes, k3_error *err) {
    dr_pool *p = calloc(1, sizeof *p);
    if (!p) { k3_fail(err, "out of memory"); return NULL; }
    p->piece = piece_bytes < DIRECT_ALIGN ? DIRECT_ALIGN : piece_bytes / DIRECT_ALIGN * DIRECT_ALIGN;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    if (n_threads > 0 && !(p->th = calloc((size_t)n_threads, sizeof *p->th))) {
        dr_pool_free(p);
        k3_fail(err, "out of memory");
        return NULL;
    }
    for (int i = 0; i < n_threads; i++) {
        if (pthread_create(&p->th[i], NULL, pool_main, p) != 0) {
            dr_pool_free(p);
            k3_fail(err, "cannot start reader thread %d of %d", i + 1, n_threads);
            return NULL;
        }
        p->n_threads++;
    }
    return p;
}

void dr_pool_free(dr_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads; i++) pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
    free(p->th);
    free(p);
}

void dr_submit(dr_pool *p, dr_read *r, int urgent) {
    r->data = NULL;
    r->rc = -1;
    r->direct_refused = 0;
    k3_error_clear(&r->err);
    r->failed = r->einval = r->done = 0;
    r->next_piece = r->pieces_done = 0;
    r->qnext = NULL;
    if (r->dfd >= 0) {
        r->a0 = r->off / DIRECT_ALIGN * DIRECT_ALIGN;
        r->span = direct_window(r->off, r->len);
    } else {
        r->a0 = r->off;
        r->span = r->len;
    }
    uint64_t np = r->span ? (r->span + p->piece - 1) / p->piece : 1;
    r->n_pieces = (int)np;
    if (!p->n_threads) { /* no threads: read here, piece by piece */
        for (int k = 0; k < r->n_pieces && !r->failed && !r->einval; k++) {
            k3_error e = {0};
            int einval = 0;
            read_piece(p, r, k, &einval, &e);
            if (e.set) { r->failed = 1; r->err = e; }
            if (einval) r->einval = 1;
        }
        r->pieces_done = r->next_piece = r->n_pieces;
        finish(r);
        r->done = 1;
        return;
    }
    pthread_mutex_lock(&p->mu);
    if (urgent) { /* after the urgent reads already queued, ahead of the others */
        dr_read **at = p->utail ? &p->utail->qnext : &p->head;
        r->qnext = *at;
        *at = r;
        if (!r->qnext) p->tail = r;
        p->utail = r;
    } else {
        if (p->tail) p->tail->qnext = r;
        else p->head = r;
        p->tail = r;
    }
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
}

int dr_poll(dr_pool *p, dr_read *r) {
    if (!p->n_threads) return 1;
    pthread_mutex_lock(&p->mu);
    int d = r->done;
    pthread_mutex_unlock(&p->mu);
    return d;
}

int dr_wait(dr_pool *p, dr_read *r) {
    if (p->n_threads) {
        pthread_mutex_lock(&p->mu);
        while (!r->done) pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
    return r->rc;
}
