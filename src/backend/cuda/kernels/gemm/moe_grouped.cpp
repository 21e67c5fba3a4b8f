// moe_grouped_ffn: counting sort of pairs by expert (counts read back once),
// sorted bf16 inputs, then
//  - ggml experts: a tile list (expert, first sorted row, up to 64 rows) built
//    on the host from the counts and uploaded; one fused launch for gate, up
//    and the SwiGLU, one for down (moe_grouped_ggml.h);
//  - other formats, per active expert: decode w1 -> GEMM gate rows, decode
//    w3 -> GEMM up rows; one SwiGLU over all sorted rows; per expert: decode
//    w2 -> GEMM output rows;
// then (other formats; the ggml down kernel writes pair order itself) scatter
// back to pair order. Each expert's weights are read once per chunk (ggml:
// once per 64 of its tokens) however many tokens chose it.
#include "backend/cuda/kernels/gemm/moe_grouped.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/kernels/gemm/gemm.h"
#include "backend/cuda/kernels/gemm/gemm_context.h"
#include "backend/cuda/kernels/gemm/moe_grouped_ggml.h"
#include "backend/cuda/kernels/gemm/moe_grouped_kernels.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace aff::cuda {

namespace {
std::atomic<bool> g_ggml_fused{true};

// The fused kernels' form: the second unless the environment asks for the first
// (read on first use).
std::atomic<int>& ggml_kernel_version() {
  static std::atomic<int> v{[] {
    const char* e = std::getenv("AFF_CUDA_MOE_PREFILL");
    return e != nullptr && std::strcmp(e, "v1") == 0 ? 1 : 2;
  }()};
  return v;
}
}  // namespace

void moe_grouped_set_ggml_fused(bool on) { g_ggml_fused.store(on); }
bool moe_grouped_ggml_fused() { return g_ggml_fused.load(); }

void moe_grouped_set_ggml_kernel(int version) {
  if (version == 1 || version == 2) ggml_kernel_version().store(version);
}
int moe_grouped_ggml_kernel() { return ggml_kernel_version().load(); }

bool moe_grouped_supports(std::span<const ExpertSlot> slots, MmaPrecision precision) {
  for (const ExpertSlot& s : slots)
    if (!gemm_supports(s.w1, precision) || !gemm_supports(s.w3, precision) || !gemm_supports(s.w2, precision))
      return false;
  return !slots.empty();
}

namespace {

// W (one expert matrix) as bf16: in place for BF16, else decoded into tile.
Result<const uint16_t*> weight_bf16(const DeviceLinear& w, uint16_t* tile, cudaStream_t s) {
  if (w.format == DevFormat::kBF16) return reinterpret_cast<const uint16_t*>(w.weight);
  AFF_RETURN_IF_ERROR(dequant_rows_bf16(w, 0, w.out, tile, s));
  return const_cast<const uint16_t*>(tile);
}

// Tiles of kMoeGgmlTileTokens sorted rows per active expert, in expert order
// (an expert's tiles are adjacent, so its second tile re-reads weights that
// are still in L2). n, off: [E] counts and first sorted rows.
Result<std::vector<MoeGgmlTile>> ggml_tiles(std::span<const ExpertSlot> slots, const std::vector<int32_t>& n,
                                            const std::vector<int32_t>& off) {
  std::vector<MoeGgmlTile> tiles;
  for (size_t e = 0; e < slots.size(); ++e) {
    const ExpertSlot& s = slots[e];
    if (n[e] > 0 && (s.w1.weight == nullptr || s.w3.weight == nullptr || s.w2.weight == nullptr))
      return internal_error("moe_grouped: a routed expert has no weights");
    for (int32_t t0 = 0; t0 < n[e]; t0 += kMoeGgmlTileTokens) {
      MoeGgmlTile t;
      t.w1 = s.w1.weight, t.w3 = s.w3.weight, t.w2 = s.w2.weight;
      t.row0 = off[e] + t0;
      t.rows = std::min<int32_t>(kMoeGgmlTileTokens, n[e] - t0);
      tiles.push_back(t);
    }
  }
  return tiles;
}

}  // namespace

