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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("sandwich", [True, False], ids=["sandwich", "plain"])
def test_a_new_row_count_builds_no_kernel(sandwich):
    """kernels/jit.py: once a block ran at one count of rows, another count (a prompt of another length) builds
    nothing, whether it divides by 16 or not: every kernel it launches is in the caches already."""
    from triton import knobs
    from tiny_models import random_block

    from dit_core.arch import Arch
    from dit_core.gpu.block import GpuBlock
    from dit_core.modulation import Modulation
    from dit_core.sequence import sequence_of

    a = Arch(family="test", hidden=1024, layers=1, refiner=0, heads=8, head=128, ffn=2816, latents=16, patch=(2, 2),
             text_dim=64, freq_dim=256, time_hidden=1024, time_dim=256, eps=1e-5, qk_eps=1e-5, final_eps=1e-6,
             rope_axes=(32, 48, 48), rope_theta=256.0)
    block = GpuBlock.of(random_block(a, sandwich, seed=0).quantized(), torch.device("cuda"))
    g = torch.Generator().manual_seed(0)
    mods = Modulation(*(0.3 * torch.randn(2, a.hidden, generator=g).cuda() for _ in range(4)))
    built = []

    def step(rows: int):
        row_map = (torch.arange(rows) >= 77).long()
        seq = sequence_of(torch.randint(0, 64, (rows, 3), generator=g), row_map, a.rope_axes, a.rope_theta)
        block.forward(a, torch.randn(rows, a.hidden, generator=g).cuda(), mods, seq.to("cuda"))
        torch.cuda.synchronize()

    step(4096 + 80)
    previous = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = lambda *, fn, key, **_: built.append((fn.name, key)) and False
    try:
        for rows in (4096 + 77, 4096 + 512, 1000):
            step(rows)
    finally:
        knobs.runtime.jit_cache_hook = previous
    if built:  # the whole keys: which argument's specialization moved
        pytest.fail("\n".join(f"{name}: {key}" for name, key in built))


def test_holds_keep_a_building_threads_launches_and_pass_the_others(monkeypatch):
    """builds.Holds, Triton's hook while dry steps run: a launch from a thread inside holding() is recorded and
    answered "handled"; one from any other thread goes to the hook installed before (here one that says no), even
    while the first holds; a thread that has left holding() is never held again."""
    import threading
    from types import SimpleNamespace

    from triton import knobs

    from dit_core.gpu.builds import Holds
    before = []
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", lambda **launch: before.append(launch["key"]) or False)
    holds = Holds()

    def launch(key: str) -> bool:
        fn = SimpleNamespace(module="kernels.m", name="k", jit_function="the kernel")
        return knobs.runtime.jit_cache_hook(key=key, fn=fn, compile={"specialization_data": f"spec {key}"})

    held, elsewhere = {}, []
    with holds.holding(held):
        assert launch("a") is True
        other = threading.Thread(target=lambda: elsewhere.append(launch("b")))
        other.start()
        other.join()
    assert held == {("kernels.m", "k", "a"): ("the kernel", "spec a")}
    assert elsewhere == [False] and before == ["b"]
    assert launch("c") is False and before == ["b", "c"] and len(held) == 1


def test_the_first_build_waits_for_the_one_beside_the_load():
    """AheadBuilds.beside (builds.built_beside's thread, started as the model loaded): joined before the first build,
    so no kernel builds twice, and dropped."""
    import threading
    import time
    done = []
    beside = threading.Thread(target=lambda: (time.sleep(0.05), done.append("beside")))
    beside.start()
    builds = AheadBuilds(beside=beside)
    assert builds.once("key", lambda: done.append("step"), torch.device("cpu")).refused  # (the CPU: no dry step)
    assert done == ["beside"] and builds.beside is None


def test_work_on_its_own_thread_says_a_failure_in_one_line(monkeypatch, caplog):
    """builds.on_own_thread (the builds beside a load, the VAE's norms): work runs on the caller's device, and its
    failure is one INFO line naming what was not built and the error (the traceback only at DEBUG)."""
    import logging

    from dit_core.gpu.builds import on_own_thread
    devices = []
    monkeypatch.setattr(torch.cuda, "set_device", devices.append)
    with caplog.at_level(logging.INFO):
        on_own_thread(lambda: 1 / 0, torch.device("cuda", 3), "t", "kernels not built here").join()
    said = [r for r in caplog.records if r.levelno == logging.INFO]
    assert devices == [3] and len(said) == 1 and not said[0].exc_info
    assert said[0].getMessage() == "SwiftDiT: kernels not built here (ZeroDivisionError: division by zero)"


