import torch
F = torch.nn.functional
d = 'cuda'
torch.manual_seed(0)
shapes = [(6144, 2560), (2560, 4096), (19456, 2560), (2560, 9728)]
W = [[torch.randn(n, k, device=d, dtype=torch.bfloat16) / 50 for n, k in shapes] for _ in range(36)]
x = torch.randn(64, 2560, device=d, dtype=torch.bfloat16)
def f(y):
    for a, b, c, e in W:
        y = F.linear(F.linear(F.linear(F.linear(y, a)[:, :4096], b), c)[:, :9728], e)
    return y
def ms(call, n=10):
    call(); torch.cuda.synchronize()
    s, t = torch.cuda.Event(True), torch.cuda.Event(True)
    s.record()
    for _ in range(n): call()
    t.record(); torch.cuda.synchronize()
    return s.elapsed_time(t) / n
print("eager", ms(lambda: f(x)))
for clear in (False, True):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        f(x)
    torch.cuda.current_stream().wait_stream(side)
    if clear:
        torch._C._cuda_clearCublasWorkspaces()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        out = f(x)
    print("graph, workspaces cleared before" if clear else "graph", ms(g.replay))
