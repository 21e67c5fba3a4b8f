// Quantised GEMV for the CPU lane: y[r] = dot(W row r, x) with W stored in a ggml block
// format (one GGUF row per output) and x pre-quantised once per call (act_quant.h). This
// is what computes non-resident experts on the host, so it is written to stream weight
// bytes at memory bandwidth.
//
// Kernels are named <op>_<weightfmt>_<actfmt>_<isa> (gemv_q4k_q8k_avx512). Selection is a
// pure function of (weight type, CPU features); callers then just call the pointer.
//   scalar:  any CPU; dequantises each row and dots in f32 (the portable fallback)
//   avx2:    AVX2 + FMA + F16C
//   avx512:  AVX-512 F/BW/VL + VNNI (vpdpbusd) + BMI2; without VNNI the avx2 kernels run
//   avx512vbmi: the above + VBMI (byte permutes, vpmultishiftqb): the codebook formats
// AMX-INT8 (tile multiplies) only serves the batched gemm(), for Q8_0, Q2_K and Q4_K and
// from amx_min_tokens tokens on: for one activation vector (decode) a tile multiply buys
// nothing over VNNI while the weights stream from DRAM.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/cpu_features.h"
#include "quant/type_traits.h"

namespace aff::cpu {

enum class Isa { kScalar, kAvx2, kAvx512, kAvx512Vbmi };
std::string_view isa_name(Isa isa);
bool isa_supported(Isa isa, const CpuFeatures& f);

// w: rows × row_bytes bytes, row r at w + r*row_bytes, each row `cols` elements of the
//    kernel's weight type (cols a multiple of 256 for K/IQ types, 32 otherwise).
// act: the activation quantised with the kernel's ActFormat, `cols` elements.
// y: [rows] f32, overwritten.
using GemvFn = void (*)(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols, const void* act,
                        float* y);

// Batched form, with gemm()'s contract below: n tokens' activations at act + t*act_stride
// bytes, outputs at y + t*ldy. The weight decode is shared by the tokens.
using GemmFn = void (*)(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols, const void* act,
                        int64_t act_stride, int64_t n, float* y, int64_t ldy);

struct GemvKernel {
  std::string_view name;   // "gemv_q4k_q8k_avx512"
  quant::GgmlType weight;
  ActFormat act;
  Isa isa;
  GemvFn fn;
  GemmFn gemm_fn = nullptr;  // fused multi-token kernel; nullptr: gemm() calls fn per token
  // AMX-INT8 form of gemm_fn, used by gemm() for n >= amx_min_tokens where the CPU has
  // AMX (gemm_uses_amx); nullptr: none.
  GemmFn amx_fn = nullptr;
  int amx_min_tokens = 0;
};

// Weight types the CPU lane has kernels for (scalar, AVX2 and AVX-512 each): Q8_0, Q4_K,
// Q3_K, Q2_K, IQ4_XS, IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ1_M, MXFP4; the five codebook
// formats also AVX-512 VBMI, and Q8_0, Q2_K, Q4_K an AMX form of their gemm.
bool gemv_has_kernels(quant::GgmlType t);
// The activation format kernels for weight type t take (requires gemv_has_kernels(t)).
ActFormat gemv_act_format(quant::GgmlType t);
// Every compiled kernel for t, fastest ISA first (tests filter by isa_supported).
std::vector<GemvKernel> gemv_kernels(quant::GgmlType t);
// The best kernel for t on a CPU with features f; nullptr if t has no kernels.
const GemvKernel* select_gemv_kernel(quant::GgmlType t, const CpuFeatures& f);

// Runs k over all rows with up to n_threads OpenMP threads (rows split in contiguous
// ranges, so each thread streams its own part of W).
void gemv_parallel(const GemvKernel& k, const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols,
                   const void* act, float* y, int n_threads);

// Batched GEMV for a few tokens against one row block (prefill, experts hit by several
// tokens): y[t*ldy + r] = dot(W row r, act_t) for t < n, r < rows.
//   w, row_bytes, rows, cols: as for GemvFn;
//   act: n quantised activations (k.act format, `cols` elements each), act_t at
//        act + t*act_stride bytes;
//   y: row t of the output at y + t*ldy, `rows` floats each.
// The rows are walked in tiles small enough to stay in L2 while every token is applied,
// so the weights stream from memory once for all n tokens; kernels with a gemm_fn also
// decode each weight step once for up to four tokens. Every y value is bit-identical to
// what gemv gives for that token (same per-token arithmetic in the same order), except
// where gemm_uses_amx(k, n): the AMX kernels decode each weight block once for 16 tokens
// and give the same integer block dots, but sum them in f32 in another order, so their
// results differ from gemv's by f32 rounding. Either way a token's result does not
// depend on the other tokens, the row range or how the rows are split.
bool gemm_uses_amx(const GemvKernel& k, int64_t n);
void gemm(const GemvKernel& k, const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols, const void* act,
          int64_t act_stride, int64_t n, float* y, int64_t ldy);

}  // namespace aff::cpu
