"""Attention on 8-bit matrix cores for both products: q k^T in INT8, p v in e4m3, the softmax in f32 (Triton).

Issue 35: MiniMax H3's attention (56 heads x 128, 15911 rows) took 13.0 ms a layer in cuDNN's bf16 (~560 TFLOP/s
at the H200's 700 W); 2x diffusers' step needs ~9 ms, i.e. both products at 8 bits (kernels/int8/attention.py keeps
p v in bf16). Plain Triton `tl.dot`: e4m3 operands lower to Hopper's fp8 wgmma, and the CPU interpreter runs it.
For rows q, k, v [M, H D] bf16 (D = 128; or [1, H, M, D]), each head alike:
0. Smoothing (torch, in the launcher): mk[d], mv[d] the means of k[:, d] and v[:, d] over every 8th row; av[d] =
   max_m |v[m, d] - mv[d]| (1e-30 for 0). Exact: q mk^T shifts a row of scores by a constant, which the softmax drops, and
   a row of p / l sums to 1, so p v / l = p (v - mv) / l + mv. It keeps a bias shared by the rows out of k's block
   scale and out of v's codes.
1. Codes. q a row: a = max_d |q[m, d]|, sq[m] = a / 127, cq = rint(q 127 / a) (ties to even). k - mk a block of
   BN = 64 rows: sk[b] = a / 127 over the block, ck alike (INT8: its absolute step beats e4m3's 3 mantissa bits,
   ~3x less score error). v: cv[d, m] = e4m3((v[m, d] - mv[d]) 448 / av[d]) stored turned, [H D, M'] (M' = M
   rounded up to 128; codes past M are 0), so p v's B operand is K-major as it is loaded; sv[d] = av[d] / 448.
2. s[i, j] = cq[i] . ck[j], exact in int32 (|s| <= 128 * 127^2 < 2^22).
3. Key block b in turn, c_i = sq[i] log2(e) / sqrt(D) * sk[b]: m_i' = max(m_i, c_i max_j s_ij),
   p_ij = 2^(c_i s_ij - m_i' + log2 448) in [0, 448], l_i = l_i 2^(m_i - m_i') + sum_j p_ij,
   acc_i = acc_i 2^(m_i - m_i') + sum_j e4m3(p_ij) cv[:, j]: the block's product summed in f32 apart from acc (the
   fp8 wgmma's own accumulator keeps ~14 bits; 249 blocks summed in it would lose more than a block's rounding).
   c s - m' + log2 448 is formed as fb c - (m' + 1.5 2^23 c - log2 448), fb = s + 1.5 2^23 as f32 bits: the scores
   reach f32 without the quarter-rate int-to-float instruction (as kernels/int8/attention.py).
4. o[i, d] = acc[i, d] / l_i * sv[d] + ov[d], rounded once to bf16; ov[d] = mv[d] - e[d], e[d] = sv[d] times the
   mean over the rows of (cv[d, m] - its unrounded value): v's coding error shared by the rows, which broad
   attention (H3's rows: ~6000 effective keys of 15911) passes to o whole (e4m3 errors of a bf16 grid shifted by mv
   have a mean ~1.4x that of independent ones); it is o's exactly where p is uniform. 4.4% -> 3.6% at H3's size.
Error against f32 attention at H3-like rows (q, k RMS-normed, gains 1 +- 0.1, rotary; v random), 1024-15911 keys:
3.3-3.6% (3.7-3.9% with gains 1 +- 0.5); on the same rows the INT8-score kernel's math 1.1-1.2% (2.0%), bf16 p
0.23%. What drives it: e4m3's 3 mantissa bits, in p (2.4-2.7% alone) and in v (2.0-2.2% alone, after step 4's
offset): a relative error of each element that random v passes to o whole (o = sum_j p_j v_j is itself a sum of
near-random terms); the INT8 scores add ~1.1%. A bias along the rows is exact (step 0).
The kernel: a program a BLOCK_M-row block of one head (programs of a head adjacent, so its k and v stay in L2);
q's codes loaded once, k's and v's by TMA through num_stages slots; both products are tl.dot (sm_90a: wgmma s8 and
e4m3; p's layout change is 1 shuffle and 1 byte permute a register). Triton waits for each product before the
softmax (also when the next block's q k^T is issued first: tried), whose exp2 (the MUFU's 16 a clock match the 8-bit
wgmma's 512 FLOP a score at D = 128) then leaves the matrix cores to the SM's other warpgroup. 128 x 64 with 8
warps: 171 registers, one program an SM; 64-row blocks (three programs an SM) would read k and v from L2 twice as
often (~12 TB/s at 1.5 PFLOP/s). bench/bench_attention.py --tiles measures the choice. The codes are the
reference's bit for bit where f32 rounds alike (interpreted: yes); the kernel == reference() up to f32 summation
order, and on the GPU up to fused multiply-adds moving a p across an e4m3 rounding boundary at times.
"""
from __future__ import annotations

