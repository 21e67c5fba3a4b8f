#include "checkpoint_to_gguf.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "backend/ref/linear.h"
#include "core/dtype.h"
#include "format/gguf_dsv4_names.h"
#include "format/gguf_writer.h"
#include "format/tensor_index.h"
#include "model/dsv4/config_gguf.h"
#include "model/dsv4/config_json.h"
#include "model/dsv4/tokenizer_gguf.h"
#include "model/dsv4/weights_bind.h"
#include "quant/blocks.h"
#include "quant/codec.h"

namespace aff::test {

namespace {

namespace fs = std::filesystem;
using quant::GgmlType;

// One source piece of a GGUF tensor: a Linear (or one expert of a stack) or a plain tensor.
struct Piece {
  dsv4::Linear linear;  // valid for Linear pieces
  TensorView plain;     // valid for plain tensors
};

struct Planned {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> ne;
  std::vector<Piece> pieces;  // 1, or n_routed_experts for stacked experts (index = expert)
  bool q8_source = false;     // rows go through Q8_0 (stored as Q8_0, or decoded to F32)
};

class Planner final : public dsv4::LayoutVisitor {
 public:
  Planner(const dsv4::ModelConfig& c, const format::TensorIndex& index, const CheckpointToGgufOptions& o)
      : c_(c), index_(index), o_(o) {}

  Status linear(const std::string& stem, int64_t out, int64_t in, dsv4::LinearKind, dsv4::Linear* dst) override {
    AFF_ASSIGN_OR_RETURN(TensorView w, index_.get(stem + ".weight"));
    dsv4::Linear l;
    l.weight = w;
    l.out = out;
    l.in = in;
    l.block = dst->block;
    GgmlType type;
    switch (w.dtype) {
      case DType::kF32: l.format = dsv4::WeightFormat::kF32; type = GgmlType::kF32; break;
      case DType::kBF16: l.format = dsv4::WeightFormat::kBF16; type = GgmlType::kBF16; break;
      case DType::kF16: l.format = dsv4::WeightFormat::kF16; type = GgmlType::kF16; break;
      case DType::kF8E4M3:
        l.format = dsv4::WeightFormat::kFP8Block;
        type = o_.dense_q8_0 && in % 32 == 0 ? GgmlType::kQ8_0 : GgmlType::kBF16;
        break;
      case DType::kI8: l.format = dsv4::WeightFormat::kMXFP4; type = GgmlType::kMXFP4; break;
      default: return unsupported(fmt::format("converter: '{}' has dtype {}", w.name, dtype_name(w.dtype)));
    }
    if (l.format == dsv4::WeightFormat::kFP8Block || l.format == dsv4::WeightFormat::kMXFP4) {
      AFF_ASSIGN_OR_RETURN(l.scale, index_.get(stem + ".scale"));
    }
    const auto g = format::dsv4_gguf_name(stem + ".weight");
    if (!g) return unsupported("converter: no GGUF name for " + stem);
    const bool expert = g->kind == format::Dsv4GgufName::Kind::kExpertSlice;
    const bool q8 = type == GgmlType::kQ8_0;
    if (q8 && o_.q8_0_decoded_as_f32) type = GgmlType::kF32;
    Planned& p = entry(g->gguf, type, expert ? std::vector<int64_t>{in, out, c_.n_routed_experts}
                                             : std::vector<int64_t>{in, out});
    p.q8_source = q8;
    p.pieces.resize(expert ? size_t(c_.n_routed_experts) : 1);
    p.pieces[expert ? size_t(g->expert) : 0].linear = l;
    return Status::ok();
  }

  Status tensor(const std::string& name, dsv4::TensorKind, const std::vector<int64_t>& shape,
                TensorView*) override {
    AFF_ASSIGN_OR_RETURN(TensorView t, index_.get(name));
    GgmlType type;
    switch (t.dtype) {
      case DType::kF32: type = GgmlType::kF32; break;
      case DType::kBF16: type = GgmlType::kBF16; break;
      case DType::kF16: type = GgmlType::kF16; break;
      case DType::kI32: case DType::kI64: type = GgmlType::kI32; break;
      default: return unsupported(fmt::format("converter: '{}' has dtype {}", name, dtype_name(t.dtype)));
    }
    const bool q8 = name == "embed.weight" && o_.embed_q8_0;
    if (q8) type = o_.q8_0_decoded_as_f32 ? GgmlType::kF32 : GgmlType::kQ8_0;
    const auto g = format::dsv4_gguf_name(name);
    if (!g) return unsupported("converter: no GGUF name for " + name);
    Planned& p = entry(g->gguf, type, {shape.rbegin(), shape.rend()});
    p.q8_source = q8;
    p.pieces.resize(1);
    p.pieces[0].plain = t;
    return Status::ok();
  }

  std::vector<Planned> plan;

 private:
  Planned& entry(const std::string& name, GgmlType type, std::vector<int64_t> ne) {
    auto it = by_name_.find(name);
    if (it != by_name_.end()) return plan[it->second];
    by_name_[name] = plan.size();
    plan.push_back({name, type, std::move(ne), {}});
    return plan.back();
  }

