// A HIP program for the real-runtime test (tests/tests/rocm.rs): two streams, kernels launched on
// both, then synchronized. Built with Debian's hipcc for gfx90a; run inside `gpreempt-ebpf sim`,
// its dispatches are completed by the emulator's timing model (the GPU code is never executed).
//   two_streams [SECONDS]: keep launching and synchronizing for SECONDS after the first round.
#include <hip/hip_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>

__global__ void scale(float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}

__global__ void offset(float *x, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += b;
}

#define CHECK(call)                                                        \
  do {                                                                     \
    hipError_t e_ = (call);                                                \
    if (e_ != hipSuccess) {                                                \
      printf("error %s: %s\n", #call, hipGetErrorString(e_));              \
      return 1;                                                            \
    }                                                                      \
  } while (0)

static int round_of(hipStream_t s1, hipStream_t s2, float *a, float *b, int n) {
  for (int i = 0; i < 10; i++) {
    hipLaunchKernelGGL(scale, dim3(n / 256), dim3(256), 0, s1, a, 2.0f, n);
    hipLaunchKernelGGL(offset, dim3(n / 256), dim3(256), 0, s2, b, 1.0f, n);
  }
  CHECK(hipGetLastError());
  CHECK(hipStreamSynchronize(s1));
  CHECK(hipStreamSynchronize(s2));
  return 0;
}

int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 0;
  hipDeviceProp_t p;
  CHECK(hipGetDeviceProperties(&p, 0));
  printf("device %s %s cus %d\n", p.name, p.gcnArchName, p.multiProcessorCount);
  int n = 1 << 16;
  float *a, *b;
  CHECK(hipMalloc(&a, n * sizeof(float)));
  CHECK(hipMalloc(&b, n * sizeof(float)));
  hipStream_t s1, s2;
  CHECK(hipStreamCreate(&s1));
  CHECK(hipStreamCreate(&s2));
  if (round_of(s1, s2, a, b, n)) return 1;
  printf("ready\n");
  fflush(stdout);
  long rounds = 1;
  auto start = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
    if (round_of(s1, s2, a, b, n)) return 1;
    rounds++;
  }
  CHECK(hipDeviceSynchronize());
  printf("launches %ld\n", rounds * 20);
  CHECK(hipStreamDestroy(s1));
  CHECK(hipStreamDestroy(s2));
  CHECK(hipFree(a));
  CHECK(hipFree(b));
  printf("done\n");
  return 0;
}
