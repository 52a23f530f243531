"""Whether a text encoder's BF16 products (cuBLAS) or its causal attention (SDPA) run slower replayed from a CUDA
graph than eagerly, at Qwen3-4B's shapes (36 layers: QKV, OUT, UP and DOWN products, 7.3 GB of weights; 32 query
heads of 128 over 8 key heads) over 64 and 704 rows: eager, a graph captured as torch.cuda.graph does, and one
captured after torch._C._cuda_clearCublasWorkspaces() as GraphedStep captures (dit_core/gpu/step_graph.py), ms a
pass each. The fused text encoder replayed from its graph took longer than eager (35.4 / 98.3 ms at 24 / 688
tokens against 21.8 / 16.6, H100): this says whether these are why.

    python bench/probe_cublas_capture.py    # on a GPU
"""
from __future__ import annotations

import torch

F = torch.nn.functional
SHAPES = [(6144, 2560), (2560, 4096), (19456, 2560), (2560, 9728)]  # QKV, OUT, UP (gate and value), DOWN
LAYERS, ROWS, HEADS, HEAD = 36, (64, 704), 32, 128  # rows: a short prompt's padded length, a long one's


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

    def products(y):
        for qkv, out, up, down in weights:
            y = F.linear(F.linear(F.linear(F.linear(y, qkv)[:, :4096], out), up)[:, :9728], down)
        return y

    def attention(q):
        for _ in range(LAYERS):
            q = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return q
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, ms a pass of {LAYERS} layers")
    for rows in ROWS:
        probe("products", products, torch.randn(rows, 2560, device="cuda", dtype=torch.bfloat16))
        probe("attention", attention, torch.randn(1, HEADS, rows, HEAD, device="cuda", dtype=torch.bfloat16))
    return 0


def probe(name: str, layers, x: torch.Tensor) -> None:
    rows = x.shape[-2]
    print(f"{name}, {rows} rows, eager: {ms_a_call(lambda: layers(x)):.2f}")
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
        print(f"{name}, {rows} rows, {label}: {ms_a_call(graph.replay):.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
