#include "backend/cpu/cpu_features.h"

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define AFF_CPU_X86 1
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace aff::cpu {
namespace {

#ifdef AFF_CPU_X86
// XCR0: which register states the OS saves on context switch. A CPU may support AVX-512
// while the OS leaves ZMM state unsaved, in which case the instructions must not be used.
uint64_t read_xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

// Linux keeps the 8 KiB AMX tile state out of a process's signal frames and context
// switches until the process asks for it; a tile instruction without that permission
// faults. Granted once per process, for all its threads.
bool request_tile_data() {
#if defined(__linux__) && defined(__x86_64__)
  constexpr long kArchReqXcompPerm = 0x1023;  // ARCH_REQ_XCOMP_PERM
  constexpr long kXfeatureXtiledata = 18;     // XFEATURE_XTILEDATA
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1;
  const bool fma = (c >> 12) & 1;
  const bool f16c = (c >> 29) & 1;
  const bool avx = (c >> 28) & 1;
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = read_xcr0();
  const bool ymm_saved = (xcr0 & 0x6) == 0x6;
  const bool zmm_saved = (xcr0 & 0xe6) == 0xe6;
  const bool tile_saved = (xcr0 & 0x60000) == 0x60000;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  const bool avx2 = (b >> 5) & 1;
  const bool bmi2 = (b >> 8) & 1;
  const bool avx512f = (b >> 16) & 1;
  const bool avx512bw = (b >> 30) & 1;
  const bool avx512vl = (b >> 31) & 1;
  const bool vnni = (c >> 11) & 1;
  const bool vbmi = (c >> 1) & 1;
  const bool gfni = (c >> 8) & 1;
  const bool amx_tile = (d >> 24) & 1;
  const bool amx_int8 = (d >> 25) & 1;
  f.avx2 = ymm_saved && avx2 && fma && f16c;
  f.avx512 = f.avx2 && bmi2 && zmm_saved && avx512f && avx512bw && avx512vl;
  f.avx512_vnni = f.avx512 && vnni;
  f.avx512_vbmi = f.avx512_vnni && vbmi && gfni;  // the VBMI kernels also use gf2p8affineqb
  f.amx_int8 = tile_saved && amx_tile && amx_int8 && f.avx512 && request_tile_data();
  return f;
}
#else
CpuFeatures detect() { return {}; }
#endif

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

CpuFeatures cpu_features_without(const CpuFeatures& f, const std::string& disable) {
  CpuFeatures out = f;
  size_t pos = 0;
  while (pos <= disable.size()) {
    const size_t comma = disable.find(',', pos);
    const std::string item = disable.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (item == "avx2") out = CpuFeatures{};
    if (item == "avx512") out.avx512 = out.avx512_vnni = out.avx512_vbmi = out.amx_int8 = false;
    if (item == "amx") out.amx_int8 = false;
    if (item == "vnni") out.avx512_vnni = out.avx512_vbmi = false;
    if (item == "vbmi") out.avx512_vbmi = false;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

std::string cpu_features_string(const CpuFeatures& f) {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(f.avx2, "avx2");
  add(f.avx512, "avx512");
  add(f.avx512_vnni, "avx512_vnni");
  add(f.avx512_vbmi, "avx512_vbmi");
  add(f.amx_int8, "amx_int8");
  return s.empty() ? "scalar" : s;
}

}  // namespace aff::cpu
