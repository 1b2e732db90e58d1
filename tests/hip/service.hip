// An online service for the request-latency test (tests/tests/requests.rs): a request every
// 1/RATE s (open loop), each a chain of kernels on one stream and a hipStreamSynchronize; it
// measures each request itself, from just before its first launch to the return of its sync, and
// writes the durations. Built with Debian's hipcc for gfx90a; run inside `gpreempt-ebpf sim`, its
// dispatches are completed by the emulator's timing model (the GPU code is never executed).
//   service RATE SECONDS OUT: prints "ready", then serves for SECONDS; OUT gets one duration in
//   ns per line.
#include <hip/hip_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

__global__ void step(float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * a + 1.0f;
}

#define CHECK(call)                                                        \
  do {                                                                     \
    hipError_t e_ = (call);                                                \
    if (e_ != hipSuccess) {                                                \
      printf("error %s: %s\n", #call, hipGetErrorString(e_));              \
      return 1;                                                            \
    }                                                                      \
  } while (0)

static int request(hipStream_t s, float *x, int n) {
  for (int i = 0; i < 12; i++) {
    hipLaunchKernelGGL(step, dim3(n / 256), dim3(256), 0, s, x, 0.5f, n);
  }
  CHECK(hipGetLastError());
  CHECK(hipStreamSynchronize(s));
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    printf("usage: service RATE SECONDS OUT\n");
    return 2;
  }
  double rate = atof(argv[1]), seconds = atof(argv[2]);
  int n = 1 << 20;
  float *x;
  CHECK(hipMalloc(&x, n * sizeof(float)));
  hipStream_t s;
  CHECK(hipStreamCreate(&s));
  // Warm-up: code objects loaded, queues created.
  for (int i = 0; i < 3; i++)
    if (request(s, x, n)) return 1;
  printf("ready\n");
  fflush(stdout);
  using clk = std::chrono::steady_clock;
  auto period = std::chrono::duration<double>(1.0 / rate);
  auto start = clk::now(), next = start;
  std::vector<long long> durs;
  while (std::chrono::duration<double>(clk::now() - start).count() < seconds) {
    std::this_thread::sleep_until(next);
    auto t0 = clk::now();
    if (request(s, x, n)) return 1;
    durs.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now() - t0).count());
    next += std::chrono::duration_cast<clk::duration>(period);
    if (next < clk::now()) next = clk::now();
  }
  FILE *f = fopen(argv[3], "w");
  if (!f) return 1;
  for (long long d : durs) fprintf(f, "%lld\n", d);
  fclose(f);
  CHECK(hipStreamDestroy(s));
  CHECK(hipFree(x));
  printf("requests %zu\ndone\n", durs.size());
  return 0;
}
