/* snapshots.h - prefix snapshots of sequence state: resume a new prompt from the longest
 * stored history it extends instead of re-reading it (docs/ARCHITECTURE.md "Snapshots").
 *
 * API (used by the run, the chat REPL and the HTTP server)
 *   snap_store_open(&s, &opt, err)         memory tier of opt.mem_cap bytes (the plan's
 *                                          snapshot line), optional disk tier opt.dir capped at
 *                                          opt.disk_cap bytes
 *   snap_lookup(s, ids, n, max_len, st, err)  restores into st the longest snapshot whose
 *                                          history is ids[0..L) with L <= max_len (callers that
 *                                          need the logits of position n-1 pass n-1); returns L
 *                                          (0 = none: st untouched), or -1 on an engine error
 *   snap_insert(s, ids, st, err)           stores a copy of st (st->pos fed positions, whose
 *                                          ids are ids[0..st->pos)); best effort: a snapshot
 *                                          that cannot be kept (out of memory, a full disk) is
 *                                          reported on opt.log and the call still returns 0
 *
 * Contract
 * - A restored state is bit-for-bit the state the inserted one had: feeding the rest of the
 *   prompt gives exactly the ids and logits of a cold run.
 * - Memory tier: whole snapshots (ids + every KDA S/conv + the MLA rows of the fed positions),
 *   counted in bytes; least recently used evicted first; a snapshot larger than mem_cap is not
 *   kept in memory. Inserting a history already stored only refreshes it.
 * - Disk tier (opt.dir != NULL): every snapshot is also written as a state file
 *   (STATE_KIND_SNAPSHOT, atomic write) named <XXH64 of the ids, keyed by the model fingerprint, as 16 hex>-<length>.k3snap; the
 *   directory is scanned at open. Least recently used FILES (by mtime, refreshed on every hit)
 *   are deleted while the files' total exceeds disk_cap. A file that is refused when loaded
 *   (another model, corrupt, truncated) is reported on opt.log, deleted and skipped: a lookup
 *   never restores a state that the loader did not fully validate, and its ids must equal the
 *   prompt's prefix.
 * - No global state; one store per engine; not thread-safe (one caller at a time). */
#ifndef K3_SNAPSHOTS_H
#define K3_SNAPSHOTS_H

#include "coordinator/state_file.h"
#include <stdio.h>

typedef struct snap_store snap_store;

typedef struct {
    const k3_config *cfg;
    const state_fingerprint *fp;
    uint64_t mem_cap;         /* bytes for the memory tier (0 = none) */
    const char *dir;          /* disk tier directory (NULL = none); created if missing */
    uint64_t disk_cap;        /* bytes of snapshot files kept in dir */
    size_t max_positions;     /* longest history accepted from disk */
    FILE *log;                /* refusals of disk snapshots (NULL = silent) */
} snap_options;

typedef struct {
    size_t mem_entries, disk_files;
    uint64_t mem_bytes, disk_bytes;
    uint64_t hits_mem, hits_disk, misses, inserts, evictions, refused;
} snap_stats;

int snap_store_open(snap_store **s, const snap_options *opt, k3_error *err);
void snap_store_free(snap_store *s);
long snap_lookup(snap_store *s, const int32_t *ids, size_t n, size_t max_len, seq_state *st, k3_error *err);
int snap_insert(snap_store *s, const int32_t *ids, const seq_state *st, k3_error *err);
snap_stats snap_get_stats(const snap_store *s);

#endif
