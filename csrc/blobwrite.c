/* Aligned blob writes with few syscalls.
 *
 * Small blobs and their zero padding are staged in one buffer and handed to the
 * kernel in large writes, so 20,000 tensors of 10 KB cost a few hundred syscalls,
 * not 40,000.  A blob larger than the buffer goes straight from the caller's
 * memory to write(2) without a copy.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "blobwrite.h"

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
    while (n > 0) {
        zt_ssize k = sys_write(bw->fd, p, n);
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
    return ZT_OK;
}

zt_status zt_bw_flush(zt_blobwriter *bw) {
    if (bw->used == 0) return ZT_OK;
    zt_status st = write_all(bw, bw->buf, bw->used);
    if (st == ZT_OK) bw->used = 0;
    return st;
}

/* Copy len bytes into the staging buffer, flushing as it fills. */
static zt_status stage(zt_blobwriter *bw, const uint8_t *p, size_t len) {
    while (len > 0) {
        if (bw->used == bw->cap) {
            zt_status st = zt_bw_flush(bw);
            if (st != ZT_OK) return st;
        }
        size_t room = bw->cap - bw->used;
        size_t n = len < room ? len : room;
        memcpy(bw->buf + bw->used, p, n);
        bw->used += n;
        bw->pos += n;
        p += n;
        len -= n;
    }
    return ZT_OK;
}

zt_status zt_bw_pad(zt_blobwriter *bw, uint64_t alignment) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > bw->cap)
        return ZT_E_ARG;
    size_t pad = (size_t)((alignment - (bw->pos & (alignment - 1))) & (alignment - 1));
    if (pad == 0) return ZT_OK;
    if (bw->cap - bw->used < pad) {
        zt_status st = zt_bw_flush(bw);
        if (st != ZT_OK) return st;
    }
    memset(bw->buf + bw->used, 0, pad);
    bw->used += pad;
    bw->pos += pad;
    return ZT_OK;
}

zt_status zt_bw_write(zt_blobwriter *bw, const void *data, size_t len) {
    if (len == 0) return ZT_OK;
    if (data == NULL) return ZT_E_ARG;
    if (len <= bw->cap - bw->used) return stage(bw, (const uint8_t *)data, len);
    /* large blob: empty the buffer, then write straight from the caller's memory */
    zt_status st = zt_bw_flush(bw);
    if (st != ZT_OK) return st;
    if (len < bw->cap / 2) return stage(bw, (const uint8_t *)data, len);
    st = write_all(bw, (const uint8_t *)data, len);
    if (st == ZT_OK) bw->pos += len;
    return st;
}

void zt_bw_free(zt_blobwriter *bw) {
    if (bw == NULL) return;
    free(bw->buf);
    bw->buf = NULL;
    bw->cap = bw->used = 0;
}
