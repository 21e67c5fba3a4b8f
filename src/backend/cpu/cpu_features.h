// What the running CPU can execute, read once from cpuid/xgetbv. The fast CPU lane picks
// its kernels from this at run time, so one binary runs on any x86-64 host: a build never
// assumes an ISA the machine it runs on may lack.
#pragma once

#include <string>

namespace aff::cpu {

struct CpuFeatures {
  bool avx2 = false;        // AVX2 + FMA + F16C, with OS-saved YMM state
  bool avx512 = false;      // AVX-512 F/BW/VL (+BMI2), with OS-saved ZMM state
  bool avx512_vnni = false; // AVX-512 VNNI (vpdpbusd)
  bool avx512_vbmi = false; // AVX-512 VBMI (vpermb, vpermi2b, vpmultishiftqb) + GFNI
                            // (gf2p8affineqb), with VNNI
  bool amx_int8 = false;    // AMX tiles with int8, enabled by the OS and permitted for this
                            // process (Linux: arch_prctl(ARCH_REQ_XCOMP_PERM) granted)
};

// Features of this CPU (cached after the first call).
const CpuFeatures& cpu_features();

// The features with the ones named in `disable` turned off: a comma list of
// "avx512", "vnni", "vbmi", "amx", "avx2" (used by tests and benchmarks to force a lane).
CpuFeatures cpu_features_without(const CpuFeatures& f, const std::string& disable);

// "avx2 avx512 avx512_vnni" style summary for logs and benchmark headers.
std::string cpu_features_string(const CpuFeatures& f);

}  // namespace aff::cpu
