/* Whether a mapped range of a file is in the page cache, so that a reader can pick how
 * to copy it out: from its mapping when the pages are cached (a large page-cache folio
 * maps in one fault: about 1.5x pread's rate here), with pread when they are not (pread
 * reads ahead in large pieces; faulting a mapping in reads in readahead-sized ones). */
#ifndef ZT_RESIDENCY_H
#define ZT_RESIDENCY_H

#include <stddef.h>

/* 1: every page of [addr, addr + len) is resident; 0: some page is not; -1: unknown
 * (no mincore on this platform, or it failed: the range is not a mapping).  addr need
 * not be page-aligned.  Costs one mincore call per 4096 pages. */
int zt_range_resident(const void *addr, size_t len);

#endif
