"""dit_core/gpu/builds.py: a step's Triton kernels built side by side before it first runs. On the CPU, where it
refuses and that a refusal is remembered per key; on a GPU (bench/bench_first_step.py in fresh processes and Triton
caches), the step after a build ahead equals the step built as it ran, bit for bit."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from dit_core.gpu.builds import AheadBuilds, build_ahead

ROOT = Path(__file__).resolve().parents[2]


def test_refused_off_a_hopper_gpu_and_the_step_left_to_build_as_it_runs():
    ran = []
    built = build_ahead(lambda: ran.append(1), torch.device("cpu"))
    assert built.kernels == 0 and "Hopper" in built.refused and not ran


def test_once_a_key():
    builds, ran = AheadBuilds(), []
    assert builds.once(("shape", 1), lambda: ran.append(1), torch.device("cpu")).refused
    assert builds.once(("shape", 1), lambda: ran.append(1), torch.device("cpu")) is None
    assert builds.once(("shape", 2), lambda: ran.append(1), torch.device("cpu")) is not None
    builds.clear()  # a LoadedModels companion: the built kernels outlive the model's memory moves
    assert len(builds.done) == 2


@pytest.mark.gpu
def test_a_step_built_ahead_equals_the_step_built_as_it_ran(capsys):
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_first_step
    assert bench_first_step.main(["--size", "256", "--layers", "1"]) == 0
    said = capsys.readouterr().out
    print(said)
    assert said.count("bit for bit: True") == 3, said


def test_a_cancel_within_goes_through_and_is_not_remembered():
    class Cancelled(Exception):
        pass

    def cancelled():
        raise Cancelled

    builds = AheadBuilds(cancels=(Cancelled,))
    with pytest.MonkeyPatch.context() as mp:  # as on a Hopper GPU: the dry run runs
        mp.setattr("dit_core.gpu.builds.build_ahead", lambda step, device, threads, cancels, processes: step())
        with pytest.raises(Cancelled):
            builds.once("key", cancelled, torch.device("cpu"))
        assert "key" not in builds.done
        assert builds.once("key", lambda: (_ for _ in ()).throw(ValueError("garbage")), torch.device("cpu")).refused


def test_a_build_worker_imports_the_kernels_module_from_its_folder(caplog):
    """The process form's worker registers the kernels' top package bare (its __init__ may import ComfyUI) and imports
    the kernel's module; here, without a GPU, it reaches the kernel's preload, whose error it reports."""
    import logging

    from kernels import process_builds
    from kernels.int8 import linear
    with caplog.at_level(logging.INFO, logger=process_builds.__name__):
        process_builds.build_in_processes([(linear._int8_linear_kernel, "{}")], workers=1)
    said = caplog.text
    assert "kernels.int8.linear._int8_linear_kernel" in said and "ModuleNotFoundError" not in said, said
