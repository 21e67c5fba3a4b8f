"""Writes python_written.safetensors with the reference `safetensors` library.

The C++ reader is tested against this file so that it is checked against an
independent writer, not only against its own. Every tensor's contents follow a
formula that tests/format/safetensors_test.cpp recomputes.

Run with an interpreter that has torch >= 2.7 and safetensors:
    $PYTHON tests/data/loader/make_python_fixture.py
"""
import os

import torch
from safetensors.torch import save_file


def idx(n):
    return torch.arange(n, dtype=torch.int64)


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_written.safetensors")
    t = {}
    t["f32.odd"] = (idx(17 * 3).to(torch.float32) * 0.25 - 3.0).reshape(17, 3)
    t["bf16.row"] = ((idx(97) % 17) - 8).to(torch.bfloat16).reshape(1, 97)
    t["f16.vec"] = (idx(5).to(torch.float16) / 8)
    t["fp8.w"] = ((idx(4 * 7) * 7) % 126).to(torch.uint8).view(torch.float8_e4m3fn).reshape(4, 7)
    t["fp8.scale"] = (120 + idx(6) % 10).to(torch.uint8).view(torch.float8_e8m0fnu).reshape(2, 3)
    t["fp4.packed"] = (((idx(3 * 16) * 5) % 256) - 128).to(torch.int8).reshape(3, 16)
    t["ids.i64"] = (idx(9) * 1000003 - 5).reshape(3, 3)
    t["ids.i32"] = (idx(4) * -7).to(torch.int32)
    t["mask.bool"] = (idx(10) % 3 == 0)
    t["bytes.u8"] = (idx(11) * 23 % 256).to(torch.uint8)
    t["scalar.f32"] = torch.tensor(2.5, dtype=torch.float32)
    t["empty.f32"] = torch.zeros(0, 4, dtype=torch.float32)
    save_file(t, out, metadata={"format": "pt", "writer": "python-safetensors"})
    print("wrote", out, os.path.getsize(out), "bytes")


if __name__ == "__main__":
    main()
