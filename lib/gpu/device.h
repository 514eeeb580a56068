// Device memory and the CUDA runtime for lib/gpu (built with -DDLTRAIN_WITH_CUDA=ON):
// plain device buffers, no LibTorch. This header needs no CUDA header; the functions are
// defined in device.cu.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.h"

namespace dltrain::gpu {

/// A CUDA runtime call failed; what() names the call and cudaGetErrorString's text.
class CudaError : public Error {
 public:
  using Error::Error;
};

/// CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies); 0 when there is none or
/// the driver cannot be used, with the runtime's reason in `*why` when given.
int device_count(std::string* why = nullptr);

/// The model name of device `device` ("NVIDIA H200"). Throws CudaError.
std::string device_name(int device);

/// cudaDeviceSynchronize; throws CudaError with the first error of earlier launches.
void synchronize();

/// Host ↔ device and device → device copies of `bytes` bytes on the default stream,
/// synchronous with the host. Throw CudaError.
void copy_to_device(void* dst, const void* src, std::size_t bytes);
void copy_to_host(void* dst, const void* src, std::size_t bytes);
void copy_on_device(void* dst, const void* src, std::size_t bytes);
/// Sets `bytes` bytes of device memory to zero.
void zero_device(void* dst, std::size_t bytes);

/// Owns `bytes` bytes of device memory (cudaMalloc); move-only.
class DeviceBytes {
 public:
  DeviceBytes() = default;
  explicit DeviceBytes(std::size_t bytes) { reserve(bytes); }
  ~DeviceBytes();
  DeviceBytes(DeviceBytes&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBytes& operator=(DeviceBytes&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;

  /// At least `bytes` bytes (a larger allocation replaces a smaller one; contents are not
  /// kept). Throws CudaError when the device is out of memory.
  void reserve(std::size_t bytes);
  void* get() const { return p_; }
  std::size_t size() const { return bytes_; }

 private:
  void* p_ = nullptr;
  std::size_t bytes_ = 0;
};

/// `n` elements of T in device memory, with copies to and from the host.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(std::size_t n) { resize(n); }
  /// Holds `n` elements (contents not kept when it grows).
  void resize(std::size_t n) {
    mem_.reserve(n * sizeof(T));
    n_ = n;
  }
  T* data() const { return static_cast<T*>(mem_.get()); }
  std::size_t size() const { return n_; }
  /// Resizes to `host.size()` and copies it in.
  void upload(std::span<const T> host) {
    resize(host.size());
    if (!host.empty()) copy_to_device(data(), host.data(), host.size_bytes());
  }
  /// The first `n` elements (all by default) on the host.
  std::vector<T> download(std::size_t n = static_cast<std::size_t>(-1)) const {
    std::vector<T> out(std::min(n, n_));
    if (!out.empty()) copy_to_host(out.data(), data(), out.size() * sizeof(T));
    return out;
  }

 private:
  DeviceBytes mem_;
  std::size_t n_ = 0;
};

}  // namespace dltrain::gpu