def test_work_on_its_own_thread_runs_in_the_callers_inference_mode(monkeypatch):
    """ComfyUI runs its nodes in inference mode: the builds beside a load run in it too, so they may write the
    caller's inference tensors (a thread's own mode is off)."""
    from dit_core.gpu.builds import on_own_thread
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    modes = []
    with torch.inference_mode():
        made = torch.zeros(3)
        on_own_thread(lambda: (modes.append(torch.is_inference_mode_enabled()), made.add_(1)),
                      torch.device("cuda", 0), "t", "not done").join()
    on_own_thread(lambda: modes.append(torch.is_inference_mode_enabled()), torch.device("cuda", 0), "t", "").join()
    assert modes == [True, False] and made.tolist() == [1, 1, 1]


def test_the_first_build_names_what_the_stand_in_beside_the_load_missed(monkeypatch, caplog):
    """A first step that still builds after the stand-in's builds beside the load says which kernels they missed
    (the H100 server's Klein built one there, 2.5-3 s of its first prompt), and the last kernel ready (what bounds a
    build on many threads)."""
    import logging
    import threading

    from dit_core.gpu import builds
    monkeypatch.setattr(builds, "build_ahead", lambda *a: builds.Built(1, 2.5, 1, names=("_rows_kernel",),
                                                                       last="_rows_kernel at 2.41 s",
                                                                       specialized=("_rows_kernel(FORM=1; ...)",)))
    beside = threading.Thread(target=lambda: None)
    beside.start()
    with caplog.at_level(logging.INFO):
        AheadBuilds(beside=beside).once("key", lambda: None, torch.device("cuda"))
    assert "(1 threads; the last ready: _rows_kernel at 2.41 s); the stand-in's builds beside the load missed " \
           "_rows_kernel(FORM=1; ...)" in caplog.text


def test_a_specialization_is_described_by_its_constexprs_alignments_and_descriptors():
    """What tells two builds of one kernel apart (a stand-in's and a sampler's), from the data Triton's hook gives."""
    import inspect
    import types

    from triton.runtime.jit import serialize_specialization_data

    from dit_core.gpu.builds import _specialized
    signature = {"a_desc": "tensordesc<i8[128, 128]>", "q_ptr": "*i8", "M": "i32", "FORM": "constexpr"}
    target = (types.SimpleNamespace(),) if "target" in inspect.signature(serialize_specialization_data).parameters \
        else ()  # (newer Tritons; the H100s' 3.6 has none)
    data = serialize_specialization_data("kernels.int8.linear_hopper:_k", signature, {(3,): 2},
                                         {(1,): [["tt.divisibility", 16]]}, types.SimpleNamespace(), "key", *target)
    assert _specialized(data) == "_k(FORM=2; multiples of 16: q_ptr; a_desc:tensordesc<i8[128, 128]>)"
    assert _specialized("not json") == "not json"


def test_a_kernel_built_as_it_launched_is_said(monkeypatch, caplog):
    """Holds' post-compile hook: a launch outside the builds ahead whose kernel took SLOW_LAUNCH_S or more to be
    ready (built, not loaded from Triton's disk cache) names the kernel and its specialization in the log; a preload
    (build_ahead's own builds, which on an H100 logged a false one) does not."""
    import logging
    import types

    from dit_core.gpu import builds
    holds, clock = builds.Holds(), iter([10.0, 10.05, 20.0, 21.5])
    monkeypatch.setattr(builds.time, "perf_counter", lambda: next(clock))
    launch = {"fn": types.SimpleNamespace(name="_add_rms_rows_kernel"), "repr": "_add_rms_rows_kernel(M: i32)"}
    with caplog.at_level(logging.INFO):
        preload = {**launch, "is_manual_warmup": True}  # build_ahead's own builds: not timed
        assert holds.hook(**preload) is False and holds.post_compile(**preload) is False
        for _ in range(2):  # loaded from the disk cache in 0.05 s, then built in 1.5 s
            assert holds.hook(**launch) is False and holds.post_compile(**launch) is False
    said = [r.getMessage() for r in caplog.records]
    assert said == ["SwiftDiT: Triton built _add_rms_rows_kernel as it launched, in 1.50 s (the builds ahead missed "
                    "it): _add_rms_rows_kernel(M: i32)"]
