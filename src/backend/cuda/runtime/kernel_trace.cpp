#include "backend/cuda/runtime/kernel_trace.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#if __has_include(<cupti_activity.h>)
#include <cupti_activity.h>
#include <cxxabi.h>
#include <dlfcn.h>
#define AFF_HAS_CUPTI_HEADERS 1
#endif

namespace aff::cuda {

#ifdef AFF_HAS_CUPTI_HEADERS
namespace {

// The CUPTI entry points used, resolved from the loaded library.
struct Cupti {
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
};

struct KernelRow {
  uint32_t launch, stream;
  uint64_t start, end;
  int grid, block;
  std::string name;
};

struct Trace {
  Cupti api;
  std::string path;
  std::mutex mu;
  std::vector<KernelRow> rows;
};

Trace& trace() {
  static Trace t;
  return t;
}

constexpr size_t kBufferBytes = size_t(8) << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  // CUPTI asks for 8-byte aligned buffers.
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

std::string demangled(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && d != nullptr ? d : name;
  std::free(d);
  // Template arguments, parameters, the return type and namespaces make rows
  // long; the kernel's own name says enough (commas would break the CSV).
  for (size_t at; (at = out.find("(anonymous namespace)::")) != std::string::npos;) out.erase(at, 23);
  out = out.substr(0, out.find_first_of("<("));
  const size_t scope = out.rfind("::");
  if (scope != std::string::npos) out = out.substr(scope + 2);
  const size_t space = out.rfind(' ');
  return space == std::string::npos ? out : out.substr(space + 1);
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  Trace& t = trace();
  {
    std::lock_guard<std::mutex> lock(t.mu);
    CUpti_Activity* rec = nullptr;
    while (t.api.next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
      if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
      // The fields read here sit at the same offsets in every kernel record
      // version since the fourth: the library loaded may be newer or older
      // than the header.
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      t.rows.push_back({k->correlationId, k->streamId, k->start, k->end, k->gridX * k->gridY * k->gridZ,
                        k->blockX * k->blockY * k->blockZ, demangled(k->name)});
    }
  }
  std::free(buffer);
}

void write_trace() {
  Trace& t = trace();
  t.api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(t.mu);
  std::FILE* f = std::fopen(t.path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "AFF_CUDA_TRACE: cannot write %s\n", t.path.c_str());
    return;
  }
  std::fprintf(f, "launch,stream,start_ns,end_ns,grid,block,name\n");
  for (const KernelRow& r : t.rows)
    std::fprintf(f, "%u,%u,%llu,%llu,%d,%d,%s\n", r.launch, r.stream, static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), r.grid, r.block, r.name.c_str());
  std::fclose(f);
  std::fprintf(stderr, "AFF_CUDA_TRACE: %zu kernels written to %s\n", t.rows.size(), t.path.c_str());
}

template <class F>
bool resolve(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr) std::fprintf(stderr, "AFF_CUDA_TRACE: %s not found in CUPTI\n", name);
  return fn != nullptr;
}

void start(const char* path) {
  const char* named = std::getenv("AFF_CUPTI_LIB");
  void* lib = nullptr;
  for (const char* candidate : {named, "libcupti.so", "libcupti.so.13", "libcupti.so.12"}) {
    if (candidate != nullptr && (lib = dlopen(candidate, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
  }
  if (lib == nullptr) {
    std::fprintf(stderr, "AFF_CUDA_TRACE: CUPTI not found (set AFF_CUPTI_LIB); not tracing\n");
    return;
  }
  Trace& t = trace();
  t.path = path;
  if (!resolve(lib, "cuptiActivityRegisterCallbacks", t.api.register_callbacks) ||
      !resolve(lib, "cuptiActivityEnable", t.api.enable) || !resolve(lib, "cuptiActivityFlushAll", t.api.flush_all) ||
      !resolve(lib, "cuptiActivityGetNextRecord", t.api.next_record))
    return;
  if (t.api.register_callbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      t.api.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "AFF_CUDA_TRACE: CUPTI refused kernel tracing; not tracing\n");
    return;
  }
  std::atexit(write_trace);
}

}  // namespace

#else

namespace {
void start(const char*) { std::fprintf(stderr, "AFF_CUDA_TRACE: built without CUPTI's headers; not tracing\n"); }
}  // namespace

#endif

void kernel_trace_from_env() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* path = std::getenv("AFF_CUDA_TRACE");
    if (path != nullptr && path[0] != '\0') start(path);
  });
}

}  // namespace aff::cuda
