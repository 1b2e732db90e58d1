// Device experiment (scripts/gpu/userd-locate.sh): an LD_PRELOAD shim that logs, from inside a CUDA
// process, the RM escapes that place a channel's GPFIFO ring and USERD (RM_ALLOC of a *_CHANNEL_GPFIFO_*
// class with its whole alloc parameters, RM_MAP_MEMORY in and out) and every mmap of an NVIDIA device
// file, so the observer's USERD locator is built on what libcuda really does. Never shipped.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

static FILE *logf_;
static FILE *lg(void) {
  if (!logf_) {
    const char *p = getenv("RMSPY_LOG");
    logf_ = fopen(p ? p : "/tmp/rmspy.log", "a");
    setvbuf(logf_, NULL, _IOLBF, 0);
  }
  return logf_;
}
static void hex(const char *tag, const void *p, size_t n) {
  const uint32_t *w = p;
  fprintf(lg(), "%s", tag);
  for (size_t i = 0; i < n / 4; i++) fprintf(lg(), " %08x", w[i]);
  fprintf(lg(), "\n");
}
static void fdname(int fd, char *buf, size_t n) {
  char p[64];
  snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
  ssize_t r = readlink(p, buf, n - 1);
  buf[r > 0 ? r : 0] = 0;
}

int ioctl(int fd, unsigned long req, ...) {
  static int (*real)(int, unsigned long, void *);
  if (!real) real = dlsym(RTLD_NEXT, "ioctl");
  va_list ap;
  va_start(ap, req);
  void *arg = va_arg(ap, void *);
  va_end(ap);
  unsigned nr = req & 0xff, type = (req >> 8) & 0xff, size = (req >> 16) & 0x3fff;
  int r = real(fd, req, arg);
  if (type == 'F' && nr == 0x2B && (size == 48 || size == 32)) {
    uint32_t *w = arg;
    uint32_t cls = w[3];
    void *params = *(void **)((char *)arg + 16);
    uint32_t psize = size == 48 ? w[8] : w[6];
    if ((cls & 0xff) == 0x6f || cls == 0xa06c) {
      fprintf(lg(), "ALLOC fd %d client %08x parent %08x new %08x class %04x psize %u status %x\n", fd,
              w[0], w[1], w[2], cls, psize, size == 48 ? w[10] : w[7]);
      if (params) hex("  params", params, (psize == 0 || psize > 256) ? 256 : psize);
    }
  } else if (type == 'F' && nr == 0x4E) {
    fprintf(lg(), "MAPMEM fd %d size %u\n", fd, size);
    hex("  out", arg, size);
  } else if (type == 'F' && nr == 0x2A && size == 32) {
    uint32_t *w = arg;
    fprintf(lg(), "CTRL fd %d client %08x obj %08x cmd %08x psize %u status %x\n", fd, w[0], w[1], w[2],
            w[6], w[7]);
  } else if (type == 'F' && nr == 0x29) {
    uint32_t *w = arg;
    fprintf(lg(), "FREE client %08x parent %08x old %08x\n", w[0], w[1], w[2]);
  } else if (type == 'F') {
    fprintf(lg(), "ESC fd %d nr %x size %u r %d\n", fd, nr, size, r);
  }
  return r;
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  static void *(*real)(void *, size_t, int, int, int, off_t);
  if (!real) real = dlsym(RTLD_NEXT, "mmap");
  void *r = real(addr, len, prot, flags, fd, off);
  if (fd >= 0) {
    char n[128];
    fdname(fd, n, sizeof n);
    if (strstr(n, "nvidia"))
      fprintf(lg(), "MMAP fd %d %s hint %p len %zx prot %x flags %x off %llx -> %p\n", fd, n, addr, len,
              prot, flags, (unsigned long long)off, r);
  }
  return r;
}
void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) __attribute__((alias("mmap")));
