#include "backend/cuda/runtime/device_model.h"

#include <cstring>
#include <string>

#include "backend/cuda/kernels/common/ggml_tables.h"
#include "backend/cuda/kernels/gemv/gemv.h"
#include "backend/cuda/kernels/moe/moe.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "core/dtype.h"
#include "quant/blocks.h"
#include "quant/codec.h"
#include "quant/type_traits.h"

namespace aff::cuda {

Result<std::vector<float>> tensor_f32_host(const TensorView& t) {
  const int64_t n = t.numel();
  std::vector<float> out(static_cast<size_t>(n));
  switch (t.dtype) {
    case DType::kF32: std::memcpy(out.data(), t.data, size_t(n) * 4); break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) out[size_t(i)] = bf16_to_f32(t.as<uint16_t>()[i]);
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) out[size_t(i)] = f16_to_f32(t.as<uint16_t>()[i]);
      break;
    default:
      return unsupported(t.file + ": tensor '" + t.name + "': dtype " + std::string(dtype_name(t.dtype)) +
                         " is not a float type the CUDA backend reads");
  }
  return out;
}

bool ggml_type_on_device(int ggml_type) {
  switch (quant::GgmlType(ggml_type)) {
    case quant::GgmlType::kQ8_0:
    case quant::GgmlType::kQ2_K:
    case quant::GgmlType::kQ3_K:
    case quant::GgmlType::kQ4_K:
    case quant::GgmlType::kQ5_K:
    case quant::GgmlType::kQ6_K:
    case quant::GgmlType::kIQ1_S:
    case quant::GgmlType::kIQ1_M:
    case quant::GgmlType::kIQ2_XXS:
    case quant::GgmlType::kIQ2_XS:
    case quant::GgmlType::kIQ3_XXS:
    case quant::GgmlType::kIQ4_NL:
    case quant::GgmlType::kIQ4_XS:
    case quant::GgmlType::kMXFP4: return true;
    default: return false;
  }
}

namespace {

Result<DevScale> scale_type_of(const TensorView& s) {
  switch (s.dtype) {
    case DType::kF8E8M0: return DevScale::kE8M0;
    case DType::kF32: return DevScale::kF32;
    case DType::kBF16: return DevScale::kBF16;
    default: break;
  }
  return unsupported(s.file + ": tensor '" + s.name + "': scale dtype " + std::string(dtype_name(s.dtype)) +
                     " is not supported by the CUDA backend");
}

// The device description of w with null pointers (filled by the uploader).
Result<DeviceLinear> describe(const dsv4::Linear& w) {
  DeviceLinear d;
  d.out = w.out;
  d.in = w.in;
  d.block = w.block;
  switch (w.format) {
    case dsv4::WeightFormat::kF32: d.format = DevFormat::kF32; break;
    case dsv4::WeightFormat::kBF16: d.format = DevFormat::kBF16; break;
    case dsv4::WeightFormat::kF16: d.format = DevFormat::kF16; break;
    case dsv4::WeightFormat::kFP8Block:
      d.format = DevFormat::kFP8Block;
      d.scale_cols = (w.in + w.block - 1) / w.block;
      break;
    case dsv4::WeightFormat::kMXFP4:
      if (w.in % 32 != 0)
        return corrupt(w.weight.file + ": tensor '" + w.weight.name + "': MXFP4 row length " +
                       std::to_string(w.in) + " is not a multiple of 32");
      d.format = DevFormat::kMXFP4;
      d.scale_cols = w.in / 32;
      break;
    case dsv4::WeightFormat::kGgml: {
      const std::string where = w.weight.file + ": tensor '" + w.weight.name + "'";
      const auto traits = quant::ggml_type_traits(uint32_t(w.ggml_type));
      if (!traits) return corrupt(where + ": unknown ggml type id " + std::to_string(w.ggml_type));
      if (!ggml_type_on_device(w.ggml_type))
        return unsupported(where + ": ggml type " + std::string(traits->name) +
                           " is not read by the CUDA backend (supported: Q8_0, Q2_K..Q6_K, IQ1_S, IQ1_M, "
                           "IQ2_XXS, IQ2_XS, IQ3_XXS, IQ4_NL, IQ4_XS, MXFP4)");
      const auto row_bytes = quant::ggml_row_bytes(traits->type, w.in);
      if (!row_bytes || w.weight.shape.size() != 2 || w.weight.shape[0] != w.out || w.weight.shape[1] != *row_bytes ||
          w.weight.nbytes != uint64_t(w.out * *row_bytes))
        return corrupt(where + ": stored bytes do not match " + std::to_string(w.out) + " rows of " +
                       std::to_string(w.in) + " " + std::string(traits->name) + " elements");
      d.format = DevFormat::kGgml;
      d.ggml_type = w.ggml_type;
      d.row_bytes = *row_bytes;
      AFF_ASSIGN_OR_RETURN(const GgmlTables* tables, ggml_device_tables());
      d.tables = reinterpret_cast<const uint8_t*>(tables);
      break;
    }
  }
  if (d.format == DevFormat::kFP8Block || d.format == DevFormat::kMXFP4) {
    if (!w.scale.valid())
      return corrupt(w.weight.file + ": tensor '" + w.weight.name + "': quantised weight without a scale");
    AFF_ASSIGN_OR_RETURN(d.scale_type, scale_type_of(w.scale));
  }
  return d;
}

}  // namespace

