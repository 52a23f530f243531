"""Whether cuBLAS's BF16 products run slower replayed from a CUDA graph than eagerly, at a text encoder's shapes
(Qwen3-4B's 36 layers of QKV, OUT, UP and DOWN products over 64 rows, 7.3 GB of weights): eager, a graph captured as
torch.cuda.graph does, and one captured after torch._C._cuda_clearCublasWorkspaces() as GraphedStep captures
(dit_core/gpu/step_graph.py), ms a pass each. The fused text encoder replayed from its graph took longer than eager
(35 against 16-22 ms at a short prompt, H100): this says whether its products are why.

    python bench/probe_cublas_capture.py    # on a GPU
"""
from __future__ import annotations

import torch

F = torch.nn.functional
SHAPES = [(6144, 2560), (2560, 4096), (19456, 2560), (2560, 9728)]  # QKV, OUT, UP (gate and value), DOWN
LAYERS, ROWS = 36, 64


def ms_a_call(call, runs: int = 10) -> float:
    call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(runs):
        call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / runs


def main() -> int:
    if not torch.cuda.is_available():
        print("probe_cublas_capture: needs a CUDA GPU")
        return 2
    torch.manual_seed(0)
    weights = [[torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 50 for n, k in SHAPES]
               for _ in range(LAYERS)]
    x = torch.randn(ROWS, 2560, device="cuda", dtype=torch.bfloat16)

    def layers(y):
        for qkv, out, up, down in weights:
            y = F.linear(F.linear(F.linear(F.linear(y, qkv)[:, :4096], out), up)[:, :9728], down)
        return y
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}: {LAYERS} layers' products over {ROWS} rows")
    print(f"eager: {ms_a_call(lambda: layers(x)):.2f} ms")
    for cleared in (False, True):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # the warm-up, as a capture needs
            layers(x)
        torch.cuda.current_stream().wait_stream(side)
        if cleared:
            torch._C._cuda_clearCublasWorkspaces()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            layers(x)
        label = "replayed, the workspaces cleared before the capture" if cleared else "replayed"
        print(f"{label}: {ms_a_call(graph.replay):.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
