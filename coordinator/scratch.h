/* scratch.h - the engine's one scratch arena: carved, never allocated, in the hot path.
 *
 * A forward pass takes every temporary buffer from one arena allocated once per
 * engine (engine_init) and sized by the SAME layout functions that carve it at
 * run time: a layout run on a sizing arena (base NULL) only counts bytes, so the
 * size the plan prints and the memory the run uses cannot drift apart.
 * scratch_take returns 64-byte aligned memory, or NULL when the arena would
 * overflow (a sizing bug: callers report it, never write past the end).
 * Marks: save `used` before a layer part, restore it after (a stack). */
#ifndef K3_SCRATCH_H
#define K3_SCRATCH_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint8_t *base;   /* NULL: a sizing arena (counts only) */
    size_t cap, used;
} scratch;

static inline void *scratch_take(scratch *s, size_t bytes) {
    size_t at = (s->used + 63) & ~(size_t)63;
    s->used = at + ((bytes + 63) & ~(size_t)63);
    if (!s->base) return (void *)(uintptr_t)64; /* sizing: any non-NULL, never dereferenced */
    if (s->used > s->cap) return NULL;
    return s->base + at;
}

#endif
