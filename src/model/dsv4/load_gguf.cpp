#include "model/dsv4/load_gguf.h"

#include <cstdio>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "format/gguf_dsv4_names.h"
#include "model/dsv4/config_gguf.h"
#include "model/dsv4/weights_bind.h"
#include "quant/codec.h"

namespace aff::dsv4 {

namespace {

using format::GgufFile;
using format::GgufTensorInfo;
using quant::GgmlType;

std::string ne_string(const std::vector<int64_t>& ne) { return shape_string(ne); }

std::vector<int64_t> reversed(std::vector<int64_t> v) { return {v.rbegin(), v.rend()}; }

// The DType of a plain (unquantised) ggml float type.
std::optional<DType> plain_float_dtype(GgmlType t) {
  switch (t) {
    case GgmlType::kF32: return DType::kF32;
    case GgmlType::kF16: return DType::kF16;
    case GgmlType::kBF16: return DType::kBF16;
    default: return std::nullopt;
  }
}

WeightFormat plain_format(DType t) {
  switch (t) {
    case DType::kF32: return WeightFormat::kF32;
    case DType::kF16: return WeightFormat::kF16;
    default: return WeightFormat::kBF16;
  }
}

// A quantised block type whose rows affinity can decode.
bool decodable_block_type(GgmlType t) {
  const quant::GgmlTypeTraits& tr = quant::ggml_traits(t);
  return tr.quantized && tr.can_dequantize;
}

class GgufBinder final : public LayoutVisitor {
 public:
  GgufBinder(const GgufFile& f, const ModelConfig& c, ModelWeights* w, std::vector<std::shared_ptr<void>>* owned)
      : f_(f), c_(c), w_(w), owned_(owned) {}

  Status linear(const std::string& stem, int64_t out, int64_t in, LinearKind kind, Linear* dst) override {
    const std::string hf = stem + ".weight";
    AFF_ASSIGN_OR_RETURN(Located t, locate(hf));
    const bool expert = t.name.kind == format::Dsv4GgufName::Kind::kExpertSlice;
    const std::vector<int64_t> want = expert ? std::vector<int64_t>{in, out, c_.n_routed_experts}
                                             : std::vector<int64_t>{in, out};
    AFF_RETURN_IF_ERROR(expect_ne(t, hf, want));
    if (expert && (t.name.expert < 0 || t.name.expert >= c_.n_routed_experts)) {
      return internal_error(fmt::format("{}: expert index {} of '{}' out of range", f_.label(), t.name.expert, hf));
    }
    AFF_ASSIGN_OR_RETURN(Linear l, make_linear(t, hf, out, in, expert ? t.name.expert : 0));
    l.block = dst->block;
    *dst = l;
    return Status::ok();
  }

  Status tensor(const std::string& name, TensorKind kind, const std::vector<int64_t>& shape,
                TensorView* dst) override {
    AFF_ASSIGN_OR_RETURN(Located t, locate(name));
    AFF_RETURN_IF_ERROR(expect_ne(t, name, reversed(shape)));
    const GgmlType type = t.info->type;
    const std::span<const uint8_t> bytes = f_.tensor_data(*t.info);
    TensorView v;
    v.name = t.info->name;
    v.file = f_.label();
    v.shape = shape;
    v.data = bytes.data();
    v.nbytes = bytes.size();

    if (kind == TensorKind::kExpertIds) {
      if (type != GgmlType::kI32 && type != GgmlType::kI64) return bad_type(t, name, "I32 or I64");
      v.dtype = type == GgmlType::kI32 ? DType::kI32 : DType::kI64;
      AFF_RETURN_IF_ERROR(check_expert_ids(v, name));
      *dst = v;
      return Status::ok();
    }
    if (auto dt = plain_float_dtype(type)) {
      v.dtype = *dt;
      *dst = v;
      return Status::ok();
    }
    if (!decodable_block_type(type)) return bad_type(t, name, "F32, F16, BF16 or a quantised type");
    if (name == "embed.weight") {
      // The table is big (vocab x D): rows are dequantised on lookup.
      AFF_ASSIGN_OR_RETURN(Linear l, make_linear(t, name, shape[0], shape[1], 0));
      w_->embed_rows = l;
      *dst = TensorView{};
      return Status::ok();
    }
    // Small tensors (norms, mHC parameters, ape, sinks): decode once to f32.
    auto buf = std::make_shared<std::vector<float>>(size_t(v.numel()));
    const int64_t row = t.info->ne[0];
    const int64_t row_bytes = int64_t(bytes.size()) / t.info->n_rows();
    for (int64_t r = 0; r < t.info->n_rows(); ++r) {
      AFF_RETURN_IF_ERROR(quant::dequantize_row(type, bytes.subspan(size_t(r * row_bytes), size_t(row_bytes)),
                                                {buf->data() + r * row, size_t(row)})
                              .with_context(fmt::format("{}: tensor '{}'", f_.label(), t.info->name)));
    }
    v.dtype = DType::kF32;
    v.data = reinterpret_cast<const uint8_t*>(buf->data());
    v.nbytes = buf->size() * sizeof(float);
    owned_->push_back(buf);
    *dst = v;
    return Status::ok();
  }

 private:
  struct Located {
    format::Dsv4GgufName name;
    const GgufTensorInfo* info = nullptr;
  };

