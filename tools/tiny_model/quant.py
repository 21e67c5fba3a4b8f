"""The two weight formats of the V4-Flash checkpoint, as torch functions.

* FP8: E4M3 values with one E8M0 (power-of-two) scale per 128x128 block of a [out, in] weight;
  scale = 2^ceil(log2(amax / 448)) so no value saturates.
* MXFP4: E2M1 values with one E8M0 scale per 32 consecutive inputs of a row;
  scale = 2^ceil(log2(amax / 6)); values rounded to nearest, ties to even code.
  Packed two per byte: element 2k in the low nibble, 2k+1 in the high nibble.

`fake_*` return the dequantised float tensor (what training with quantisation-aware steps and
the exported checkpoint both see); `quantize_*` return the stored tensors.
"""
import torch

FP4_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _pow2_scale(amax, qmax):
    """E8M0 scale exponent (int) with amax/2^e <= qmax, clamped to the E8M0 range."""
    amax = amax.float().clamp_min(2.0 ** -126)
    e = torch.ceil(torch.log2(amax / qmax))
    # log2 of an exact power of two can come out a hair high; step down if the smaller scale fits.
    e = torch.where(amax / torch.exp2(e - 1) <= qmax, e - 1, e)
    return e.clamp(-127, 127)


def _blocks128(w):
    out, inp = w.shape
    po, pi = (-out) % 128, (-inp) % 128
    wp = torch.nn.functional.pad(w.float(), (0, pi, 0, po))
    return wp.view((out + po) // 128, 128, (inp + pi) // 128, 128), out, inp


def quantize_fp8(w):
    """w [out, in] float -> (fp8 e4m3 [out, in], e8m0 exponent int [ceil(out/128), ceil(in/128)])."""
    b, out, inp = _blocks128(w)
    e = _pow2_scale(b.abs().amax(dim=(1, 3)), 448.0)
    q = (b / torch.exp2(e)[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    q = q.view(b.shape[0] * 128, b.shape[2] * 128)[:out, :inp]
    return q, e.to(torch.int32)


def dequantize_fp8(q, e):
    out, inp = q.shape
    s = torch.exp2(e.float()).repeat_interleave(128, 0).repeat_interleave(128, 1)[:out, :inp]
    return q.float() * s


def fake_fp8(w):
    q, e = quantize_fp8(w.detach())
    return dequantize_fp8(q, e).to(w.dtype)


def _e2m1_codes(x):
    """|x| <= 6 -> magnitude code 0..7, round to nearest, ties to the even code."""
    a = x.abs()
    code = torch.zeros_like(a, dtype=torch.int32)
    # thresholds between grid values; ties go to the even code (down at .25/1.25/2.5/5, up at .75/1.75/3.5)
    for t, tie_up in ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False)):
        code += (a >= t).int() if tie_up else (a > t).int()
    return code


def quantize_mxfp4(w):
    """w [..., in] float (in % 32 == 0) -> (codes uint8 [..., in] 0..15, e8m0 exponent int [..., in/32])."""
    *lead, inp = w.shape
    assert inp % 32 == 0, w.shape
    b = w.float().reshape(*lead, inp // 32, 32)
    e = _pow2_scale(b.abs().amax(dim=-1), 6.0)
    x = b / torch.exp2(e)[..., None]
    code = _e2m1_codes(x) | ((x < 0).int() << 3)
    code = torch.where(code == 8, torch.zeros_like(code), code)  # -0 -> +0
    return code.to(torch.uint8).reshape(*lead, inp), e.to(torch.int32)


def dequantize_mxfp4(code, e):
    *lead, inp = code.shape
    c = code.long()
    v = FP4_GRID.to(code.device)[c & 7] * (1 - 2 * ((c >> 3) & 1)).float()
    return (v.reshape(*lead, inp // 32, 32) * torch.exp2(e.float())[..., None]).reshape(*lead, inp)


def fake_mxfp4(w):
    code, e = quantize_mxfp4(w.detach())
    return dequantize_mxfp4(code, e).to(w.dtype)


def pack_fp4(code):
    """codes uint8 [..., in] -> int8 [..., in/2]: element 2k low nibble, 2k+1 high nibble."""
    c = code.to(torch.uint8)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).view(torch.int8)


def unpack_fp4(packed):
    p = packed.view(torch.uint8)
    return torch.stack([p & 15, p >> 4], dim=-1).flatten(-2)


def e8m0_bytes(e):
    """exponent int -> float8_e8m0fnu tensor (byte = e + 127)."""
    return (e + 127).to(torch.uint8).view(torch.float8_e8m0fnu)


def e8m0_exponent(t):
    return t.view(torch.uint8).to(torch.int32) - 127
