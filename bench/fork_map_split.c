/* The same split as bench/fork_map_stream.py (read its docstring for the format), in C, to
 * see what the conversion costs without Python's per-record overhead.
 *
 * Usage: fork_map_split STREAM LENGTH RAW KEPT RAM_BYTES
 * LENGTH 0: STREAM is a FIFO QEMU writes into while it saves; the split is made as the
 * stream arrives, until QEMU closes it (the save's pause then lasts as long as the slower of
 * the two). Otherwise the first LENGTH bytes of the file STREAM.
 * Prints: "PAGES ZERO_PAGES KEPT_PAGES KEPT_BYTES WRITE_NS". Exit 2 on a format it does not
 * understand (the Python splitter then says where).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096ULL
#define F_ZERO 0x02
#define F_MEM_SIZE 0x04
#define F_PAGE 0x08
#define F_EOS 0x10
#define F_CONT 0x20
#define BUF (4u << 20)
#define MAX_IOV 1024

/* The input: a mapped file (s, len) or a pipe read into buf. `at` counts bytes consumed. */
static const uint8_t *s;
static size_t len, pos;
static int pipe_fd = -1;
static uint8_t *buf;
static size_t have, used;
static uint64_t at;
static FILE *kept;
static int raw_fd;
static long long write_ns;
/* Runs of contiguous pages go to the raw file in one pwritev, pointing into the input:
 * writing fresh tmpfs pages through a mapping instead took ~2x as long here (a fault per
 * 4 KiB page). */
static struct iovec iov[MAX_IOV];
static int niov;
static uint64_t run_start, run_end;

static void fail(const char *what) {
    fprintf(stderr, "fork_map_split: %s at byte %llu\n", what, (unsigned long long)at);
    exit(2);
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void flush_raw(void) {
    if (niov) {
        long long t0 = now_ns();
        if (pwritev(raw_fd, iov, niov, (off_t)run_start) != (ssize_t)(run_end - run_start))
            fail("short write to the raw file");
        write_ns += now_ns() - t0;
        niov = 0;
    }
}

static void add_raw(uint64_t addr, const uint8_t *data) {
    if (niov && (addr != run_end || niov == MAX_IOV)) flush_raw();
    if (!niov) run_start = addr;
    iov[niov].iov_base = (void *)data;
    iov[niov].iov_len = PAGE;
    niov++;
    run_end = addr + PAGE;
}

/* n contiguous bytes of the input (n < BUF), or NULL at its end. */
static const uint8_t *take(size_t n) {
    if (pipe_fd < 0) {
        if (pos + n > len) return NULL;
        pos += n;
        at += n;
        return s + pos - n;
    }
    if (have - used < n) {
        flush_raw(); /* its iovecs point into buf */
        memmove(buf, buf + used, have - used);
        have -= used;
        used = 0;
        while (have < n) {
            ssize_t got = read(pipe_fd, buf + have, BUF - have);
            if (got < 0 && errno == EINTR) continue;
            if (got < 0) fail("read");
            if (got == 0) return NULL;
            have += (size_t)got;
        }
    }
    used += n;
    at += n;
    return buf + used - n;
}

static const uint8_t *must(size_t n) {
    const uint8_t *p = take(n);
    if (!p) fail("stream ends early");
    return p;
}

static uint64_t be64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return v;
}

static uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}


static void keep(const void *p, size_t n) {
    if (fwrite(p, 1, n, kept) != n) fail("write to the kept stream");
}

