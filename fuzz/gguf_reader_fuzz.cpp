// libFuzzer target for the GGUF reader: any byte string must parse to either a Status or
// a file whose every tensor lies inside the input, and decoding the first row of each
// tensor must stay in bounds (it runs the block decoders on hostile bytes too).
// Build and run with scripts/fuzz-gguf.sh SECONDS.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "format/gguf_reader.h"
#include "quant/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace aff;
  auto r = format::GgufFile::parse(std::span<const uint8_t>(data, size), "fuzz.gguf");
  if (!r.is_ok()) {
    if (r.status().message().empty()) std::abort();  // every rejection must explain itself
    return 0;
  }
  const format::GgufFile& f = r.value();
  for (const auto& [key, value] : f.metadata()) {
    (void)value.as_uint();
    (void)value.as_float();
    for (size_t i = 0; i < value.array_size() && i < 16; ++i) (void)value.array_int(i);
  }
  std::vector<float> row;
  for (const auto& t : f.tensors()) {
    const auto bytes = f.tensor_data(t);
    if (bytes.data() < data || bytes.data() + bytes.size() > data + size) std::abort();
    const auto& traits = quant::ggml_traits(t.type);
    if (!traits.can_dequantize || t.ne[0] == 0 || t.ne[0] > 4096 || t.n_rows() == 0) continue;
    row.assign(size_t(t.ne[0]), 0.0f);
    const auto row_bytes = quant::ggml_row_bytes(t.type, t.ne[0]);
    if (!row_bytes || !quant::dequantize_row(t.type, bytes.first(size_t(*row_bytes)), row).is_ok()) std::abort();
  }
  return 0;
}