// Walks the model twice with the same code: once measuring (no device
// memory touched), once copying into an arena of exactly the measured size.
class ModelUploader {
 public:
  ModelUploader(DeviceArena* arena) : arena_(arena) {}
  size_t measured() const { return bytes_; }

  Result<const uint8_t*> raw(const void* src, size_t nbytes, const std::string& what) {
    if (!arena_) {
      bytes_ += DeviceArena::aligned(nbytes);
      return static_cast<const uint8_t*>(nullptr);
    }
    AFF_ASSIGN_OR_RETURN(void* p, arena_->take(nbytes));
    AFF_RETURN_IF_ERROR(copy_to_device(p, src, nbytes, what.c_str()));
    return static_cast<const uint8_t*>(p);
  }

  Result<const float*> f32(const TensorView& t) {
    if (!t.valid()) return static_cast<const float*>(nullptr);
    AFF_ASSIGN_OR_RETURN(std::vector<float> v, tensor_f32_host(t));
    AFF_ASSIGN_OR_RETURN(const uint8_t* p, raw(v.data(), v.size() * 4, t.name));
    return reinterpret_cast<const float*>(p);
  }

  // w in its stored format (routed experts keep the container's bytes: the
  // expert tiers move them as they are).
  Result<DeviceLinear> stored(const dsv4::Linear& w) {
    if (!w.valid()) return DeviceLinear{};
    AFF_ASSIGN_OR_RETURN(DeviceLinear d, describe(w));
    AFF_ASSIGN_OR_RETURN(d.weight, raw(w.weight.data, w.weight.nbytes, w.weight.name));
    if (w.scale.valid()) {
      AFF_ASSIGN_OR_RETURN(d.scale, raw(w.scale.data, w.scale.nbytes, w.scale.name));
    }
    return d;
  }

  // A dense weight: as stored, except Q8_0 with rows of whole 64-column steps,
  // whose blocks are split into their codes and their scales (DevFormat::kQ8,
  // the same bytes), the layout the tensor-core GEMV reads.
  Result<DeviceLinear> linear(const dsv4::Linear& w) {
    if (!w.valid() || w.format != dsv4::WeightFormat::kGgml ||
        quant::GgmlType(w.ggml_type) != quant::GgmlType::kQ8_0 || w.in % 64 != 0)
      return stored(w);
    AFF_ASSIGN_OR_RETURN(DeviceLinear d, describe(w));  // checks the stored size
    const int64_t groups = w.in / quant::kQK;
    d.format = DevFormat::kQ8, d.ggml_type = -1, d.row_bytes = 0, d.tables = nullptr;
    d.scale_type = DevScale::kF16, d.scale_cols = groups;
    const size_t n = size_t(w.out) * size_t(w.in), n_scales = size_t(w.out) * size_t(groups);
    if (!arena_) {
      AFF_ASSIGN_OR_RETURN(d.weight, raw(nullptr, n, w.weight.name));
      AFF_ASSIGN_OR_RETURN(d.scale, raw(nullptr, n_scales * 2, w.weight.name));
      return d;
    }
    std::vector<int8_t> codes(n);
    std::vector<uint16_t> scales(n_scales);
    const auto* blocks = reinterpret_cast<const quant::BlockQ8_0*>(w.weight.data);
    for (size_t b = 0; b < n_scales; ++b) {
      scales[b] = blocks[b].d;
      const int64_t row = int64_t(b) / groups, col0 = (int64_t(b) % groups) * quant::kQK;
      for (int i = 0; i < quant::kQK; ++i) codes[size_t(row * w.in + q8_code_at(col0 + i))] = blocks[b].qs[i];
    }
    AFF_ASSIGN_OR_RETURN(d.weight, raw(codes.data(), n, w.weight.name));
    AFF_ASSIGN_OR_RETURN(d.scale, raw(scales.data(), n_scales * 2, w.weight.name + " (scales)"));
    return d;
  }