Status moe_grouped_ffn(const GroupedMoeArgs& a, MmaPrecision precision, cudaStream_t stream) {
  const int64_t P = a.n_pairs, D = a.D, F = a.inter;
  const int E = int(a.slots.size());
  if (P == 0) return Status::ok();
  if (!moe_grouped_supports(a.slots, precision)) return unsupported("moe_grouped: expert format not supported");
  for (const ExpertSlot& s : a.slots)
    if (s.w1.out != F || s.w1.in != D || s.w3.out != F || s.w3.in != D || s.w2.out != D || s.w2.in != F)
      return internal_error("moe_grouped: expert shape differs from [inter, D] / [D, inter]");
  AFF_ASSIGN_OR_RETURN(GemmContext * ctx, gemm_context(stream));
  std::lock_guard<std::mutex> lock(ctx->mu);
  // ggml experts take the fused kernels when the table allows (else the
  // per-expert path below, which serves them too).
  Result<MoeGgmlLayout> ggml = g_ggml_fused.load() ? moe_ggml_layout(a.slots.data(), a.slots.size(), D, F)
                                                   : Result<MoeGgmlLayout>(unsupported("fused ggml path off"));
  const bool fused = ggml.is_ok();
  const bool split = !fused && precision == MmaPrecision::kBf16x3;

  // Sort: counts [E] | offsets [E] | cursor [E] | slot_of_pair [P] | pair_of_slot [P]
  // (| fused: tiles [max_tiles] at a 16-byte boundary). Sized before the counts
  // are known: growing this buffer later would drop them.
  const size_t tiles_at = (size_t(3 * E + 2 * P) * 4 + 15) / 16 * 16;
  const int64_t max_tiles = fused ? moe_ggml_max_tiles(P, E) : 0;
  AFF_ASSIGN_OR_RETURN(void* sort_raw,
                       gemm_scratch(*ctx, kBufSort, tiles_at + size_t(max_tiles) * sizeof(MoeGgmlTile)));
  int32_t* counts = static_cast<int32_t*>(sort_raw);
  int32_t* offsets = counts + E;
  int32_t* cursor = offsets + E;
  int32_t* slot_of_pair = cursor + E;
  int32_t* pair_of_slot = slot_of_pair + P;
  std::vector<int32_t> n(static_cast<size_t>(E)), off(static_cast<size_t>(E));
  const bool known = E == 1 && a.ids_all_zero;
  if (known) {
    // One expert (the shared one) takes every pair: the count is known, and
    // the stream need not drain to read it back.
    n[0] = int32_t(P);
  } else {
    AFF_RETURN_IF_ERROR(moe_count(a.ids, P, E, counts, stream));
    AFF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(n.data(), counts, size_t(E) * 4, cudaMemcpyDeviceToHost, stream));
    AFF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  }
  int64_t total = 0;
  for (int e = 0; e < E; ++e) off[size_t(e)] = int32_t(total), total += n[size_t(e)];
  // A copy from pageable memory may wait for the stream: the one-expert case
  // (offset 0) sets it on the device instead.
  if (known) AFF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(offsets, 0, 4, stream));
  else AFF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(offsets, off.data(), size_t(E) * 4, cudaMemcpyHostToDevice, stream));
  // The tile list goes up now, while the stream is idle (a copy from pageable
  // memory waits for the stream's earlier work).
  MoeGgmlTile* dtiles = reinterpret_cast<MoeGgmlTile*>(static_cast<uint8_t*>(sort_raw) + tiles_at);
  int n_tiles = 0;
  if (fused) {
    AFF_ASSIGN_OR_RETURN(std::vector<MoeGgmlTile> tiles, ggml_tiles(a.slots, n, off));
    if (int64_t(tiles.size()) > max_tiles) return internal_error("moe_grouped: more tiles than the bound");
    n_tiles = int(tiles.size());
    if (n_tiles > 0)
      AFF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dtiles, tiles.data(), tiles.size() * sizeof(MoeGgmlTile),
                                               cudaMemcpyHostToDevice, stream));
  }
  // One expert taking every pair, one pair per token (the shared expert): the
  // sorted order is the pair order, so the inputs are split in place of the
  // gather and the outputs land in y without a scatter.
  const bool identity = known && a.pairs_per_token == 1 && !fused;
  if (!identity) AFF_RETURN_IF_ERROR(moe_place(a.ids, P, E, offsets, cursor, slot_of_pair, pair_of_slot, stream));

  if (fused) {
    // Scratch (sorted rows): activations [total, F] bf16 (and, for the first
    // form's up kernel, gathered inputs [total, D] bf16); x's lo half is never
    // formed (only hi enters the fused kernels, in both precisions). Down
    // writes y in pair order itself.
    AFF_ASSIGN_OR_RETURN(void* ah, gemm_scratch(*ctx, kBufActHi, size_t(total * F) * 2));
    uint16_t* act = static_cast<uint16_t*>(ah);
    // Pairs whose id is outside [0, E) are in no count, so no tile writes
    // their rows; the contract gives them zeros (as the scatter did).
    if (total < P) AFF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(a.y, 0, size_t(P * D) * 4, stream));
    // Second form where it takes the types (moe_grouped_set_ggml_kernel), per
    // launch. Its up kernel reads x in token order through pair_of_slot: x's
    // bf16 rows come from the shared split when the router gate made one (a
    // GemmSharedInput), else from one split here, and no gathered copy is made.
    const bool v2 = ggml_kernel_version().load() == 2;
    const int64_t T = P / a.pairs_per_token;
    if (v2 && moe_ggml_v2_takes_up(*ggml) && T * a.pairs_per_token == P) {
      const uint16_t* xt = nullptr;
      AFF_RETURN_IF_ERROR(gemm_input_bf16(*ctx, a.x, D, T, D, false, &xt, nullptr, stream));
      AFF_RETURN_IF_ERROR(moe_ggml_up_v2(*ggml, dtiles, n_tiles, xt, pair_of_slot, int32_t(a.pairs_per_token),
                                         a.swiglu_limit, act, stream));
    } else {
      AFF_ASSIGN_OR_RETURN(void* xh, gemm_scratch(*ctx, kBufXHi, size_t(total * D) * 2));
      uint16_t* x16 = static_cast<uint16_t*>(xh);
      AFF_RETURN_IF_ERROR(moe_gather_bf16(a.x, D, a.pairs_per_token, pair_of_slot, total, x16, nullptr, stream));
      AFF_RETURN_IF_ERROR(moe_ggml_up(*ggml, dtiles, n_tiles, x16, a.swiglu_limit, act, stream));
    }
    if (v2 && moe_ggml_v2_takes_down(*ggml))
      return moe_ggml_down_v2(*ggml, dtiles, n_tiles, act, pair_of_slot, a.y, stream);
    return moe_ggml_down(*ggml, dtiles, n_tiles, act, pair_of_slot, a.y, stream);
  }

  // Scratch (sorted rows): inputs, gate/up, activations, outputs, one decoded weight.
  AFF_ASSIGN_OR_RETURN(void* xh, gemm_scratch(*ctx, kBufXHi, size_t(total * D) * 2));
  void* xl = nullptr;
  void* al = nullptr;
  if (split) {
    AFF_ASSIGN_OR_RETURN(void* p1, gemm_scratch(*ctx, kBufXLo, size_t(total * D) * 2));
    AFF_ASSIGN_OR_RETURN(void* p2, gemm_scratch(*ctx, kBufActLo, size_t(total * F) * 2));
    xl = p1, al = p2;
  }
  AFF_ASSIGN_OR_RETURN(void* gate, gemm_scratch(*ctx, kBufGate, size_t(total * F) * 4));
  AFF_ASSIGN_OR_RETURN(void* up, gemm_scratch(*ctx, kBufUp, size_t(total * F) * 4));
  AFF_ASSIGN_OR_RETURN(void* ah, gemm_scratch(*ctx, kBufActHi, size_t(total * F) * 2));
  void* ys = a.y;
  if (!identity) {
    AFF_ASSIGN_OR_RETURN(ys, gemm_scratch(*ctx, kBufY, size_t(total * D) * 4));
  }
  AFF_ASSIGN_OR_RETURN(void* tile_raw, gemm_scratch(*ctx, kBufWTile, size_t(F * D) * 2));
  uint16_t* tile = static_cast<uint16_t*>(tile_raw);
  auto u16 = [](void* p) { return static_cast<uint16_t*>(p); };
  auto f32 = [](void* p) { return static_cast<float*>(p); };

  // Sorted inputs: the identity case takes x's split as it is (shared with the
  // router gate's GEMM under a GemmSharedInput), the rest gather.
  const uint16_t* xs_hi = u16(xh);
  const uint16_t* xs_lo = u16(xl);
  if (identity) AFF_RETURN_IF_ERROR(gemm_input_bf16(*ctx, a.x, D, P, D, split, &xs_hi, &xs_lo, stream));
  else AFF_RETURN_IF_ERROR(moe_gather_bf16(a.x, D, a.pairs_per_token, pair_of_slot, total, u16(xh), u16(xl), stream));
  for (int e = 0; e < E; ++e) {
    const int64_t ne = n[size_t(e)], o = off[size_t(e)];
    if (ne == 0) continue;
    const ExpertSlot& s = a.slots[size_t(e)];
    const uint16_t* x_hi = xs_hi + o * D;
    const uint16_t* x_lo = split ? xs_lo + o * D : nullptr;
    AFF_ASSIGN_OR_RETURN(const uint16_t* w1, weight_bf16(s.w1, tile, stream));
    AFF_RETURN_IF_ERROR(gemm_bf16_f32(*ctx, F, ne, D, w1, x_hi, x_lo, D, f32(gate) + o * F, F));
    AFF_ASSIGN_OR_RETURN(const uint16_t* w3, weight_bf16(s.w3, tile, stream));
    AFF_RETURN_IF_ERROR(gemm_bf16_f32(*ctx, F, ne, D, w3, x_hi, x_lo, D, f32(up) + o * F, F));
  }
  AFF_RETURN_IF_ERROR(moe_swiglu_bf16(f32(gate), f32(up), total * F, a.swiglu_limit, u16(ah), u16(al), stream));
  for (int e = 0; e < E; ++e) {
    const int64_t ne = n[size_t(e)], o = off[size_t(e)];
    if (ne == 0) continue;
    AFF_ASSIGN_OR_RETURN(const uint16_t* w2, weight_bf16(a.slots[size_t(e)].w2, tile, stream));
    AFF_RETURN_IF_ERROR(gemm_bf16_f32(*ctx, D, ne, F, w2, u16(ah) + o * F, split ? u16(al) + o * F : nullptr, F,
                                      f32(ys) + o * D, D));
  }
  if (identity) return Status::ok();
  return moe_scatter(f32(ys), slot_of_pair, P, D, a.y, stream);
}

}  // namespace aff::cuda
