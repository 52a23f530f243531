"""dit_core/gpu/step_graph.py's bookkeeping on the CPU: which shapes hold a graph, the eager fallback when a capture
fails, the oldest shape dropped past MAX_SHAPES, clear(), the rows kept per conditioning tensor (KeptRows). The
replays themselves are GPU tests (tests/dit_core/test_block_gpu.py, tests/families/test_flux3_klein_sampling.py)."""
import contextvars
import logging
import weakref

import pytest
import torch

from dit_core.gpu import step_graph
from dit_core.families.ltx25_positions import Grid, Guide
from dit_core.gpu.step_graph import MAX_SHAPES, GraphedStep, KeptRows, from_tensor_tree, tensor_tree


class FakeGraph:
    """Stands in for a captured graph: replay() runs the step on the captured inputs into the captured output,
    as a CUDA graph replays its kernels on its static tensors."""

    def __init__(self, step, statics):
        self.step, self.statics = step, statics
        self.out = step(*statics)

    def replay(self):
        for out, new in zip(*((o,) if torch.is_tensor(o) else o for o in (self.out, self.step(*self.statics)))):
            out.copy_(new)


@pytest.fixture
def fake_capture(monkeypatch):
    captured = []

    def capture(self, inputs, fixed):
        statics = [t.clone() for t in inputs]
        warm = self.step(*statics, **fixed)
        graph = FakeGraph(lambda *t: self.step(*t, **fixed), statics)
        captured.append(tuple(t.shape for t in inputs))
        return (graph, statics, graph.out), warm

    monkeypatch.setattr(GraphedStep, "_capture", capture)
    return captured


def test_one_capture_per_shape_and_fresh_outputs(fake_capture):
    step = GraphedStep(lambda x, t: x * t)
    a, b = torch.randn(3, 4), torch.randn(5, 4)
    out = step(a, torch.tensor([2.0]))
    again = step(a, torch.tensor([3.0]))
    assert torch.equal(out, a * 2) and torch.equal(again, a * 3)  # the first result is a copy, not overwritten
    assert torch.equal(step(b, torch.tensor([1.0])), b)
    assert fake_capture == [((3, 4), (1,)), ((5, 4), (1,))]


def test_a_shape_first_call_is_its_warm_up(fake_capture):
    """A shape's first call returns the warm-up's output (no replay after the capture): the step runs for the
    warm-up and the capture, then once a replay."""
    calls = []
    step = GraphedStep(lambda x: calls.append(1) or x * 2)
    assert torch.equal(step(torch.ones(3)), torch.full((3,), 2.0)) and len(calls) == 2
    assert torch.equal(step(torch.full((3,), 4.0)), torch.full((3,), 8.0)) and len(calls) == 3


@pytest.mark.parametrize("host_bound", [True, False])
def test_host_bound_shapes_are_captured_at_their_third_call(fake_capture, monkeypatch, host_bound):
    """capture="host_bound": a shape's first call runs eagerly, its second is timed; a host-bound one is captured
    at its third call (the warm-up's output) and replays after; a GPU-bound one stays eager. Shapes are counted
    apart, and clear() forgets the counts."""
    timed = []
    monkeypatch.setattr(step_graph, "timed_step",
                        lambda run, device: (timed.append(1) or run(), 0.010 if host_bound else 0.050, 0.020))
    calls = []
    step = GraphedStep(lambda x: calls.append(x.shape[0]) or x * 2, capture="host_bound")
    for rows in (3, 5, 3, 3, 3):
        assert torch.equal(step(torch.ones(rows)), torch.full((rows,), 2.0))
    # 3: eager, timed, then (host-bound) warm-up + capture, replay; or eager thrice. 5: eager once
    assert calls == ([3, 5, 3, 3, 3, 3] if host_bound else [3, 5, 3, 3, 3]) and len(timed) == 1
    assert fake_capture == ([((3,),)] if host_bound else [])
    (entry,) = step.graphs.values()  # the 3-row shape's, decided
    assert (entry is not None) == host_bound
    assert list(step.eager_calls.values()) == [1]  # 5 rows, seen once
    step.clear()
    assert step.graphs == {} and step.eager_calls == {}
    with pytest.raises(ValueError, match="capture is one of always, second, host_bound"):
        GraphedStep(lambda x: x, capture="sometimes")


