// The ioctl tax of the observer (scripts/gpu/ioctl-tax.sh; real host, not emulated): mean ns per
// call of (a) TCGETS on a pty, an ioctl no GPU driver sees, and (b) an RM_CONTROL escape on
// /dev/nvidiactl with no client (the RM answers NV_ERR_INVALID_CLIENT at once), over ROUNDS x N
// calls each. Prints one line per round: "tcgets NS" / "rm NS".
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 5, n = argc > 2 ? atoi(argv[2]) : 300000;
  int pty = posix_openpt(O_RDWR | O_NOCTTY);
  int ctl = open("/dev/nvidiactl", O_RDWR);
  struct termios tio;
  struct {
    uint32_t hClient, hObject, cmd, flags;
    uint64_t params;
    uint32_t paramsSize, status;
  } p;
  uint64_t buf[2];
  for (int r = 0; r < rounds; r++) {
    double t0 = now();
    for (int i = 0; i < n; i++) ioctl(pty, TCGETS, &tio);
    printf("tcgets %.1f\n", (now() - t0) / n);
    if (ctl >= 0) {
      t0 = now();
      for (int i = 0; i < n / 10; i++) {
        memset(&p, 0, sizeof p);
        p.cmd = 0x00000d02;  // NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO on no client
        p.params = (uint64_t)buf;
        p.paramsSize = 16;
        ioctl(ctl, 0xC020462A, &p);
      }
      printf("rm %.1f status %#x\n", (now() - t0) / (n / 10), p.status);
    }
  }
  return 0;
}