import math

import torch

from .rounding import INTERPRETED, round_half_even, rounded_bf16
from .jit import triton_jit

try:
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # torch without Triton: reference() still imports
    triton = tl = TensorDescriptor = None

HEAD, BLOCK_M, BLOCK_N, PAD = 128, 128, 64, 128
NUM_WARPS, NUM_STAGES = 8, 3
SAMPLE = 8  # step 0's means: of every 8th row
FACTOR = 1.4426950408889634 / math.sqrt(HEAD)  # log2(e) / sqrt(D): scores in base 2
LOG2_448 = math.log2(448.0)  # p at the running maximum codes as 448, e4m3's largest value
BIAS = 12582912.0  # 1.5 * 2^23: s + BIAS as f32 bits is that f32 exactly (|s| < 2^22)


def heads_view(t: torch.Tensor, heads: int | None) -> torch.Tensor:
    """Rows [M, H D] or [1, H, M, D] as a [H, M, D] view (no copy)."""
    if t.dim() == 4 and t.shape[0] == 1 and t.shape[3] == HEAD:
        return t[0]
    if t.dim() == 2 and heads and t.shape[1] == heads * HEAD:
        return t.unflatten(1, (heads, HEAD)).transpose(0, 1)
    raise ValueError(f"attention_8bit: q, k, v must be rows [M, heads x {HEAD}] (with heads) or [1, heads, M, "
                     f"{HEAD}], got {tuple(t.shape)} with heads={heads}")


def smoothing(k: torch.Tensor, v: torch.Tensor) -> tuple:
    """Step 0 from [H, M, D] views: (mk, mv, av), f32 [H, D]. The means are of every SAMPLE-th row: any vector
    subtracted is exact, a mean only the best one, and av (a bound) needs every row anyway: one pass over v, not 3."""
    mk, mv = k[:, ::SAMPLE].mean(1, dtype=torch.float32), v[:, ::SAMPLE].mean(1, dtype=torch.float32)
    lo, hi = torch.aminmax(v, dim=1)
    return mk, mv, torch.maximum(hi.float() - mv, mv - lo.float()).clamp(min=1e-30)


def _int8(x: torch.Tensor, amax: torch.Tensor) -> tuple:
    amax = amax.clamp(min=1e-30)
    return torch.round(x * (torch.full_like(amax, 127.0) / amax)).to(torch.int8), amax / 127.0


