"""kernels/__init__.py: every op has a launcher, a reference of the same arguments and a capability check;
inputs a launcher cannot take run the reference, logged once."""
import inspect
import logging

import torch

import kernels
from kernels import OPS, run
from kernels.int8.quant import reference as quantize_reference

TUNING = {"block_m", "block_n", "block_d", "num_warps", "num_stages", "tiles", "row_programs", "row_at_once",
          "choices", "block", "piece", "max_parts", "parts", "block_s", "last_pieces", "last_parts"}  # launchers only


def test_references_take_the_launchers_arguments():
    for name, op in OPS.items():
        launcher = [p for p in inspect.signature(op.launcher).parameters if p not in TUNING]
        reference = list(inspect.signature(op.reference).parameters)
        assert set(launcher) <= set(reference), name


def test_cpu_inputs_fall_back_to_the_reference_once(caplog, monkeypatch):
    """On CPU inputs run() calls the reference, never the launcher (one that fails stands in for it here), and logs
    the fallback once per op and reason."""
    def launcher(*args, **kwargs):
        raise AssertionError("the launcher ran on CPU inputs")
    monkeypatch.setitem(OPS, "quantize_rows", kernels.Op(launcher, quantize_reference, OPS["quantize_rows"].capable))
    x = torch.randn(3, 32).to(torch.bfloat16)
    kernels._log_fallback.cache_clear()
    with caplog.at_level(logging.WARNING, logger="kernels"):
        for _ in range(2):
            q, s = run("quantize_rows", x, 16)
    assert len([r for r in caplog.records if "quantize_rows" in r.message]) == 1
    q_ref, s_ref = quantize_reference(x, 16)
    assert torch.equal(q, q_ref) and torch.equal(s, s_ref)
    assert OPS["int8_linear"].capable(torch.device("cpu")) is not None



def test_the_hopper_kernels_are_chosen_by_the_device_and_the_callers_choices(monkeypatch):
    """run() gives the launcher of an op with Hopper kernels the caller's choices, those kernels off where
    needs_hopper fails."""
    seen = []
    monkeypatch.setitem(OPS, "quantize_rows", kernels.Op(lambda *args, choices, **kw: seen.append(choices),
                                                         quantize_reference, lambda device: None,
                                                         OPS["quantize_rows"].hopper))
    asked = kernels.Choices(split_tail=False)
    for why in (None, "not a Hopper GPU"):
        monkeypatch.setattr(kernels, "needs_hopper", lambda device, why=why: why)
        run("quantize_rows", torch.zeros(2, 16), 16, choices=asked)
    assert seen == [asked, kernels.Choices(split_tail=False, hopper_quant=False, hopper_turned_quant=False)]
    assert OPS["quantize_rows"].hopper and not OPS["attention"].hopper
    assert kernels.needs_hopper(torch.device("cpu")) is not None