int main(int argc, char **argv) {
    if (argc != 6) fail("usage: STREAM LENGTH RAW KEPT RAM_BYTES");
    len = strtoull(argv[2], NULL, 10);
    uint64_t ram_bytes = strtoull(argv[5], NULL, 10);
    int in = open(argv[1], O_RDONLY | O_CLOEXEC);
    if (in < 0) fail("cannot open the stream");
    if (len) {
        s = mmap(NULL, len, PROT_READ, MAP_SHARED | MAP_POPULATE, in, 0);
        if (s == MAP_FAILED) fail("cannot map the stream");
    } else {
        pipe_fd = in;
        fcntl(in, F_SETPIPE_SZ, 1 << 20);
        buf = malloc(BUF);
        if (!buf) fail("no memory");
    }
    raw_fd = open(argv[3], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (raw_fd < 0 || ftruncate(raw_fd, (off_t)ram_bytes)) fail("cannot make the raw file");
    kept = fopen(argv[4], "wb");
    if (!kept) fail("cannot open the kept stream");
    const uint8_t *p = must(8);
    if (be32(p) != 0x5145564D || be32(p + 4) != 3) fail("not a version 3 stream");
    keep(p, 8);
    /* Header and configuration as they are, up to savevm.c's RAM section start:
     * START, section id, "ram", instance 0, version 4. */
    static const uint8_t tail[] = {3, 'r', 'a', 'm', 0, 0, 0, 0, 0, 0, 0, 4};
    uint8_t win[17];
    memcpy(win, must(17), 17);
    while (!(win[0] == 1 && !memcmp(win + 5, tail, sizeof tail))) {
        if (at > 65536) fail("no RAM section start");
        keep(win, 1);
        memmove(win, win + 1, 16);
        win[16] = *must(1);
    }
    uint32_t ram_id = be32(win + 1);
    char main_id[256] = "", last[256] = "";
    long pages = 0, zeros = 0, kept_pages = 0;
    int first = 1;
    for (;;) {
        uint8_t kind;
        if (first) {
            keep(win, 17);
            kind = 1;
            first = 0;
        } else {
            p = must(5);
            kind = p[0];
            if (kind < 2 || kind > 3 || be32(p + 1) != ram_id) fail("not a RAM section");
            keep(p, 5);
        }
        for (;;) {
            p = must(8);
            uint64_t word = be64(p), flags = word & (PAGE - 1), addr = word & ~(PAGE - 1);
            if (flags & F_MEM_SIZE) {
                keep(p, 8);
                int64_t total = (int64_t)addr;
                while (total > 0) {
                    uint8_t n = *must(1);
                    keep(&n, 1);
                    p = must((size_t)n + 16);
                    keep(p, (size_t)n + 16);
                    uint64_t size = be64(p + n);
                    if (size == ram_bytes) {
                        memcpy(main_id, p, n);
                        main_id[n] = 0;
                    }
                    total -= (int64_t)size;
                }
                if (total || !main_id[0]) fail("RAM block list");
                continue;
            }
            if (flags & F_EOS) {
                keep(p, 8);
                break;
            }
            if (!(flags & (F_ZERO | F_PAGE)) || (flags & ~(uint64_t)(F_ZERO | F_PAGE | F_CONT)))
                fail("RAM record flags");
            if (!(flags & F_CONT)) {
                uint8_t n = *must(1);
                memcpy(last, must(n), n);
                last[n] = 0;
            }
            const uint8_t *data = must(flags & F_ZERO ? 1 : PAGE);
            if (!strcmp(last, main_id)) {
                if (addr + PAGE > ram_bytes) fail("page beyond the RAM");
                if (flags & F_PAGE) {
                    add_raw(addr, data);
                    pages++;
                } else if (*data) {
                    fail("a non-zero ZERO page");
                } else {
                    zeros++;
                }
                continue;
            }
            uint8_t hdr[9], n = (uint8_t)strlen(last);
            uint64_t w = addr | (flags & ~(uint64_t)F_CONT);
            for (int i = 0; i < 8; i++) hdr[i] = (uint8_t)(w >> (56 - 8 * i));
            hdr[8] = n;
            keep(hdr, 9);
            keep(last, n);
            keep(data, flags & F_ZERO ? 1 : PAGE);
            kept_pages++;
        }
        p = must(5);
        if (p[0] != 0x7e || be32(p + 1) != ram_id) fail("no section footer");
        keep(p, 5);
        if (kind == 3) break;
    }
    flush_raw();
    /* Device state, EOF and the JSON description, as they are. */
    if (pipe_fd < 0) {
        keep(s + pos, len - pos);
    } else {
        for (;;) {
            if (have > used) keep(buf + used, have - used);
            used = have = 0;
            ssize_t got = read(pipe_fd, buf, BUF);
            if (got < 0 && errno == EINTR) continue;
            if (got < 0) fail("read");
            if (got == 0) break;
            have = (size_t)got;
        }
    }
    long kept_bytes = ftell(kept);
    if (fclose(kept) || close(raw_fd)) fail("cannot close the outputs");
    printf("%ld %ld %ld %ld %lld\n", pages, zeros, kept_pages, kept_bytes, write_ns);
    return 0;
}
