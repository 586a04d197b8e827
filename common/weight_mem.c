/* weight_mem.c - aligned, huge-page-backed weight buffers (see weight_mem.h). */
#include "common/weight_mem.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct {
    void *base;
    size_t len;
} mem_header;

void *weight_mem_alloc(size_t n) {
    const size_t A = WEIGHT_MEM_ALIGN, page = 4096;
    if (n == 0) n = 1;
    if (n > SIZE_MAX - 2 * A) return NULL;
    size_t len = n + 2 * A; /* room for the header page and the alignment */
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    uintptr_t base = (uintptr_t)m, p = (base + page + A - 1) / A * A; /* >= one page after base */
    mem_header h = {m, len};
    memcpy((void *)(p - sizeof h), &h, sizeof h);
#ifdef MADV_HUGEPAGE
    size_t whole = n / A * A; /* only pages entirely inside the buffer */
    const char *hp = getenv("K3_WEIGHT_HUGEPAGES"); /* "0": 4 KiB pages (see weight_mem.h) */
    if (whole && !(hp && strcmp(hp, "0") == 0)) (void)madvise((void *)p, whole, MADV_HUGEPAGE);
#endif
    return (void *)p;
}

void weight_mem_free(void *p) {
    if (!p) return;
    mem_header h;
    memcpy(&h, (uint8_t *)p - sizeof h, sizeof h);
    munmap(h.base, h.len);
}
