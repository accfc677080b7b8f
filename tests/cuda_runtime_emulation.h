/* The CUDA runtime calls of a model's driver (ansor.graph.cuda_model) on the CPU, for tests:
   device memory is host memory, copies are memcpy, and a launch runs the kernel through
   cuda_emulation.h (blocks in turn, a block's threads as std::threads). Include after it. */
#pragma once
#include <cstdlib>
#include <cstring>

typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost };
inline cudaError_t cudaMalloc(void** p, size_t n) { *p = std::calloc(n, 1); return *p ? cudaSuccess : cudaErrorMemoryAllocation; }
inline cudaError_t cudaFree(void* p) { std::free(p); return cudaSuccess; }
inline cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) { std::memcpy(d, s, n); return cudaSuccess; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t e) { return e ? "emulated allocation failed" : "no error"; }
#define ANSOR_LAUNCH(kernel, gx, gy, gz, bx, by, bz, ...) do { \
    static_assert((by) * (bz) == 1 && (gz) == 1, "emulation: 1-D blocks, 2-D grids"); \
    emu_launch([&] { kernel(__VA_ARGS__); }, emu_dim3{(gx), (gy), 1}, (bx)); } while (0)
