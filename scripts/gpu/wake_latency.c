// How long a thread blocked on a wakeup takes to run after another thread wakes it, on this
// machine: the floor of the controller's hand-offs (ring buffer -> event loop -> NVIDIA worker).
// A waker posts CLOCK_MONOTONIC to an eventfd every 20 ms (the sleeper is idle in between, as the
// worker is between acts); the sleeper reads it blocking (mode block) or by polling (mode spin).
// Build: gcc -O2 -pthread -o wake_latency wake_latency.c; run: wake_latency [N]
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

static int efd, spin, n;
static uint64_t sent[2000];
static double lat[2000];

static uint64_t now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000ull + t.tv_nsec; }

static void *sleeper(void *_) {
  for (int i = 0; i < n; i++) {
    uint64_t v;
    while (read(efd, &v, 8) != 8) { /* spin mode: EAGAIN until posted */ }
    lat[i] = (now() - __atomic_load_n(&sent[i], __ATOMIC_ACQUIRE)) / 1e3;
  }
  return 0;
}

static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }

static void run(int s) {
  spin = s;
  efd = eventfd(0, spin ? EFD_NONBLOCK : 0);
  pthread_t t;
  pthread_create(&t, 0, sleeper, 0);
  for (int i = 0; i < n; i++) {
    usleep(20000);
    uint64_t one = 1;
    __atomic_store_n(&sent[i], now(), __ATOMIC_RELEASE);
    if (write(efd, &one, 8) != 8) abort();
  }
  pthread_join(t, 0);
  close(efd);
  qsort(lat, n, sizeof lat[0], cmp);
  printf("%s: n %d  p50 %.1f us  p90 %.1f us  p99 %.1f us  max %.1f us\n", spin ? "spin " : "block", n,
         lat[n / 2], lat[n * 9 / 10], lat[n * 99 / 100], lat[n - 1]);
}

int main(int argc, char **argv) {
  n = argc > 1 ? atoi(argv[1]) : 300;
  if (n > 2000) n = 2000;
  run(0);
  run(1);
  return 0;
}
