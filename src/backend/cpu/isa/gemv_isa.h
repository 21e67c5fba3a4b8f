// The per-ISA GEMV kernels behind backend/cpu/gemv.h. Each ISA lives in its own
// translation unit compiled for that ISA (GCC target pragmas), and is only ever called
// after select_gemv_kernel checked the CPU; the signature is GemvFn's.
#pragma once

#include <cstdint>

namespace aff::cpu::isa {

#define AFF_GEMV_DECL(name) \
  void name(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols, const void* act, float* y)

AFF_GEMV_DECL(gemv_q8_0_q8_0_scalar);
AFF_GEMV_DECL(gemv_q4k_q8k_scalar);
AFF_GEMV_DECL(gemv_q2k_q8k_scalar);
AFF_GEMV_DECL(gemv_iq2xxs_q8k_scalar);
AFF_GEMV_DECL(gemv_mxfp4_q8_0_scalar);
AFF_GEMV_DECL(gemv_q3k_q8k_scalar);
AFF_GEMV_DECL(gemv_iq4xs_q8k_scalar);
AFF_GEMV_DECL(gemv_iq2xs_q8k_scalar);
AFF_GEMV_DECL(gemv_iq3xxs_q8k_scalar);
AFF_GEMV_DECL(gemv_iq1s_q8k_scalar);
AFF_GEMV_DECL(gemv_iq1m_q8k_scalar);

AFF_GEMV_DECL(gemv_q8_0_q8_0_avx2);
AFF_GEMV_DECL(gemv_q4k_q8k_avx2);
AFF_GEMV_DECL(gemv_q2k_q8k_avx2);
AFF_GEMV_DECL(gemv_iq2xxs_q8k_avx2);
AFF_GEMV_DECL(gemv_mxfp4_q8_0_avx2);
AFF_GEMV_DECL(gemv_q3k_q8k_avx2);
AFF_GEMV_DECL(gemv_iq4xs_q8k_avx2);
AFF_GEMV_DECL(gemv_iq2xs_q8k_avx2);
AFF_GEMV_DECL(gemv_iq3xxs_q8k_avx2);
AFF_GEMV_DECL(gemv_iq1s_q8k_avx2);
AFF_GEMV_DECL(gemv_iq1m_q8k_avx2);

AFF_GEMV_DECL(gemv_q8_0_q8_0_avx512);
AFF_GEMV_DECL(gemv_q4k_q8k_avx512);
AFF_GEMV_DECL(gemv_q2k_q8k_avx512);
AFF_GEMV_DECL(gemv_iq2xxs_q8k_avx512);
AFF_GEMV_DECL(gemv_mxfp4_q8_0_avx512);
AFF_GEMV_DECL(gemv_q3k_q8k_avx512);
AFF_GEMV_DECL(gemv_iq4xs_q8k_avx512);
AFF_GEMV_DECL(gemv_iq2xs_q8k_avx512);
AFF_GEMV_DECL(gemv_iq3xxs_q8k_avx512);
AFF_GEMV_DECL(gemv_iq1s_q8k_avx512);
AFF_GEMV_DECL(gemv_iq1m_q8k_avx512);

AFF_GEMV_DECL(gemv_iq2xxs_q8kt_avx512vbmi);
AFF_GEMV_DECL(gemv_iq2xs_q8kt_avx512vbmi);
AFF_GEMV_DECL(gemv_iq3xxs_q8kt_avx512vbmi);
AFF_GEMV_DECL(gemv_iq1s_q8kt_avx512vbmi);
AFF_GEMV_DECL(gemv_iq1m_q8kt_avx512vbmi);

// Batched kernels (GemmFn): one pass over the rows for n tokens, decode shared.
#define AFF_GEMM_DECL(name)                                                                                  \
  void name(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols, const void* act, int64_t act_stride, \
            int64_t n, float* y, int64_t ldy)

AFF_GEMM_DECL(gemm_q8_0_q8_0_avx512);
AFF_GEMM_DECL(gemm_q4k_q8k_avx512);
AFF_GEMM_DECL(gemm_q2k_q8k_avx512);
AFF_GEMM_DECL(gemm_iq2xxs_q8k_avx512);
AFF_GEMM_DECL(gemm_mxfp4_q8_0_avx512);
AFF_GEMM_DECL(gemm_q3k_q8k_avx512);
AFF_GEMM_DECL(gemm_iq4xs_q8k_avx512);
AFF_GEMM_DECL(gemm_iq2xs_q8k_avx512);
AFF_GEMM_DECL(gemm_iq3xxs_q8k_avx512);
AFF_GEMM_DECL(gemm_iq1s_q8k_avx512);
AFF_GEMM_DECL(gemm_iq1m_q8k_avx512);
AFF_GEMM_DECL(gemm_iq2xxs_q8kt_avx512vbmi);
AFF_GEMM_DECL(gemm_iq2xs_q8kt_avx512vbmi);
AFF_GEMM_DECL(gemm_iq3xxs_q8kt_avx512vbmi);
AFF_GEMM_DECL(gemm_iq1s_q8kt_avx512vbmi);
AFF_GEMM_DECL(gemm_iq1m_q8kt_avx512vbmi);

// AMX-INT8 (gemm_amx.cpp): the same batched product with tile multiplies; *_amxemu runs
// the identical code against a C++ model of the tile instructions (tests, any CPU with
// AVX-512 VBMI).
AFF_GEMM_DECL(gemm_q8_0_q8_0_amx);
AFF_GEMM_DECL(gemm_q2k_q8k_amx);
AFF_GEMM_DECL(gemm_q4k_q8k_amx);
AFF_GEMM_DECL(gemm_q8_0_q8_0_amxemu);
AFF_GEMM_DECL(gemm_q2k_q8k_amxemu);
AFF_GEMM_DECL(gemm_q4k_q8k_amxemu);

#undef AFF_GEMM_DECL
#undef AFF_GEMV_DECL

// Stand-ins for the ISA kernels on targets that cannot compile them (the
// selector, isa_supported, never picks them there). Same signatures as above.
#define AFF_UNREACHABLE_GEMV(name) \
  void name(const uint8_t*, int64_t, int64_t, int64_t, const void*, float*) { __builtin_trap(); }
#define AFF_UNREACHABLE_GEMM(name)                                                              \
  void name(const uint8_t*, int64_t, int64_t, int64_t, const void*, int64_t, int64_t, float*, int64_t) { \
    __builtin_trap();                                                                            \
  }

}  // namespace aff::cpu::isa
