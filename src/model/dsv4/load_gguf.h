// Loading a DeepSeek-V4 model from one GGUF file (llama.cpp's `deepseek4`
// names and keys, any ggml weight type affinity can decode).
//
// Binding walks the same layout as the checkpoint loader (weights_bind.h), so a
// GGUF and a checkpoint directory of one model give identical ModelWeights
// apart from storage. GGUF dims are ggml order (ne[0] = contiguous), the
// reverse of the HF shapes: a Linear [out, in] is ne [in, out], a stacked
// expert projection ne [in, out, n_routed_experts] whose expert e is the
// contiguous slab of `out` rows at e * out * row_bytes.
//
// Accepted storage:
//   any Linear: F32 | F16 | BF16 (plain views), or any quantised ggml type with
//     a row dequantiser (Q8_0, K-quants, IQ types, MXFP4, ...) as kGgml rows
//   embedding: F32 | F16 | BF16, or quantised (ModelWeights::embed_rows)
//   norms, mHC params, sinks, ape, gate bias: F32 | F16 | BF16; a quantised
//     one (they are small) is dequantised once into memory owned by the model
//   tid2eid: I32 | I64 [ne: experts_per_tok, vocab], ids < n_routed_experts
// A file whose nextn_predict_layers says MTP but that carries no mtp.* tensors
// (ds4 ships MTP as a separate file) loads without the MTP block.
#pragma once

#include <memory>
#include <string>

#include "affinity/status.h"
#include "format/gguf_reader.h"
#include "model/dsv4/loaded_model.h"

namespace aff::dsv4 {

// Opens, validates and binds `path`. Errors name the file and the GGUF tensor
// (and the HF name it stands for), e.g. "m.gguf: tensor 'blk.3.attn_q_b.weight'
// (layers.3.attn.wq_b.weight): ne [96, 64] does not match the expected [128, 512]".
Result<std::unique_ptr<LoadedModel>> load_gguf_file(const std::string& path);

// The same from an already parsed file (kept alive by the returned model).
Result<std::unique_ptr<LoadedModel>> load_gguf(std::shared_ptr<const format::GgufFile> file);

// True when `path` names a GGUF file (by its magic), so callers can dispatch
// between a checkpoint directory and a container without trusting extensions.
bool is_gguf_file(const std::string& path);

}  // namespace aff::dsv4