  // A ggml embedding [vocab, D] dequantised row by row to BF16 (exactly as the CPU
  // reference decodes it, then rounded to BF16: relative error <= 2^-9 per element).
  Result<const uint8_t*> embed_bf16(const dsv4::Linear& e) {
    const size_t n = size_t(e.out) * size_t(e.in);
    if (!arena_) return raw(nullptr, n * 2, e.weight.name);
    if (e.weight.shape.size() != 2) return corrupt(e.weight.name + ": not a 2-D ggml tensor");
    const int64_t row_bytes = e.weight.shape[1];
    std::vector<uint16_t> bf(n);
    std::vector<float> row(size_t(e.in));
    for (int64_t r = 0; r < e.out; ++r) {
      AFF_RETURN_IF_ERROR(quant::dequantize_row(quant::GgmlType(e.ggml_type),
                                                {e.weight.data + r * row_bytes, size_t(row_bytes)}, row)
                              .with_context(e.weight.file + ": tensor '" + e.weight.name + "'"));
      for (int64_t i = 0; i < e.in; ++i) bf[size_t(r * e.in + i)] = f32_to_bf16(row[size_t(i)]);
    }
    return raw(bf.data(), n * 2, e.weight.name);
  }

  // A TensorView holding an mHC fn matrix as a Linear of its float dtype.
  Result<DeviceLinear> matrix(const TensorView& t) {
    dsv4::Linear l;
    l.weight = t;
    l.format = t.dtype == DType::kBF16 ? dsv4::WeightFormat::kBF16
               : t.dtype == DType::kF16 ? dsv4::WeightFormat::kF16
                                        : dsv4::WeightFormat::kF32;
    if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16)
      return unsupported(t.file + ": tensor '" + t.name + "': not a float matrix");
    l.out = t.dim(0);
    l.in = t.dim(1);
    return linear(l);
  }

  Result<DeviceHc> hc(const dsv4::HcWeights& w) {
    DeviceHc d;
    AFF_ASSIGN_OR_RETURN(d.fn, matrix(w.fn));
    AFF_ASSIGN_OR_RETURN(d.base, f32(w.base));
    AFF_ASSIGN_OR_RETURN(d.scale, f32(w.scale));
    return d;
  }

  Result<DeviceCompressor> compressor(const dsv4::CompressorWeights& w) {
    DeviceCompressor d;
    d.present = w.present;
    if (!w.present) return d;
    d.ratio = w.ratio, d.dim = w.dim, d.overlap = w.overlap;
    AFF_ASSIGN_OR_RETURN(d.wkv, linear(w.wkv));
    AFF_ASSIGN_OR_RETURN(d.wgate, linear(w.wgate));
    AFF_ASSIGN_OR_RETURN(d.ape, f32(w.ape));
    AFF_ASSIGN_OR_RETURN(d.norm, f32(w.norm));
    return d;
  }

  // A routed expert as stored; the shared expert (dense) as linear() places it.
  Result<ExpertSlot> expert(const dsv4::ExpertWeights& e, bool dense = false) {
    ExpertSlot s;
    AFF_ASSIGN_OR_RETURN(s.w1, dense ? linear(e.w1) : stored(e.w1));
    AFF_ASSIGN_OR_RETURN(s.w3, dense ? linear(e.w3) : stored(e.w3));
    AFF_ASSIGN_OR_RETURN(s.w2, dense ? linear(e.w2) : stored(e.w2));
    if (s.w1.format != s.w3.format || s.w1.format != s.w2.format)
      return unsupported(e.w1.weight.name + ": the three weights of an expert must share one format");
    return s;
  }

  Result<int32_t*> slot_table(const std::vector<ExpertSlot>& slots, const std::string& what) {
    AFF_ASSIGN_OR_RETURN(const uint8_t* p, raw(slots.data(), slots.size() * sizeof(ExpertSlot), what));
    return reinterpret_cast<int32_t*>(const_cast<uint8_t*>(p));
  }

  Result<DeviceMoe> moe(const dsv4::ModelConfig& cfg, const dsv4::MoeWeights& w, bool hash) {
    DeviceMoe d;
    AFF_ASSIGN_OR_RETURN(d.gate, linear(w.gate));
    if (!hash) {
      AFF_ASSIGN_OR_RETURN(d.gate_bias, f32(w.gate_bias));
    }
    if (hash) {
      const TensorView& t = w.tid2eid;
      if (!t.valid()) return corrupt("hash layer without tid2eid");
      std::vector<int32_t> ids(size_t(t.numel()));
      for (int64_t i = 0; i < t.numel(); ++i) {
        const int64_t e = t.dtype == DType::kI64 ? t.as<int64_t>()[i] : t.as<int32_t>()[i];
        if (e < 0 || e >= cfg.n_routed_experts)
          return corrupt(t.name + " in " + t.file + ": entry " + std::to_string(i) + " maps to expert " +
                         std::to_string(e) + ", outside [0, " + std::to_string(cfg.n_routed_experts) + ")");
        ids[size_t(i)] = int32_t(e);
      }
      AFF_ASSIGN_OR_RETURN(const uint8_t* p, raw(ids.data(), ids.size() * 4, t.name));
      d.tid2eid = reinterpret_cast<const int32_t*>(p);
    }
    d.host_slots.resize(w.experts.size());
    for (size_t e = 0; e < w.experts.size(); ++e) {
      AFF_ASSIGN_OR_RETURN(d.host_slots[e], expert(w.experts[e]));
      if (e > 0 && d.host_slots[e].w1.format != d.host_slots[0].w1.format)
        return unsupported(w.experts[e].w1.weight.name + ": routed experts of one layer must share one format");
    }
    if (!d.host_slots.empty()) d.expert_format = d.host_slots[0].w1.format;
    AFF_ASSIGN_OR_RETURN(int32_t* table, slot_table(d.host_slots, "expert slot table"));
    d.slots = reinterpret_cast<ExpertSlot*>(table);
    d.has_shared = w.has_shared;
    if (w.has_shared) {
      AFF_ASSIGN_OR_RETURN(ExpertSlot s, expert(w.shared, /*dense=*/true));
      d.shared_format = s.w1.format;
      d.shared_host = s;
      AFF_ASSIGN_OR_RETURN(int32_t* st, slot_table({s}, "shared expert slot"));
      d.shared_slot = reinterpret_cast<ExpertSlot*>(st);
    }
    return d;
  }

  Status model(const dsv4::LoadedModel& m, DeviceModel& out) {
    const dsv4::ModelConfig& cfg = m.config;
    const dsv4::ModelWeights& w = m.weights;
    if (w.embed_rows.valid()) {
      // A ggml-format embedding is widened to BF16 once: the lookup reads one row per
      // token, so its bytes do not matter for speed, and the embedding kernel stays simple.
      out.embed_format = DevFormat::kBF16;
      AFF_ASSIGN_OR_RETURN(out.embed, embed_bf16(w.embed_rows));
    } else switch (w.embed.dtype) {
      case DType::kF32: out.embed_format = DevFormat::kF32; break;
      case DType::kBF16: out.embed_format = DevFormat::kBF16; break;
      case DType::kF16: out.embed_format = DevFormat::kF16; break;
      default: return unsupported(w.embed.name + ": embedding dtype not supported by the CUDA backend");
    }
    if (!w.embed_rows.valid()) {
      AFF_ASSIGN_OR_RETURN(out.embed, raw(w.embed.data, w.embed.nbytes, w.embed.name));
    }
    AFF_ASSIGN_OR_RETURN(out.head, linear(w.head));
    AFF_ASSIGN_OR_RETURN(out.norm, f32(w.norm));
    AFF_ASSIGN_OR_RETURN(out.hc_head, hc(w.hc_head));
    out.layers.resize(w.layers.size());
    for (size_t l = 0; l < w.layers.size(); ++l) {
      const dsv4::LayerWeights& lw = w.layers[l];
      DeviceLayer& d = out.layers[l];
      AFF_ASSIGN_OR_RETURN(d.hc_attn, hc(lw.hc_attn));
      AFF_ASSIGN_OR_RETURN(d.hc_ffn, hc(lw.hc_ffn));
      AFF_ASSIGN_OR_RETURN(d.attn_norm, f32(lw.attn_norm));
      AFF_ASSIGN_OR_RETURN(d.ffn_norm, f32(lw.ffn_norm));
      DeviceAttention& a = d.attn;
      AFF_ASSIGN_OR_RETURN(a.wq_a, linear(lw.attn.wq_a));
      AFF_ASSIGN_OR_RETURN(a.wq_b, linear(lw.attn.wq_b));
      AFF_ASSIGN_OR_RETURN(a.wkv, linear(lw.attn.wkv));
      AFF_ASSIGN_OR_RETURN(a.wo_a, linear(lw.attn.wo_a));
      AFF_ASSIGN_OR_RETURN(a.wo_b, linear(lw.attn.wo_b));
      AFF_ASSIGN_OR_RETURN(a.q_norm, f32(lw.attn.q_norm));
      AFF_ASSIGN_OR_RETURN(a.kv_norm, f32(lw.attn.kv_norm));
      AFF_ASSIGN_OR_RETURN(a.attn_sink, f32(lw.attn.attn_sink));
      AFF_ASSIGN_OR_RETURN(a.compressor, compressor(lw.attn.compressor));
      a.indexer.present = lw.attn.indexer.present;
      if (a.indexer.present) {
        AFF_ASSIGN_OR_RETURN(a.indexer.wq_b, linear(lw.attn.indexer.wq_b));
        AFF_ASSIGN_OR_RETURN(a.indexer.weights_proj, linear(lw.attn.indexer.weights_proj));
        AFF_ASSIGN_OR_RETURN(a.indexer.compressor, compressor(lw.attn.indexer.compressor));
      }
      AFF_ASSIGN_OR_RETURN(d.ffn, moe(cfg, lw.ffn, cfg.is_hash_layer(int(l))));
    }
    return Status::ok();
  }

 private:
  DeviceArena* arena_ = nullptr;  // null: measuring
  size_t bytes_ = 0;
};

