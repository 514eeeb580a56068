#include "gpu/device.h"

#include <cuda_runtime.h>

namespace dltrain::gpu {
namespace {

void check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw CudaError(std::string(call) + " failed: " + cudaGetErrorString(e));
}

}  // namespace

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why != nullptr) *why = cudaGetErrorString(e);
    (void)cudaGetLastError();  // clear it
    return 0;
  }
  if (n == 0 && why != nullptr) *why = "the CUDA runtime reports no device";
  return n;
}

std::string device_name(int device) {
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  return p.name;
}

void synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

void copy_to_device(void* dst, const void* src, std::size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (host to device)");
}

void copy_to_host(void* dst, const void* src, std::size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (device to host)");
}

void copy_on_device(void* dst, const void* src, std::size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy (device to device)");
}

void zero_device(void* dst, std::size_t bytes) { check(cudaMemset(dst, 0, bytes), "cudaMemset"); }

DeviceBytes::~DeviceBytes() {
  if (p_ != nullptr) (void)cudaFree(p_);
}

void DeviceBytes::reserve(std::size_t bytes) {
  if (bytes <= bytes_) return;
  if (p_ != nullptr) {
    (void)cudaFree(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
  p_ = p;
  bytes_ = bytes;
}

}  // namespace dltrain::gpu
