// Owning handles for device memory, streams and events (RAII: freed/destroyed on
// destruction, movable, not copyable). Allocation failures come back as a
// Status naming what was being allocated and how much.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "affinity/status.h"

namespace aff::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // cudaMalloc of `bytes` (0 gives an empty buffer); `what` names it in errors.
  static Result<DeviceBuffer> allocate(size_t bytes, const std::string& what);

  void reset();
  void* data() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class Stream {
 public:
  Stream() = default;
  ~Stream();
  Stream(Stream&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream& operator=(Stream&& o) noexcept;

  static Result<Stream> create();
  cudaStream_t get() const { return s_; }
  Status synchronize() const;

 private:
  cudaStream_t s_ = nullptr;
};

// An event for ordering streams (no timing).
class Event {
 public:
  Event() = default;
  ~Event();
  Event(Event&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event& operator=(Event&& o) noexcept;

  static Result<Event> create();
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// `waiter` runs its later work after everything enqueued on `from` so far
// (recorded on `via`, which the call reuses). Captured into a graph, an edge.
Status stream_after(cudaStream_t waiter, cudaStream_t from, const Event& via);

// Host <-> device copies of typed arrays (synchronous with respect to the host).
Status copy_to_device(void* dst, const void* src, size_t bytes, const char* what);
Status copy_to_host(void* dst, const void* src, size_t bytes, const char* what);

// A device buffer holding a copy of `v`.
template <typename T>
Result<DeviceBuffer> upload_vector(const std::vector<T>& v, const std::string& what) {
  auto buf = DeviceBuffer::allocate(v.size() * sizeof(T), what);
  if (!buf.is_ok()) return buf.status();
  AFF_RETURN_IF_ERROR(copy_to_device(buf->data(), v.data(), v.size() * sizeof(T), what.c_str()));
  return std::move(buf).value();
}

// n elements of type T copied back from device pointer p.
template <typename T>
Result<std::vector<T>> download_vector(const T* p, size_t n, const char* what) {
  std::vector<T> v(n);
  AFF_RETURN_IF_ERROR(copy_to_host(v.data(), p, n * sizeof(T), what));
  return v;
}

// A bump allocator over one device allocation: many small tensors share one
// cudaMalloc (the full model has tens of thousands of expert tensors).
// Offsets are aligned to 256 bytes so vectorised (16-byte) loads stay aligned.
class DeviceArena {
 public:
  static constexpr size_t kAlign = 256;
  static size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

  Status reserve(size_t bytes, const std::string& what);
  // The next `bytes` of the arena (nullptr for 0 bytes); internal error when full.
  Result<void*> take(size_t bytes);
  size_t used() const { return used_; }
  size_t capacity() const { return buf_.bytes(); }

 private:
  DeviceBuffer buf_;
  size_t used_ = 0;
};

}  // namespace aff::cuda
