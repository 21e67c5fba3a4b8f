// Encoders for the lattice-codebook i-quants (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ1_M),
// producing ggml's block layouts (quant/blocks.h) that quant/codec.h's decoders, ggml and
// gguf-py read. Reached through quantize_row(); declared here for the codec's dispatch and
// for tests, which also ask for the reconstruction.
//
// Each call takes n elements (a multiple of 256, checked by the caller) and writes n / 256
// blocks. imp: nullptr or [n] non-negative importance (mean squared activation per input
// column); the encoders minimise sum imp[i] * (x[i] - decoded[i])^2, or the plain squared
// error without one. recon: nullptr or [n], receives the values the written blocks decode
// to, computed from the encoder's own choices with the decoder's float expressions (so a
// test can hold the packing to the decoder bit for bit). Output depends only on the inputs:
// no global state beyond the read-only codebook indexes, no threads.
#pragma once

#include <cstdint>

#include "quant/blocks.h"

namespace aff::quant {

// iq2_quantize.cpp
void quantize_row_iq2_xxs(const float* x, BlockIq2Xxs* y, int64_t n, const float* imp, float* recon = nullptr);
void quantize_row_iq2_xs(const float* x, BlockIq2Xs* y, int64_t n, const float* imp, float* recon = nullptr);

// iq3_quantize.cpp
void quantize_row_iq3_xxs(const float* x, BlockIq3Xxs* y, int64_t n, const float* imp, float* recon = nullptr);

// iq1_quantize.cpp
void quantize_row_iq1_s(const float* x, BlockIq1S* y, int64_t n, const float* imp, float* recon = nullptr);
void quantize_row_iq1_m(const float* x, BlockIq1M* y, int64_t n, const float* imp, float* recon = nullptr);

}  // namespace aff::quant