Result<std::unique_ptr<DeviceModel>> upload_model(const dsv4::LoadedModel& model) {
  auto out = std::make_unique<DeviceModel>();
  out->config = model.config;
  ModelUploader measure(nullptr);
  {
    DeviceModel scratch;
    AFF_RETURN_IF_ERROR(measure.model(model, scratch).with_context("uploading " + model.source));
  }
  AFF_RETURN_IF_ERROR(out->arena_.reserve(measure.measured(), "the weights of " + model.source));
  ModelUploader up(&out->arena_);
  AFF_RETURN_IF_ERROR(up.model(model, *out).with_context("uploading " + model.source));
  // Kernel attributes are set now, not on the first launch, which may be inside
  // a decode-graph capture.
  AFF_RETURN_IF_ERROR(gemv_prepare());
  AFF_RETURN_IF_ERROR(moe_decode_prepare());
  return out;
}

size_t linear_device_bytes(const dsv4::Linear& w) {
  // (+ one alignment unit: a split Q8_0 weight takes two allocations)
  return DeviceArena::aligned(w.weight.nbytes) + (w.scale.valid() ? DeviceArena::aligned(w.scale.nbytes) : 0) +
         DeviceArena::aligned(1);
}

Result<DeviceLinear> upload_linear(const dsv4::Linear& w, DeviceArena& arena) {
  ModelUploader up(&arena);
  return up.stored(w);
}

Result<DeviceLinear> upload_dense_linear(const dsv4::Linear& w, DeviceArena& arena) {
  ModelUploader up(&arena);
  return up.linear(w);
}

}  // namespace aff::cuda
