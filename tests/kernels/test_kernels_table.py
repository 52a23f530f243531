"""kernels/__init__.py: every op has a launcher, a reference of the same arguments and a capability check;
inputs a launcher cannot take run the reference, logged once."""
import inspect
import logging

import torch

import kernels
from kernels import OPS, run
from kernels.int8_linear import reference as int8_linear_reference
from kernels.int8_quant import reference as quantize_reference

TUNING = {"block_m", "block_n", "num_warps", "num_stages", "tiles", "row_programs"}  # launchers only


def test_references_take_the_launchers_arguments():
    for name, op in OPS.items():
        launcher = [p for p in inspect.signature(op.launcher).parameters if p not in TUNING]
        reference = list(inspect.signature(op.reference).parameters)
        assert set(launcher) <= set(reference), name


def test_cpu_inputs_fall_back_to_the_reference_once(caplog):
    x = torch.randn(3, 32).to(torch.bfloat16)
    kernels._log_fallback.cache_clear()
    with caplog.at_level(logging.WARNING, logger="kernels"):
        for _ in range(2):
            q, s = run("quantize_rows", x, 16)
    assert len([r for r in caplog.records if "quantize_rows" in r.message]) == 1
    q_ref, s_ref = quantize_reference(x, 16)
    assert torch.equal(q, q_ref) and torch.equal(s, s_ref)
    assert OPS["int8_linear"].capable(torch.device("cpu")) is not None


def test_the_gluon_gemms_take_only_calls_they_can_run(monkeypatch):
    """GLUON_GEMM swaps in the Gluon GEMMs for calls without LoRA or explicit tiles, with TMA's 16-byte rows and
    (QKV) whole heads in a 256-column tile; elsewhere, and off the GPU, the Triton launcher or the reference runs."""
    q, w, s = torch.zeros(8, 64, dtype=torch.int8), torch.zeros(48, 64, dtype=torch.int8), torch.ones(8)
    assert kernels._takes_linear(q, s, w, s)
    assert not kernels._takes_linear(q, s, w, s, lora_down=torch.zeros(8, 4))
    assert not kernels._takes_linear(q, s, w, s, tiles={"BLOCK_M": 16})
    assert not kernels._takes_linear(q[:, :40], s, w[:, :40], s)  # K not a multiple of 16
    assert not kernels._takes_linear(q, s, w[:40], s, swiglu=True)  # 20 output columns: 40 bytes a row
    qkv = torch.zeros(3 * 4 * 128, 64, dtype=torch.int8)
    assert kernels._takes_qkv(q, s, qkv, s, None, 4, 128)
    assert not kernels._takes_qkv(q, s, qkv, s, None, 6, 64 + 32)  # heads of 96 do not tile 256 columns
    monkeypatch.setattr(kernels, "GLUON_GEMM", True)
    q, w = torch.randint(-128, 128, (8, 64), dtype=torch.int8), torch.randint(-128, 128, (48, 64), dtype=torch.int8)
    got = run("int8_linear", q, s, w, torch.ones(48))  # on the CPU: the reference, switch or not
    assert torch.equal(got, int8_linear_reference(q, s, w, torch.ones(48)))