  const dsv4::ModelConfig& c_;
  const format::TensorIndex& index_;
  const CheckpointToGgufOptions& o_;
  std::map<std::string, size_t> by_name_;
};

// Q8_0 bytes of row, or (as_f32) the F32 bytes of those Q8_0 values decoded.
Status emit_q8_0(std::span<const float> row, bool as_f32, std::vector<uint8_t>& out) {
  std::vector<uint8_t> q(size_t(*quant::ggml_row_bytes(GgmlType::kQ8_0, int64_t(row.size()))));
  AFF_RETURN_IF_ERROR(quant::quantize_row(GgmlType::kQ8_0, row, q));
  if (!as_f32) {
    out.insert(out.end(), q.begin(), q.end());
    return Status::ok();
  }
  std::vector<float> back(row.size());
  AFF_RETURN_IF_ERROR(quant::dequantize_row(GgmlType::kQ8_0, q, back));
  const auto* b = reinterpret_cast<const uint8_t*>(back.data());
  out.insert(out.end(), b, b + back.size() * 4);
  return Status::ok();
}

// HF MXFP4 row (bytes: low nibble = even column; one E8M0 per 32) -> ggml
// MXFP4 blocks (e, then qs[j] = code(j) | code(j + 16) << 4). Same codes and
// scale, so the values are identical.
void repack_mxfp4_row(const dsv4::Linear& l, int64_t row, std::vector<uint8_t>& out) {
  const uint8_t* p = l.weight.data + row * (l.in / 2);
  const uint8_t* s = l.scale.data + row * (l.in / 32);
  auto code = [&](int64_t i) { return uint8_t((p[i / 2] >> (4 * (i % 2))) & 0xf); };
  for (int64_t b = 0; b < l.in / 32; ++b) {
    out.push_back(s[b]);
    for (int j = 0; j < 16; ++j) out.push_back(uint8_t(code(b * 32 + j) | code(b * 32 + j + 16) << 4));
  }
}

Status write_piece(format::GgufWriter& w, const Planned& p, const Piece& piece, bool as_f32) {
  std::vector<uint8_t> bytes;
  if (piece.plain.valid()) {
    const TensorView& t = piece.plain;
    if (p.type == GgmlType::kI32 && t.dtype == DType::kI64) {
      for (int64_t i = 0; i < t.numel(); ++i) {
        const int32_t v = int32_t(t.as<int64_t>()[i]);
        const auto* b = reinterpret_cast<const uint8_t*>(&v);
        bytes.insert(bytes.end(), b, b + 4);
      }
    } else if (p.q8_source) {
      const int64_t n = p.ne[0];
      std::vector<float> row(static_cast<size_t>(n));
      for (int64_t r = 0; r < t.numel() / n; ++r) {
        for (int64_t i = 0; i < n; ++i) {
          row[size_t(i)] = t.dtype == DType::kBF16 ? bf16_to_f32(t.as<uint16_t>()[r * n + i]) : t.as<float>()[r * n + i];
        }
        AFF_RETURN_IF_ERROR(emit_q8_0(row, as_f32, bytes));
      }
    } else {
      bytes.assign(t.data, t.data + t.nbytes);
    }
    return w.append(bytes);
  }
  const dsv4::Linear& l = piece.linear;
  if (!l.valid()) return internal_error("converter: missing expert in " + p.name);
  std::vector<float> row(static_cast<size_t>(l.in));
  for (int64_t r = 0; r < l.out; ++r) {
    bytes.clear();
    if (l.format == dsv4::WeightFormat::kMXFP4) {
      repack_mxfp4_row(l, r, bytes);
    } else if (p.type == GgmlType::kBF16 && l.format == dsv4::WeightFormat::kFP8Block) {
      ref::linear_dequant_row(l, r, row.data());
      for (float v : row) {
        const uint16_t b = f32_to_bf16(v);
        bytes.push_back(uint8_t(b));
        bytes.push_back(uint8_t(b >> 8));
      }
    } else if (p.q8_source) {
      ref::linear_dequant_row(l, r, row.data());
      AFF_RETURN_IF_ERROR(emit_q8_0(row, as_f32, bytes));
    } else {  // plain float: same bytes
      const uint64_t rb = l.weight.nbytes / uint64_t(l.out);
      bytes.assign(l.weight.data + r * rb, l.weight.data + (r + 1) * rb);
    }
    AFF_RETURN_IF_ERROR(w.append(bytes));
  }
  return Status::ok();
}

}  // namespace

Status checkpoint_to_gguf(const std::string& dir, const std::string& out_path, const CheckpointToGgufOptions& o) {
  AFF_ASSIGN_OR_RETURN(dsv4::ModelConfig cfg, dsv4::load_config_json((fs::path(dir) / "config.json").string()));
  AFF_ASSIGN_OR_RETURN(format::TensorIndex index, format::TensorIndex::open_dir(dir));
  Planner planner(cfg, index, o);
  dsv4::ModelWeights scratch;
  AFF_RETURN_IF_ERROR(dsv4::walk_checkpoint_layout(cfg, planner, &scratch));

  format::GgufWriter w(out_path);
  AFF_RETURN_IF_ERROR(w.set("general.name", format::GgufValue::string(fs::path(dir).filename().string())));
  AFF_RETURN_IF_ERROR(dsv4::config_to_gguf(cfg, w));
  const fs::path tok = fs::path(dir) / "tokenizer.json";
  if (o.with_tokenizer && fs::exists(tok)) {
    std::ifstream in(tok, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    AFF_ASSIGN_OR_RETURN(dsv4::GgufMetadata meta, dsv4::tokenizer_gguf_metadata(ss.str(), tok.string(), cfg.vocab_size));
    for (auto& [k, v] : meta) AFF_RETURN_IF_ERROR(w.set(k, v));
  }
  for (const Planned& p : planner.plan) AFF_RETURN_IF_ERROR(w.add_tensor(p.name, p.type, p.ne));
  AFF_RETURN_IF_ERROR(w.write_header());
  for (const Planned& p : planner.plan) {
    for (const Piece& piece : p.pieces) AFF_RETURN_IF_ERROR(write_piece(w, p, piece, o.q8_0_decoded_as_f32));
  }
  return w.finish();
}

}  // namespace aff::test