  Result<Located> locate(const std::string& hf) const {
    auto name = format::dsv4_gguf_name(hf);
    if (!name) {
      return unsupported(fmt::format("{}: the model needs '{}', which has no deepseek4 GGUF name (DSpark "
                                     "drafters are not carried by GGUF yet)", f_.label(), hf));
    }
    const GgufTensorInfo* info = f_.find_tensor(name->gguf);
    if (!info) return not_found(fmt::format("{}: tensor '{}' ({}) is missing", f_.label(), name->gguf, hf));
    return Located{*name, info};
  }

  Status expect_ne(const Located& t, const std::string& hf, const std::vector<int64_t>& want) const {
    if (t.info->ne == want) return Status::ok();
    return corrupt(fmt::format("{}: tensor '{}' ({}): ne {} does not match the expected {} (ggml order)",
                               f_.label(), t.info->name, hf, ne_string(t.info->ne), ne_string(want)));
  }

  Status bad_type(const Located& t, const std::string& hf, const char* allowed) const {
    return corrupt(fmt::format("{}: tensor '{}' ({}): type {} is not allowed here (expected {})", f_.label(),
                               t.info->name, hf, quant::ggml_type_name(t.info->type), allowed));
  }

  // A Linear over `out` rows of `in` elements starting at row slab * out
  // (slab = the expert for stacked tensors).
  Result<Linear> make_linear(const Located& t, const std::string& hf, int64_t out, int64_t in, int64_t slab) const {
    const GgmlType type = t.info->type;
    Linear l;
    l.out = out;
    l.in = in;
    const auto row_bytes = quant::ggml_row_bytes(type, in);
    if (!row_bytes) return bad_type(t, hf, "a type whose blocks divide the row");
    const uint64_t slab_bytes = uint64_t(*row_bytes) * uint64_t(out);
    const std::span<const uint8_t> all = f_.tensor_data(*t.info);
    if ((uint64_t(slab) + 1) * slab_bytes > all.size()) {
      return internal_error(fmt::format("{}: tensor '{}' is smaller than its shape", f_.label(), t.info->name));
    }
    TensorView& v = l.weight;
    v.name = slab > 0 || t.name.kind == format::Dsv4GgufName::Kind::kExpertSlice
                 ? fmt::format("{}[expert {}]", t.info->name, slab)
                 : t.info->name;
    v.file = f_.label();
    v.data = all.data() + uint64_t(slab) * slab_bytes;
    v.nbytes = slab_bytes;
    if (auto dt = plain_float_dtype(type)) {
      v.dtype = *dt;
      v.shape = {out, in};
      l.format = plain_format(*dt);
      return l;
    }
    if (!decodable_block_type(type)) {
      return bad_type(t, hf, "F32, F16, BF16 or a quantised type with a row dequantiser");
    }
    v.dtype = DType::kU8;
    v.shape = {out, *row_bytes};
    l.format = WeightFormat::kGgml;
    l.ggml_type = int(type);
    return l;
  }

  Status check_expert_ids(const TensorView& t, const std::string& hf) const {
    if (const auto bad = find_bad_expert_id(t, c_.n_routed_experts)) {
      const int64_t K = c_.n_experts_per_tok;
      return corrupt(fmt::format("{}: tensor '{}' ({}): expert id {} at token {}, slot {} is outside [0, {})",
                                 f_.label(), t.name, hf, bad->id, bad->index / K, bad->index % K,
                                 c_.n_routed_experts));
    }
    return Status::ok();
  }

  const GgufFile& f_;
  const ModelConfig& c_;
  ModelWeights* w_;
  std::vector<std::shared_ptr<void>>* owned_;
};

bool has_mtp_tensors(const GgufFile& f) {
  for (const GgufTensorInfo& t : f.tensors()) {
    if (t.name.rfind("mtp.", 0) == 0) return true;
  }
  return false;
}

}  // namespace

bool is_gguf_file(const std::string& path) {
  std::FILE* fp = std::fopen(path.c_str(), "rb");
  if (!fp) return false;
  uint32_t magic = 0;
  const bool ok = std::fread(&magic, 4, 1, fp) == 1;
  std::fclose(fp);
  return ok && magic == format::kGgufMagic;
}

Result<std::unique_ptr<LoadedModel>> load_gguf(std::shared_ptr<const format::GgufFile> file) {
  AFF_ASSIGN_OR_RETURN(ModelConfig cfg, config_from_gguf(*file));
  // ds4 keeps the MTP block in a separate file while the main file's metadata
  // still counts it; the forward pass does not need it.
  if (cfg.num_mtp_layers > 0 && !has_mtp_tensors(*file)) cfg.num_mtp_layers = 0;

  auto model = std::make_unique<LoadedModel>();
  model->source = file->label();
  GgufBinder binder(*file, cfg, &model->weights, &model->keep_alive);
  AFF_RETURN_IF_ERROR(walk_checkpoint_layout(cfg, binder, &model->weights));
  model->config = std::move(cfg);
  model->keep_alive.push_back(std::const_pointer_cast<format::GgufFile>(file));
  return model;
}

Result<std::unique_ptr<LoadedModel>> load_gguf_file(const std::string& path) {
  AFF_ASSIGN_OR_RETURN(format::GgufFile f, format::GgufFile::open(path));
  return load_gguf(std::make_shared<const format::GgufFile>(std::move(f)));
}

}  // namespace aff::dsv4