def codes_reference(q, k, v, mk, mv, av, block_n: int = BLOCK_N) -> tuple:
    """Step 1 on [H, M, D]: cq int8 [H, M, D], sq [H, M], ck int8 [H, M, D], sk [H, ceil(M / block_n)],
    cv e4m3 [H, D, M], sv [H, D], and step 4's offset ov [H, D]."""
    h, m, d = q.shape
    cq, sq = _int8(q.float(), q.float().abs().amax(-1, keepdim=True))
    nb = -(-m // block_n)
    kk = torch.nn.functional.pad(k.float() - mk[:, None, :], (0, 0, 0, nb * block_n - m)).reshape(h, nb, -1, d)
    ck, sk = _int8(kk, kk.abs().amax((2, 3), keepdim=True))
    y = (v.float() - mv[:, None, :]) * (torch.full_like(av, 448.0) / av)[:, None, :]
    cv, sv = y.to(torch.float8_e4m3fn), av / 448.0
    ov = mv - (cv.float() - y).sum(1) * sv / m  # step 4's offset: mv less v's mean coding error
    return (cq, sq[..., 0], ck.reshape(h, -1, d)[:, :m], sk[:, :, 0, 0], cv.transpose(1, 2), sv, ov)


def reference(q, k, v, heads: int | None = None, block_n: int = BLOCK_N) -> torch.Tensor:
    """Steps 0-4 in plain torch, f32, key block by key block as the kernel: rows [M, H D] bf16."""
    q, k, v = (heads_view(t, heads) for t in (q, k, v))
    h, m, d = q.shape
    mk, mv, av = smoothing(k, v)
    cq, sq, ck, sk, cv, sv, ov = codes_reference(q, k, v, mk, mv, av, block_n)
    r = sq * FACTOR
    run = torch.full((h, m), float("-inf"), device=q.device)
    total, acc = torch.zeros(h, m, device=q.device), torch.zeros(h, m, d, device=q.device)
    cqf = cq.float()
    for b in range(sk.shape[1]):
        cols = slice(b * block_n, min(m, (b + 1) * block_n))
        fb = cqf @ ck[:, cols].float().transpose(1, 2) + BIAS  # integers below 2^24: exact in f32
        c = r * sk[:, b:b + 1]
        top = torch.maximum(run, (fb.amax(-1) - BIAS) * c)
        p = torch.exp2(fb * c[..., None] - ((top + BIAS * c) - LOG2_448)[..., None])
        alpha = torch.exp2(run - top)
        total = total * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + p.to(torch.float8_e4m3fn).float() @ cv[:, :, cols].float().transpose(1, 2)
        run = top
    o = acc / total[..., None] * sv[:, None, :] + ov[:, None, :]
    return o.transpose(0, 1).reshape(m, h * d).to(torch.bfloat16)


@triton_jit
def _e4m3(x):
    """x (f32, |x| <= 448) to e4m3, nearest, ties to even (the GPU's cvt.rn.satfinite). Triton 3.9's interpreter
    rounds this cast wrongly (a carry into an odd exponent is dropped, subnormals truncate), so there x is first
    rounded here to a value that the cast keeps exactly."""
    if INTERPRETED:
        bits = x.to(tl.uint32, bitcast=True)
        normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
        tiny = ((tl.abs(x) + 24576.0) - 24576.0).to(tl.uint32, bitcast=True)  # 1.5 * 2^14: nearest multiple
        tiny = (tiny | (bits & 0x80000000)).to(tl.float32, bitcast=True)  # of 2^-9, e4m3's subnormal step; sign
        x = tl.where(tl.abs(x) < 0.015625, tiny, normal)
    return x.to(tl.float8e4nv)


@triton_jit
def _codes_kernel(x_ptr, sh, sm, sd, mu_ptr, inv_ptr, c_ptr, s_ptr, M, MP, MODE: tl.constexpr,
                  BLOCK: tl.constexpr, D: tl.constexpr):
    """Step 1 for rows BLOCK b .. BLOCK b + BLOCK - 1 (b = program_id(0)) of head program_id(1), M <= rows < MP
    written as zeros. MODE 0: q's INT8 codes a row; 1: k - mk's a block; 2: v's e4m3 codes, turned, and the
    block's sums of their errors (codes - y) a channel."""
    b, h = tl.program_id(0), tl.program_id(1)
    rows = b * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, D)
    valid = rows[:, None] < M
    x = tl.load(x_ptr + h * sh + rows[:, None] * sm + cols[None, :] * sd, mask=valid, other=0.0).to(tl.float32)
    if MODE == 0:
        amax = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-30)
        codes = round_half_even(x * (127.0 / amax)[:, None])
        tl.store(s_ptr + h * MP + rows, amax / 127.0)
        tl.store(c_ptr + (h * MP + rows[:, None]) * D + cols[None, :], codes.to(tl.int8))
    elif MODE == 1:
        x = tl.where(valid, x - tl.load(mu_ptr + h * D + cols)[None, :], 0.0)
        amax = tl.maximum(tl.max(tl.max(tl.abs(x), axis=1), axis=0), 1e-30)
        codes = round_half_even(x * (127.0 / amax))
        tl.store(s_ptr + h * (MP // BLOCK) + b, amax / 127.0)
        tl.store(c_ptr + (h * MP + rows[:, None]) * D + cols[None, :], codes.to(tl.int8))
    else:
        y = (x - tl.load(mu_ptr + h * D + cols)[None, :]) * tl.load(inv_ptr + h * D + cols)[None, :]
        y = tl.where(valid, y, 0.0)
        codes = _e4m3(y)
        tl.store(c_ptr + (h * D + cols[None, :]) * MP + rows[:, None], codes)
        tl.store(s_ptr + (h * (MP // BLOCK) + b) * D + cols, tl.sum(codes.to(tl.float32) - y, axis=0))


@triton_jit
def _key_block(q, k_desc, v_desc, sk_ptr, r, run, total, acc, j, h, M, MP, MASKED: tl.constexpr,
               BLOCK_N: tl.constexpr, D: tl.constexpr):
    """Steps 2-3 for key block j: (running maximum, l, acc) after it."""
    ck = k_desc.load([h * MP + j * BLOCK_N, 0])
    fb = (tl.dot(q, tl.trans(ck)) + 0x4B400000).to(tl.float32, bitcast=True)  # s + BIAS, exactly
    c = r * tl.load(sk_ptr + h * (MP // BLOCK_N) + j)
    if MASKED:  # keys past M (codes 0): out of the maximum (every fb > 0) and p = 0
        valid = (j * BLOCK_N + tl.arange(0, BLOCK_N))[None, :] < M
        fb_top = tl.where(valid, fb, 0.0)
    else:
        fb_top = fb
    top = tl.maximum(run, (tl.max(fb_top, axis=1) - 12582912.0) * c)
    x = fb * c[:, None] - ((top + 12582912.0 * c) - 8.807354922057604)[:, None]  # LOG2_448
    if MASKED:
        x = tl.where(valid, x, float("-inf"))
    p = tl.math.exp2(x)
    alpha = tl.math.exp2(run - top)
    cv = v_desc.load([h * D, j * BLOCK_N])
    acc = acc * alpha[:, None] + tl.dot(_e4m3(p), tl.trans(cv))  # a fresh f32 product a block: see step 3
    return top, total * alpha + tl.sum(p, axis=1), acc


@triton_jit
def _attention_kernel(q_desc, k_desc, v_desc, sq_ptr, sk_ptr, sv_ptr, ov_ptr, o_ptr, M, MP, H, factor,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """Rows BLOCK_M i .. (program_id(0) = i) of head program_id(1) through every key block (steps 2-4)."""
    i, h = tl.program_id(0), tl.program_id(1)
    rows = i * BLOCK_M + tl.arange(0, BLOCK_M)
    q = q_desc.load([h * MP + i * BLOCK_M, 0])
    r = tl.load(sq_ptr + h * MP + rows) * factor
    run = tl.full([BLOCK_M], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    whole = M // BLOCK_N
    for j in range(whole):
        run, total, acc = _key_block(q, k_desc, v_desc, sk_ptr, r, run, total, acc, j, h, M, MP, False, BLOCK_N, D)
    if whole * BLOCK_N < M:
        run, total, acc = _key_block(q, k_desc, v_desc, sk_ptr, r, run, total, acc, whole, h, M, MP, True,
                                     BLOCK_N, D)
    cols = tl.arange(0, D)
    o = acc / total[:, None] * tl.load(sv_ptr + h * D + cols)[None, :] + tl.load(ov_ptr + h * D + cols)[None, :]
    tl.store(o_ptr + rows[:, None] * (H * D) + h * D + cols[None, :], rounded_bf16(o), mask=rows[:, None] < M)


def _interpreted() -> bool:
    return bool(getattr(INTERPRETED, "value", INTERPRETED))


def unusable(q: torch.Tensor) -> str | None:
    """None where the kernel can take q [1, H, M, 128] (k, v alike; kernels/attention.py's layout), else why not."""
    if q.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return "q, k, v must be floating point"
    if q.shape[-1] != HEAD or q.dim() != 4 or q.shape[0] != 1 or q.shape[2] == 0:
        return f"q must be [1, heads, M > 0, {HEAD}] (one group; rows: take heads_view's layout)"
    if triton is None:
        return "no Triton"
    if not _interpreted() and (not q.is_cuda or torch.cuda.get_device_capability(q.device) < (9, 0)):
        return "not a Hopper GPU (fp8 wgmma, TMA) and not interpreted"
    return None


def operands(q, k, v, heads: int | None = None, block_n: int = BLOCK_N) -> tuple:
    """Steps 0-1 (torch's three reductions, then three _codes_kernel passes): the kernel's inputs."""
    q, k, v = (heads_view(t, heads) for t in (q, k, v))
    if not q.shape == k.shape == v.shape:
        raise ValueError(f"attention_8bit: q, k, v differ in shape: {q.shape}, {k.shape}, {v.shape}")
    h, m, d = q.shape
    mp = -(-m // PAD) * PAD
    mk, mv, av = smoothing(k, v)
    dev = q.device
    cq, ck = (torch.empty(h * mp, d, dtype=torch.int8, device=dev) for _ in range(2))
    sq, sk = torch.empty(h * mp, device=dev), torch.empty(h * (mp // block_n), device=dev)
    cv = torch.empty(h * d, mp, dtype=torch.float8_e4m3fn, device=dev)
    errors = torch.empty(h, mp // block_n, d, device=dev)
    for mode, x, c, s in ((0, q, cq, sq), (1, k, ck, sk), (2, v, cv, errors)):
        _codes_kernel[(mp // block_n, h)](x, *x.stride(), mk if mode == 1 else mv, torch.full_like(av, 448.0) / av,
                                          c, s, m, mp, MODE=mode, BLOCK=block_n, D=d, num_warps=4)
    sv = av / 448.0
    return cq, sq, ck, sk, cv, sv, mv - errors.sum(1) * sv / m, m


def launch(cq, sq, ck, sk, cv, sv, ov, m, block_n: int = BLOCK_N, block_m: int = BLOCK_M,
           num_warps: int = NUM_WARPS, num_stages: int = NUM_STAGES) -> torch.Tensor:
    """Steps 2-4 from operands()' tensors: rows [M, H D] bf16."""
    h, d = sv.shape
    mp = cv.shape[1]
    out = torch.empty(m, h * d, dtype=torch.bfloat16, device=cq.device)
    _attention_kernel[(triton.cdiv(m, block_m), h)](
        TensorDescriptor.from_tensor(cq, [block_m, d]), TensorDescriptor.from_tensor(ck, [block_n, d]),
        TensorDescriptor.from_tensor(cv, [d, block_n]), sq, sk, sv, ov, out, m, mp, h, FACTOR,
        BLOCK_M=block_m, BLOCK_N=block_n, D=d, num_warps=num_warps, num_stages=num_stages)
    return out


def attention_8bit(q, k, v, heads: int | None = None) -> torch.Tensor:
    """q, k, v as rows [M, H D] (with heads) or [1, H, M, D] to o rows [M, H D] bf16 by this file's math (the
    caller asks `unusable` first)."""
    return launch(*operands(q, k, v, heads))