def test_second_sight_shapes_are_captured_at_their_second_call(fake_capture):
    """capture="second" (a text encoder's): a shape's first call runs eagerly, its second is captured (the
    warm-up's output) and later ones replay; shapes are counted apart."""
    calls = []
    step = GraphedStep(lambda x: calls.append(x.shape[0]) or x * 2, capture="second")
    for rows in (3, 5, 3, 3):
        assert torch.equal(step(torch.ones(rows)), torch.full((rows,), 2.0))
    assert calls == [3, 5, 3, 3, 3]  # 3: eager, warm-up + capture, replay; 5: eager
    assert fake_capture == [((3,),)] and list(step.eager_calls.values()) == [1]


def test_oldest_shape_goes_past_the_limit_and_clear_drops_all(fake_capture):
    step = GraphedStep(lambda x: x + 1)
    for rows in range(1, MAX_SHAPES + 2):
        step(torch.zeros(rows, 2))
    assert [key[0][0][0] for key in step.graphs] == [(rows, 2) for rows in range(2, MAX_SHAPES + 2)]
    step.clear()
    assert step.graphs == {} and step.pool is None


def test_tuple_outputs_are_copied(fake_capture):
    step = GraphedStep(lambda x: (x + 1, x * 2))
    first = step(torch.ones(2))
    step(torch.full((2,), 5.0))
    assert [t.tolist() for t in first] == [[2.0, 2.0], [2.0, 2.0]]


def test_failed_capture_runs_that_shape_eagerly(monkeypatch, caplog):
    calls = []

    def failing(self, inputs, fixed):
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    monkeypatch.setattr(GraphedStep, "_capture", failing)
    step = GraphedStep(lambda x: calls.append(x.shape) or x - 1)
    with caplog.at_level(logging.WARNING, logger=step_graph.log.name):
        assert torch.equal(step(torch.ones(3)), torch.zeros(3))
        assert torch.equal(step(torch.ones(3)), torch.zeros(3))
    assert calls == [(3,), (3,)] and list(step.graphs.values()) == [None]
    assert [r.message for r in caplog.records].count(
        "SwiftDiT: a CUDA graph of the step could not be captured (operation not permitted when stream is "
        "capturing); running it eagerly") == 1  # once per shape, its first line


def test_model_graphs_follow_the_blocks_placement(monkeypatch):
    """ModelGraphs.usable: replay while the blocks' generation is the captured one; a change (or streaming, None)
    drops every step's graphs, into a fresh shared pool."""
    import dit_core.gpu.streaming as streaming
    from dit_core.gpu.step_graph import ModelGraphs

    pools = iter(range(100))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (next(pools), 0))
    graphs = ModelGraphs(lambda x: x, lambda x: x)
    usable = []
    for generation in (0, 0, None, None, 1, 1, 2):
        monkeypatch.setattr(streaming, "resident_generation", lambda blocks, g=generation: g)
        for step in graphs.steps:
            step.graphs.setdefault("shape", "a graph")  # what a replay would have captured
        before = graphs.steps[0].pool
        usable.append(graphs.usable(blocks=None))
        kept = all(step.graphs for step in graphs.steps)
        assert kept == (graphs.steps[0].pool == before)  # dropped graphs come with a new pool
        assert graphs.steps[0].pool == graphs.steps[1].pool
        usable[-1] = (usable[-1], kept)
    # (replays, graphs kept): the first placement captures afresh; streaming (None) drops them once, and nothing
    # is captured while it lasts (kept here only because the test planted a graph).
    assert usable == [(True, False), (True, True), (False, False), (False, True), (True, False), (True, True),
                      (True, False)]


