/* weight_mem.h - memory for weights: large, aligned, backed by transparent huge pages
 * where the kernel gives them.
 *
 * weight_mem_alloc(n): n bytes aligned to WEIGHT_MEM_ALIGN (2 MiB, a multiple of every
 * O_DIRECT alignment), from an anonymous mapping of its own. The whole 2 MiB pages
 * inside [p, p + n) are marked MADV_HUGEPAGE (ignored where THP is off or
 * unsupported): decode streams gigabytes of weights per token, and with 4 KiB pages
 * every 4 KiB costs a TLB miss and every first touch a page fault; with 2 MiB pages
 * both are 512 times rarer. Only whole pages inside the buffer are marked, so the
 * resident size never exceeds n rounded up to 4 KiB (memory budgets stay exact).
 * K3_WEIGHT_HUGEPAGES=0 in the environment leaves them 4 KiB pages (a measurement switch:
 * on the 2-vCPU Zen 5 VM of 2026-12-01 a 1-thread rw6 decode step was ~18 % faster on 4 KiB
 * pages, while the 8-id prefill took 3x longer and a load into just-freed memory 7x longer:
 * docs/PERFORMANCE.md, "Decode, sixth session").
 * Returns NULL if the mapping fails. weight_mem_free(p) (p from weight_mem_alloc or
 * NULL) unmaps it. The mapping's base and length are kept in a 4 KiB page just
 * below p (outside the buffer); no global state. */
#ifndef K3_WEIGHT_MEM_H
#define K3_WEIGHT_MEM_H

#include <stddef.h>

#define WEIGHT_MEM_ALIGN ((size_t)2 << 20)

void *weight_mem_alloc(size_t n);
void weight_mem_free(void *p);

#endif
