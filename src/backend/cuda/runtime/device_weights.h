// Weights as the CUDA kernels see them: plain structs of device pointers in the
// stored formats (FP8 E4M3 + E8M0 block scales, MXFP4 + E8M0, BF16/F16/F32, and
// ggml block formats from GGUF containers).
// Nothing here is dequantised: kernels decode while they read. These structs
// are passed to kernels by value, so they hold no owning members and include
// nothing but <cstdint>.
#pragma once

#include <cstdint>

namespace aff::cuda {

enum class DevFormat : int32_t {
  kF32,
  kBF16,
  kF16,
  kFP8Block,  // weight E4M3 [out, in]; scale [ceil(out/block), ceil(in/block)]
  kMXFP4,     // weight [out, in/2] (low nibble = even column); scale [out, in/32]
  kGgml,      // weight [out, row_bytes]: row r = ggml blocks of `in` elements, as stored in
              // GGUF; DeviceLinear::ggml_type says which block format (quant::GgmlType id)
  kQ8,        // weight int8 [out, in] (codes), scale f16 [out, in/32]: a Q8_0 tensor's blocks
              // split at upload into their codes and their scales (the same bytes); in % 64
              // == 0, codes placed within each 64 columns by q8_code_at (below)
};

enum class DevScale : int32_t { kNone, kE8M0, kF32, kBF16, kF16 };

// One 2-D weight [out, in] (row-major, rows = outputs).
struct DeviceLinear {
  const uint8_t* weight = nullptr;  // device address (or host-mapped, for a later tier engine)
  const uint8_t* scale = nullptr;   // kFP8Block / kMXFP4 / kQ8 only
  DevFormat format = DevFormat::kBF16;
  DevScale scale_type = DevScale::kNone;
  int64_t out = 0;
  int64_t in = 0;
  int32_t block = 128;       // kFP8Block tile edge
  int64_t scale_cols = 0;    // columns of the scale matrix (kMXFP4, kQ8: in / 32)
  // kGgml only. The codebook formats (IQ*) and the non-linear 4-bit ones need the
  // device copy of ggml's tables (kernels/common/ggml_tables.h), so every kGgml
  // weight carries a pointer to it and a kernel needs nothing but this struct.
  int32_t ggml_type = -1;            // quant::GgmlType id of every row
  int64_t row_bytes = 0;             // bytes of one stored row (in / block_elems * block_bytes)
  const uint8_t* tables = nullptr;   // device GgmlTables
};

// Where kQ8 stores the code of column `col` of a row: within each 64 columns,
// 16-byte quarter c holds columns [8c, 8c + 8) and then [32 + 8c, 40 + 8c), so
// a lane's one 16-byte load feeds tensor-core fragments whose 16 columns each
// lie in one 32-column scale group (kernels/gemv/gemv_mma.cu).
#if defined(__CUDACC__)
__host__ __device__
#endif
inline int64_t q8_code_at(int64_t col) {
  const int64_t j = col & 63;
  return (col - j) + 16 * ((j & 31) >> 3) + 8 * (j >> 5) + (j & 7);
}

// Bytes of a weight's stored values (block scales not counted): what an L2
// prefetch of the weight asks for.
inline int64_t stored_bytes(const DeviceLinear& w) {
  switch (w.format) {
    case DevFormat::kF32: return w.out * w.in * 4;
    case DevFormat::kBF16:
    case DevFormat::kF16: return w.out * w.in * 2;
    case DevFormat::kFP8Block:
    case DevFormat::kQ8: return w.out * w.in;
    case DevFormat::kMXFP4: return w.out * w.in / 2;
    case DevFormat::kGgml: return w.out * w.row_bytes;
  }
  return 0;
}

// An expert is three weights; a layer's experts live in a table of slots
// indexed by expert id. The table is what kernels read, so an expert can be
// moved (VRAM <-> pinned host memory) by rewriting its slot and nothing else.
struct ExpertSlot {
  DeviceLinear w1;  // gate [moe_inter, D]
  DeviceLinear w3;  // up   [moe_inter, D]
  DeviceLinear w2;  // down [D, moe_inter]
};

}  // namespace aff::cuda
