#include "backend/cuda/runtime/device_buffer.h"

#include "backend/cuda/runtime/cuda_check.h"

namespace aff::cuda {

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    ptr_ = o.ptr_, bytes_ = o.bytes_;
    o.ptr_ = nullptr, o.bytes_ = 0;
  }
  return *this;
}

Result<DeviceBuffer> DeviceBuffer::allocate(size_t bytes, const std::string& what) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  const cudaError_t err = cudaMalloc(&b.ptr_, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();  // an allocation failure is not sticky; clear it
    b.ptr_ = nullptr;
    return out_of_range("CUDA: cannot allocate " + std::to_string(bytes) + " bytes of device memory for " +
                        what + ": " + cudaGetErrorString(err));
  }
  b.bytes_ = bytes;
  return b;
}

void DeviceBuffer::reset() {
  if (ptr_) cudaFree(ptr_);  // errors at teardown cannot be reported anywhere useful
  ptr_ = nullptr;
  bytes_ = 0;
}

Stream::~Stream() {
  if (s_) cudaStreamDestroy(s_);
}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    if (s_) cudaStreamDestroy(s_);
    s_ = o.s_;
    o.s_ = nullptr;
  }
  return *this;
}

Result<Stream> Stream::create() {
  Stream s;
  // A blocking stream: it orders with the legacy default stream, so the plain
  // cudaMemcpy calls of uploads and checks never race its kernels. (Graph
  // capture of decode will move every copy onto the stream and can then drop this.)
  AFF_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s.s_, cudaStreamDefault));
  return s;
}

Event::~Event() {
  if (e_) cudaEventDestroy(e_);
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (e_) cudaEventDestroy(e_);
    e_ = o.e_;
    o.e_ = nullptr;
  }
  return *this;
}

Result<Event> Event::create() {
  Event e;
  AFF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e.e_, cudaEventDisableTiming));
  return e;
}

Status stream_after(cudaStream_t waiter, cudaStream_t from, const Event& via) {
  AFF_RETURN_IF_ERROR(cuda_status(cudaEventRecord(via.get(), from), "cudaEventRecord"));
  return cuda_status(cudaStreamWaitEvent(waiter, via.get(), 0), "cudaStreamWaitEvent");
}

Status Stream::synchronize() const { return cuda_status(cudaStreamSynchronize(s_), "cudaStreamSynchronize"); }

Status copy_to_device(void* dst, const void* src, size_t bytes, const char* what) {
  if (bytes == 0) return Status::ok();
  return cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), what);
}

Status copy_to_host(void* dst, const void* src, size_t bytes, const char* what) {
  if (bytes == 0) return Status::ok();
  return cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), what);
}

Status DeviceArena::reserve(size_t bytes, const std::string& what) {
  auto b = DeviceBuffer::allocate(bytes, what);
  if (!b.is_ok()) return b.status();
  buf_ = std::move(b).value();
  used_ = 0;
  return Status::ok();
}

Result<void*> DeviceArena::take(size_t bytes) {
  if (bytes == 0) return static_cast<void*>(nullptr);
  const size_t n = aligned(bytes);
  if (used_ + n > buf_.bytes())
    return internal_error("device arena: " + std::to_string(n) + " more bytes needed, " +
                          std::to_string(buf_.bytes() - used_) + " left");
  void* p = static_cast<uint8_t*>(buf_.data()) + used_;
  used_ += n;
  return p;
}

}  // namespace aff::cuda