def test_kept_rows_follow_the_tensors():
    """What a graphed step makes from its conditioning (FLUX.3's txt_in projection, Z-Image's refined caption): kept for
    the tensors that come back unchanged (positive and negative alternating, a batch's images), projected again for a
    tensor changed in place or a new one."""
    calls = []

    def project(rows, dtype):
        calls.append(rows)
        return rows.to(dtype) * 2

    kept = KeptRows(project)
    pos, neg = torch.ones(3, 4), torch.zeros(5, 4)
    first = kept(pos, torch.float32)
    assert kept(neg, torch.float32) is not first and kept(pos, torch.float32) is first and len(calls) == 2
    assert kept(neg, torch.float32) is kept(neg, torch.float32) and len(calls) == 2
    pos.add_(1)  # in place: its version moves on
    assert torch.equal(kept(pos, torch.float32), torch.full((3, 4), 4.0)) and len(calls) == 3
    assert kept(pos, torch.float64).dtype == torch.float64 and len(calls) == 4
    assert torch.equal(kept(torch.ones(3, 4), torch.float32), torch.full((3, 4), 2.0)) and len(calls) == 5
    batch = torch.ones(2, 3, 4)  # a batch's rows: a new view of the same tensor each step
    assert kept(batch[1], torch.float32) is kept(batch[1], torch.float32) and len(calls) == 6
    assert kept(batch[0], torch.float32) is not kept(batch[1], torch.float32) and len(calls) == 7
    batch[1].mul_(3)  # through another view: the shared version counter moves
    assert torch.equal(kept(batch[1], torch.float32), torch.full((3, 4), 6.0)) and len(calls) == 8
    four = [torch.full((2, 4), float(i)) for i in range(4)]  # two images, positive and negative each: all kept
    made = [kept(t, torch.float32) for t in four]
    assert all(kept(t, torch.float32) is m for t, m in zip(four, made)) and len(calls) == 12


def test_kept_rows_of_inference_tensors():
    """Under torch.inference_mode (every ComfyUI node runs in it) tensors have no version counter: the rows are kept
    for the same values, and made again once they change in place."""
    calls = []
    kept = KeptRows(lambda rows, dtype: calls.append(rows) or rows.to(dtype) * 2)
    with torch.inference_mode():
        pos, batch = torch.ones(3, 4), torch.ones(2, 3, 4)
        first = kept(pos, torch.float32)
        assert kept(pos, torch.float32) is first and len(calls) == 1
        assert kept(batch[1], torch.float32) is kept(batch[1], torch.float32) and len(calls) == 2
        pos.add_(1)
        assert torch.equal(kept(pos, torch.float32), torch.full((3, 4), 4.0)) and len(calls) == 3
        batch[1].mul_(3)
        assert torch.equal(kept(batch[1], torch.float32), torch.full((3, 4), 6.0)) and len(calls) == 4


def test_a_sampler_runs_copy_is_kept_without_reading_its_values(monkeypatch):
    """A sampler run's copy of a conditioning (ksampler.run_copy, made outside inference mode) is known to KeptRows
    by its base and version counter, under inference mode too: its values are never compared (a read back of the GPU
    that made the step queued ahead wait), and a change in place still makes the rows again."""
    from dit_core.sampling.ksampler import run_copy
    calls, compared, equal = [], [], torch.equal
    monkeypatch.setattr(torch, "equal", lambda a, b: compared.append(1) or equal(a, b))
    kept = KeptRows(lambda rows, dtype: calls.append(rows) or rows.to(dtype) * 2)
    with torch.inference_mode():
        own = run_copy(torch.ones(2, 3, 4), torch.device("cpu"))
        first = kept(own[0], torch.float32)
        assert not own.is_inference() and all(kept(own[0], torch.float32) is first for _ in range(3))
        assert len(calls) == 1 and not compared
        own.mul_(3)
        assert torch.equal(kept(own[0], torch.float32), torch.full((3, 4), 6.0)) and len(calls) == 2


