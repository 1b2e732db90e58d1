// Research probe for adopting CUDA processes that were already running (issue: NVIDIA observer).
// For each /dev/nvidiactl fd of PID: duplicate it (pidfd_getfd), find the RM clients that file
// owns by asking NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO (0xd02, index CLASSID) of candidate client
// handles (the RM's own client handles start at 0xc1d00000), then scan object handle ranges under
// each client and print class and parent of every object that answers. Prints timings.
// Build: gcc -O2 -o handle_scan handle_scan.c. Usage: handle_scan PID [RANGE_BASE RANGE_LEN]...
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct nvos54 { uint32_t h_client, h_object, cmd, flags; uint64_t params; uint32_t size, status; };
struct handle_info { uint32_t h_object, index; uint64_t data; };
#define RM_CONTROL _IOC(_IOC_READ | _IOC_WRITE, 'F', 0x2a, sizeof(struct nvos54))

static long calls;
static int info(int fd, uint32_t client, uint32_t obj, uint32_t index, uint64_t *out) {
  struct handle_info p = {obj, index, 0};
  struct nvos54 a = {client, client, 0xd02, 0, (uint64_t)(uintptr_t)&p, sizeof p, 0};
  calls++;
  if (ioctl(fd, RM_CONTROL, &a) < 0) return -errno;
  if (a.status) return (int)a.status;
  *out = p.data;
  return 0;
}

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }

int main(int argc, char **argv) {
  if (argc < 2) { fprintf(stderr, "usage: %s PID [BASE LEN]...\n", argv[0]); return 2; }
  int pid = atoi(argv[1]);
  int pidfd = syscall(SYS_pidfd_open, pid, 0);
  if (pidfd < 0) { perror("pidfd_open"); return 1; }
  char dir[64], link[256], path[320];
  snprintf(dir, sizeof dir, "/proc/%d/fd", pid);
  DIR *d = opendir(dir);
  if (!d) { perror(dir); return 1; }
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n < 0) continue;
    link[n] = 0;
    if (strcmp(link, "/dev/nvidiactl")) continue;
    int tfd = atoi(e->d_name);
    int fd = syscall(SYS_pidfd_getfd, pidfd, tfd, 0);
    if (fd < 0) { printf("fd %d: pidfd_getfd: %s\n", tfd, strerror(errno)); continue; }
    double t0 = now(); calls = 0;
    uint32_t clients[16]; int nc = 0;
    for (uint32_t h = 0xc1d00000; h < 0xc1d00000 + 0x10000 && nc < 16; h++) {
      uint64_t cls;
      if (info(fd, h, h, 2, &cls) == 0) { clients[nc++] = h; printf("fd %d: client %#x class %#llx\n", tfd, h, (unsigned long long)cls); }
    }
    printf("fd %d: client scan: %ld calls in %.1f ms\n", tfd, calls, (now() - t0) * 1e3);
    for (int c = 0; c < nc; c++) {
      for (int a = 2; a + 1 < argc; a += 2) {
        uint32_t base = strtoul(argv[a], 0, 0), len = strtoul(argv[a + 1], 0, 0);
        double t1 = now(); long c0 = calls; int found = 0;
        for (uint32_t h = base; h < base + len; h++) {
          uint64_t cls, parent;
          if (info(fd, clients[c], h, 2, &cls) == 0) {
            info(fd, clients[c], h, 1, &parent);
            if (found++ < 400) printf("  client %#x obj %#x class %#llx parent %#llx\n", clients[c], h, (unsigned long long)cls, (unsigned long long)parent);
          }
        }
        printf("  client %#x range %#x+%#x: %d objects, %ld calls in %.1f ms\n", clients[c], base, len, found, calls - c0, (now() - t1) * 1e3);
      }
    }
    close(fd);
  }
  return 0;
}
