/* Aligned blob writes with few syscalls.
 *
 * Small blobs and their zero padding are staged in one buffer and handed to the
 * kernel in large writes, so 20,000 tensors of 10 KB cost a few hundred syscalls,
 * not 40,000.  A blob larger than the buffer goes straight from the caller's
 * memory to write(2) without a copy, from the first extent boundary on.
 *
 * Every write(2) but the last ends on an extent boundary (2 MiB: a PMD on x86-64
 * and aarch64 with 4 KiB pages) and the large ones start on one.  The page cache
 * sizes the folios a buffered write creates by the write's length and alignment,
 * and only whole 2 MiB folios can be mapped with one page-table entry: a file
 * written in 1 MiB pieces at 64-byte offsets costs a reader who maps it one fault
 * per 16 pages (measured: 3,900 faults and 18 ms to touch 320 MB) instead of one
 * per 2 MiB (160 faults, 2.6 ms).
 *
 * On ext4 the blocks of each write are reserved just before it (fallocate of
 * exactly the range written, so the file never holds a byte it was not given).
 * ext4 otherwise delays choosing them, and renaming the finished file over an old
 * one (its auto_da_alloc rule, on by default) then chooses them all and starts
 * writing the whole file back inside the rename (all of it, if one block is left
 * to choose): 180-300 ms for 512 MB here, as long as the writes themselves, while safetensors' truncate-and-write paid the same
 * at its close.  Other filesystems are left as they are (tmpfs would zero every
 * page first).  Only ever a hint: a refusal writes as before.
 *
 * zt_reserve_ahead is the same reservation for writers that are not this one (the
 * exporters write through Python's file objects): the blocks of a size known ahead
 * are reserved past the end of the file without changing its size, so no write ever
 * leaves a block to choose, and the caller truncates the file to its length once
 * done, which gives back whatever it did not use.
 */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE  /* fallocate */
#endif
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "blobwrite.h"

#if defined(__linux__)
#include <fcntl.h>
#include <sys/vfs.h>
#include <unistd.h>
#ifndef FALLOC_FL_KEEP_SIZE
#define FALLOC_FL_KEEP_SIZE 0x01  /* linux/falloc.h */
#endif
#define ZT_EXT4_MAGIC 0xEF53  /* ext2, ext3 and ext4 share it; only ext4 delays */

static int wants_reserve(int fd) {
    struct statfs fs;
    return fstatfs(fd, &fs) == 0 && fs.f_type == ZT_EXT4_MAGIC;
}

int zt_reserve_ahead(int fd, uint64_t len) {
    if (len == 0 || len > (uint64_t)INT64_MAX || !wants_reserve(fd)) return 0;
    int saved = errno;
    int ok = fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)len) == 0;
    errno = saved;
    return ok;
}

static void reserve(const zt_blobwriter *bw, size_t n) {
    if (!bw->reserve) return;
    int saved = errno;
    off_t at = lseek(bw->fd, 0, SEEK_CUR);  /* where write(2) puts the bytes */
    if (at >= 0) (void)fallocate(bw->fd, 0, at, (off_t)n);
    errno = saved;
}
#else
int zt_reserve_ahead(int fd, uint64_t len) { (void)fd; (void)len; return 0; }
static int wants_reserve(int fd) { (void)fd; return 0; }
static void reserve(const zt_blobwriter *bw, size_t n) { (void)bw; (void)n; }
#endif