def test_a_failed_capture_under_cuda_malloc_async_ends_the_captures(monkeypatch, caplog):
    """ComfyUI's default allocator (cudaMallocAsync): captures are tried; a warm-up out of memory leaves the others
    to be tried, but once a capture fails (which leaves PyTorch's allocator unable to capture again), that shape and
    every later one run eagerly, the log says why, and what the capture made is kept (freed, it would abort the
    process)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_allocator_backend", lambda: "cudaMallocAsync")
    monkeypatch.setattr(step_graph, "_ASYNC_CAPTURE_FAILED", [])
    monkeypatch.setattr(step_graph, "_KEPT_FROM_FAILED_CAPTURES", [])
    tried = []

    def capture(self, inputs, fixed):
        tried.append(inputs[0].shape[0])
        if tried == [2]:
            raise RuntimeError("CUDA out of memory")  # (before the capture: the warm-up's clones)
        raise step_graph.CaptureFailed("CUDA error: capturing stream has unjoined work")
    monkeypatch.setattr(GraphedStep, "_capture", capture)
    step = GraphedStep(lambda x: x * 2)
    with caplog.at_level(logging.INFO, logger=step_graph.log.name):
        for rows in (2, 3, 3, 5, 5):
            assert torch.equal(step(torch.ones(rows)), torch.full((rows,), 2.0))
    assert tried == [2, 3] and list(step.graphs.values()) == [None, None, None]
    (kept,) = step_graph._KEPT_FROM_FAILED_CAPTURES  # the exception, whose frames hold what the capture made
    assert isinstance(kept, step_graph.CaptureFailed) and kept.__traceback__ is not None
    assert [r.message for r in caplog.records] == [
        "SwiftDiT: a CUDA graph of the step could not be captured (CUDA out of memory); running it eagerly",
        "SwiftDiT: a CUDA graph of the step could not be captured (CUDA error: capturing stream has unjoined work); "
        "running it eagerly; no more captures in this process, which keeps what the capture made (restart ComfyUI "
        "to free it)",
        "SwiftDiT: steps run without CUDA graphs: a capture failed under PyTorch's cudaMallocAsync allocator (CUDA "
        "error: capturing stream has unjoined work); start ComfyUI with --disable-cuda-malloc to replay each step "
        "from a CUDA graph"]


def test_dropped_graphs_give_their_memory_back_under_cuda_malloc_async(fake_capture, monkeypatch):
    """Under cudaMallocAsync, clear() asks the driver to trim the graphs' memory (once a device that held a graph,
    after the GPU's work); under PyTorch's own allocator it does not (the pool goes back with the graphs)."""
    trims = []

    class Driver:
        def cuDeviceGet(self, handle, index):
            handle._obj.value = 10 + index
            return 0

        def cuDeviceGraphMemTrim(self, handle):
            trims.append(handle.value)
    monkeypatch.setattr(step_graph, "_cuda_driver", lambda: Driver())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: trims.append("synchronized"))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    step = GraphedStep(lambda x: x * 2)
    for backend, expected in (("native", []), ("cudaMallocAsync", ["synchronized", 11])):
        monkeypatch.setattr(step_graph, "async_allocator", lambda: backend == "cudaMallocAsync")
        step(torch.ones(3))
        step(torch.ones(5))
        step.clear()
        assert trims == expected and step.graphs == {}
        step.clear()  # nothing held: nothing to trim
        assert trims == expected


def test_the_launcher_gets_addresses_within_a_capture(monkeypatch):
    """addresses_for_triton: within, each tensor argument reaches the launcher as its address (other arguments as
    they are), and the scratch allocator gives addresses of buffers it keeps until the context ends (for good where
    the capture raised); after, the launcher and the allocator are as they were."""
    class Launcher:
        def __call__(self, grid, *args, flag=None):
            return grid, args, flag
    scratch = contextvars.ContextVar("allocator")
    made = []  # weak references to the buffers the allocator made

    def make(size, align, stream):
        buffer = torch.zeros(size, dtype=torch.int8)
        made.append((weakref.ref(buffer), buffer.data_ptr()))
        return buffer
    scratch.set(make)
    allocate = scratch.get()
    monkeypatch.setattr(step_graph, "_triton_launcher", lambda: Launcher)
    monkeypatch.setattr(step_graph, "_triton_scratch_allocator", lambda: scratch)
    t = torch.zeros(4)
    with step_graph.addresses_for_triton():
        assert Launcher()(7, t, None, 3, flag="x") == (7, (t.data_ptr(), None, 3), "x")
        assert scratch.get()(128, 16, None) == made[0][1] and made[0][0]() is not None  # kept within
    assert made[0][0]() is None and Launcher()(7, t)[1][0] is t and scratch.get() is allocate
    monkeypatch.setattr(step_graph, "_KEPT_FROM_FAILED_CAPTURES", [])
    with pytest.raises(RuntimeError), step_graph.addresses_for_triton():
        scratch.get()(128, 16, None)
        raise RuntimeError("capture failed")
    # a failed capture's buffers stay (freeing them would abort the process under cudaMallocAsync)
    assert Launcher()(7, t)[1][0] is t and scratch.get() is allocate and made[1][0]() is not None


def test_fixed_values_key_their_own_graph(fake_capture):
    step = GraphedStep(lambda x, scale: x * scale)
    x = torch.ones(2)
    assert torch.equal(step(x, scale=2.0), x * 2) and torch.equal(step(x, scale=3.0), x * 3)
    assert torch.equal(step(x, scale=2.0), x * 2) and len(fake_capture) == 2


def test_a_tensor_tree_gives_its_value_back():
    """Dataclasses (frozen, nested), tuples and lists walked; the structure hashable and equal for equal
    non-tensor values, different where they differ."""
    from dit_core.sequence import Sequence
    seq = Sequence(torch.tensor([0, 0, 1]), torch.zeros(3, 2), torch.ones(3, 2))
    value = (torch.arange(3.0), [seq, None, "own"], Grid(2, 1, 3, guides=(Guide(16, 17, 0.5),)))
    tensors, structure = tensor_tree(value)
    assert len(tensors) == 4 and hash(structure) == hash(tensor_tree(value)[1])
    back = from_tensor_tree(structure, [t + 1 for t in tensors])
    assert torch.equal(back[0], value[0] + 1) and back[1][1:] == [None, "own"] and back[2] == value[2]
    assert back[1][0].starts == (0, 2) and torch.equal(back[1][0].sin, torch.full((3, 2), 2.0))
    other = (value[0], [Sequence(torch.tensor([0, 1, 1]), seq.cos, seq.sin), None, "own"], value[2])
    assert tensor_tree(other)[1] != structure  # the map's runs (host ints) differ


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graphed_products_drop_and_capture_again():
    """BF16 products through cuBLAS (its workspace made within the capture), a temporary left in a reference cycle:
    two shapes captured and replayed equal to the eager step, eager products between replays, every graph dropped
    and captured again (under cudaMallocAsync: test_block_gpu.py's subprocess, which reads the allocator's
    warnings)."""
    w = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)

    def product(x):
        hidden = torch.nn.functional.gelu(x @ w.T)
        cycle = [hidden]
        cycle.append(cycle)  # freed only by the collector
        return hidden @ w
    step = GraphedStep(product)
    for _ in range(2):
        for rows in (64, 320, 64):
            x = torch.randn(rows, 512, device="cuda", dtype=torch.bfloat16)
            assert torch.equal(step(x), product(x))
        step.clear()
        torch.cuda.synchronize()
    assert step.graphs == {}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_timed_step_tells_the_host_from_the_gpu():
    """Three hundred tiny launches keep the GPU waiting on the host; three 8192^3 products keep the host waiting."""
    device, x = torch.device("cuda"), torch.ones(8, device="cuda")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    tiny = lambda: [x.add_(1) for _ in range(300)][-1]  # noqa: E731
    big = lambda: a @ a @ a @ a  # noqa: E731
    for run in (tiny, big):
        run()  # builds and plans first, as GraphedStep times a shape's second call
    _, gpu, host = step_graph.timed_step(tiny, device)
    assert gpu < step_graph.HOST_BOUND * host, (gpu, host)
    _, gpu, host = step_graph.timed_step(big, device)
    assert gpu > step_graph.HOST_BOUND * host, (gpu, host)


def test_a_capture_collects_only_the_cycles_its_step_made():
    """collector_confined: the cycles made within are collected when asked; those made before stay for a later
    collection outside (a capture must not free memory made before it), and no collection runs by itself within."""
    import gc

    class Cycle:
        def __init__(self, gone):
            self.me = self
            weakref.finalize(self, gone.append, self.__class__.__name__)

    class Before(Cycle):
        pass

    class Within(Cycle):
        pass

    gone = []
    was_enabled = gc.isenabled()
    Before(gone)
    with step_graph.collector_confined() as collect:
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        Within(gone)
        collect()
        assert gone == ["Within"]
    assert gc.get_freeze_count() == 0 and gc.isenabled() == was_enabled
    gc.collect()
    assert gone == ["Within", "Before"]