#ifdef _WIN32
#include <io.h>
typedef int zt_ssize;
static zt_ssize sys_write(int fd, const void *p, size_t n) {
    return _write(fd, p, (unsigned int)(n > 0x40000000u ? 0x40000000u : n));
}
#else
#include <unistd.h>
typedef ssize_t zt_ssize;
static zt_ssize sys_write(int fd, const void *p, size_t n) {
    /* Linux caps one write at about 2 GiB; ask for at most 1 GiB at a time */
    return write(fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
}
#endif

static zt_status write_all(zt_blobwriter *bw, const uint8_t *p, size_t n) {
    reserve(bw, n);
    while (n > 0) {
        /* at most one extent a call: the kernel copies a write from the caller's
         * memory folio by folio, and where that memory is a mapping whose pages are
         * not yet faulted in (a tensor mapped from its input file, as convert
         * writes it) a short copy makes it fall back to small folios for the rest
         * of the call: a 60 MiB write left 4% of its pages in 2 MiB folios, and
         * touching the file through a mapping took 4x as long */
        zt_ssize k = sys_write(bw->fd, p, n < ZT_BW_EXTENT ? n : ZT_BW_EXTENT);
        if (k < 0) {
            if (errno == EINTR) continue;
            bw->err = errno;
            return ZT_E_IO;
        }
        if (k == 0) { bw->err = ENOSPC; return ZT_E_IO; }
        p += k;
        n -= (size_t)k;
    }
    return ZT_OK;
}

zt_status zt_bw_init(zt_blobwriter *bw, int fd, uint64_t pos, size_t cap) {
    if (bw == NULL || cap < 64) return ZT_E_ARG;
    bw->buf = (uint8_t *)malloc(cap);
    if (bw->buf == NULL) return ZT_E_NOMEM;
    bw->fd = fd;
    bw->pos = pos;
    bw->cap = cap;
    bw->used = 0;
    bw->err = 0;
    bw->reserve = wants_reserve(fd);
    /* the largest power of two <= ZT_BW_EXTENT that fits twice in the buffer */
    bw->extent = ZT_BW_EXTENT;
    while (bw->extent > cap / 2) bw->extent /= 2;
    return ZT_OK;
}

zt_status zt_bw_flush(zt_blobwriter *bw) {
    if (bw->used == 0) return ZT_OK;
    zt_status st = write_all(bw, bw->buf, bw->used);
    if (st == ZT_OK) bw->used = 0;
    return st;
}

/* Bytes the buffer takes before it must be flushed: it is flushed when it ends at
 * the last extent boundary within its capacity, so every write(2) but the last
 * ends on a boundary. */
static size_t room(const zt_blobwriter *bw) {
    uint64_t start = bw->pos - bw->used;
    uint64_t end = (start + bw->cap) & ~(uint64_t)(bw->extent - 1);
    return (size_t)(end - bw->pos);  /* end > start: cap >= 2 * extent */
}

/* Copy len bytes (zeros when p is NULL) into the staging buffer, flushing as it fills. */
static zt_status stage(zt_blobwriter *bw, const uint8_t *p, size_t len) {
    while (len > 0) {
        size_t r = room(bw);
        if (r == 0) {
            zt_status st = zt_bw_flush(bw);
            if (st != ZT_OK) return st;
            continue;
        }
        size_t n = len < r ? len : r;
        if (p != NULL) {
            memcpy(bw->buf + bw->used, p, n);
            p += n;
        } else {
            memset(bw->buf + bw->used, 0, n);
        }
        bw->used += n;
        bw->pos += n;
        len -= n;
    }
    return ZT_OK;
}

zt_status zt_bw_pad(zt_blobwriter *bw, uint64_t alignment) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > bw->cap)
        return ZT_E_ARG;
    size_t pad = (size_t)((alignment - (bw->pos & (alignment - 1))) & (alignment - 1));
    return stage(bw, NULL, pad);
}

zt_status zt_bw_write(zt_blobwriter *bw, const void *data, size_t len) {
    const uint8_t *p = (const uint8_t *)data;
    if (len == 0) return ZT_OK;
    if (data == NULL) return ZT_E_ARG;
    while (len > 0) {
        if (bw->used == 0 && (bw->pos & (bw->extent - 1)) == 0 && len >= bw->cap) {
            /* at a boundary with a large blob: whole extents straight from the
             * caller's memory, no copy */
            size_t direct = len - (len & (bw->extent - 1));
            zt_status st = write_all(bw, p, direct);
            if (st != ZT_OK) return st;
            bw->pos += direct;
            p += direct;
            len -= direct;
            continue;
        }
        /* up to the next boundary (or all of a small blob) through the buffer */
        size_t r = room(bw);
        if (r == 0) {
            /* the buffer ends on a boundary: handed over, so that the rest of a large
             * blob takes the direct path above (refilling it here copied every byte
             * of every large blob through the buffer: 4 MiB writes, a third slower) */
            zt_status st = zt_bw_flush(bw);
            if (st != ZT_OK) return st;
            continue;
        }
        size_t n = len < r ? len : r;
        zt_status st = stage(bw, p, n);
        if (st != ZT_OK) return st;
        p += n;
        len -= n;
    }
    return ZT_OK;
}

void zt_bw_free(zt_blobwriter *bw) {
    if (bw == NULL) return;
    free(bw->buf);
    bw->buf = NULL;
    bw->cap = bw->used = 0;
}
