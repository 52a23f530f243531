"""Z-Image (Turbo and base) on the shared block: ComfyUI's single file -> Arch, blocks, embedders, final layer.

Facts: reference/families/z_image.md (diffusers 0.42.1 transformer_z_image.py, ComfyUI v0.3.75
comfy/ldm/lumina/model.py). The checkpoint layout is converted once, here, at load.
"""
from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..arch import Arch
from ..block import Block, NormStats, layer_norm, rms_norm
from ..linear import float_on, linear
from ..modulation import Modulation, sinusoids
from .loading import Detection, OpenedFile
from ..sequence import Sequence, concat, halves_permutation, sequence_of
from ..weights import Checkpoint, Linear, TensorSource, WeightsError, glu_rows, read_tensor

PREFIXES = ("model.diffusion_model.", "diffusion_model.", "")
PATCH = 2
SEQ_MULTIPLE = 32      # image and caption rows are each padded to a multiple of this (SEQ_MULTI_OF)
ROPE_THETA = 256.0
TIME_SCALE = 1000.0


DETECTION = Detection(("cap_embedder.1.weight", "layers.0.adaLN_modulation.0.weight"), PREFIXES,
                      "a Z-Image diffusion model", "a Z-Image file such as z_image_turbo_bf16.safetensors")


def _count(ckpt: Checkpoint, prefix: str) -> int:
    return ckpt.numbered(prefix, ".attention.qkv.weight")


def read_arch(ckpt: Checkpoint, prefix: str) -> Arch:
    """Z-Image's sizes from the file's own shapes (ComfyUI's file holds no config)."""
    hidden, patch_values = ckpt.shape(f"{prefix}x_embedder.weight")
    head = ckpt.shape(f"{prefix}layers.0.attention.q_norm.weight")[0]
    time_hidden, freq_dim = ckpt.shape(f"{prefix}t_embedder.mlp.0.weight")
    # The rotary axes (t, h, w) rotate a quarter, 3/8 and 3/8 of a head: (32, 48, 48) at head 128, and
    # (8, 12, 12) for the diffusers test instance (reference/families/z_image.md sections 1 and 11:
    # real sizes, reference implementations).
    rope_axes = (head // 4, head * 3 // 8, head * 3 // 8)
    return Arch(
        family="z_image", hidden=hidden, layers=_count(ckpt, f"{prefix}layers."),
        refiner=_count(ckpt, f"{prefix}noise_refiner."), heads=hidden // head, head=head,
        ffn=ckpt.shape(f"{prefix}layers.0.feed_forward.w1.weight")[0], latents=patch_values // PATCH ** 2,
        patch=(PATCH, PATCH), text_dim=ckpt.shape(f"{prefix}cap_embedder.1.weight")[1], freq_dim=freq_dim,
        time_hidden=time_hidden, time_dim=ckpt.shape(f"{prefix}t_embedder.mlp.2.weight")[0], eps=1e-5,
        qk_eps=1e-5, final_eps=1e-6, rope_axes=rope_axes, rope_theta=ROPE_THETA)


def _read_block(ckpt: Checkpoint, prefix: str, p: str, a: Arch, lin) -> Block:
    """Block p (e.g. 'layers.3.'; lin reads a linear by its name after the file's prefix): QKV as stored
    [q; k; v] with each head's q and k rows (and head-norm gains) permuted from adjacent-pair rotary to split
    halves; UP = gluRows(w1, w3)."""
    perm = halves_permutation(a.rotary, a.head)
    heads = torch.arange(a.heads)[:, None] * a.head
    qk_rows = (heads + perm).reshape(-1)
    order = torch.cat([qk_rows, qk_rows + a.width, torch.arange(2 * a.width, 3 * a.width)])
    qkv = lin(f"{p}attention.qkv")
    if qkv.weight.shape != (3 * a.width, a.hidden):
        raise WeightsError(f"{ckpt.path.name}: '{prefix}{p}attention.qkv.weight' is {tuple(qkv.weight.shape)}, "
                           f"expected {(3 * a.width, a.hidden)}")
    up = glu_rows(lin(f"{p}feed_forward.w1"), lin(f"{p}feed_forward.w3"))
    norm = lambda name: read_tensor(ckpt, f"{prefix}{p}{name}.weight", (a.hidden,))
    head_norm = lambda name: read_tensor(ckpt, f"{prefix}{p}attention.{name}.weight", (a.head,))[perm]
    return Block((qkv.rows(order), lin(f"{p}attention.out"), up,
                  lin(f"{p}feed_forward.w2"), norm("attention_norm1"), norm("ffn_norm1"),
                  head_norm("q_norm"), head_norm("k_norm"), norm("attention_norm2"), norm("ffn_norm2")))


def _stored_tensors(ckpt: Checkpoint, p: str, merged: bool) -> dict[str, tuple[Checkpoint, str]]:
    """stage()'s files of block p: the out and down linears (not when a LoRA is merged into them) and the four
    modulated norms' gains, which the loader keeps as stored; stage() still reads one only when the file holds
    it in the block's dtype and size (QKV and UP are permuted at load, the head-norm gains too)."""
    files = {f"w.{i}": (ckpt, f"{p}{name}.weight") for i, name in
             ((4, "attention_norm1"), (5, "ffn_norm1"), (8, "attention_norm2"), (9, "ffn_norm2"))}
    for i, name in ((1, "attention.out"), (3, "feed_forward.w2")) if not merged else ():
        files[f"w.{i}.bias"] = (ckpt, f"{p}{name}.bias")
        stored = ckpt.dtype(f"{p}{name}.weight")
        if stored == torch.int8 or stored in (torch.bfloat16, torch.float16, torch.float32):
            files[f"w.{i}.weight"] = (ckpt, f"{p}{name}.weight")
        if stored == torch.int8:
            # Only an INT8 file's scales: FP8's are recomputed when its weights are requantized to INT8.
            files[f"w.{i}.scale"] = (ckpt, f"{p}{name}.weight_scale")
    return files


def lora_aliases(a: Arch, names: set[str]) -> dict[str, tuple[str, int]]:
    """diffusers' names of Z-Image's linears (LoRAs trained on diffusers) -> (ComfyUI name, first row): to_q,
    to_k, to_v are row slices of the fused qkv (ComfyUI v0.3.75 comfy/utils.py z_image_to_diffusers)."""
    aliases = {"all_x_embedder.2-1": ("x_embedder", 0), "all_final_layer.2-1.linear": ("final_layer.linear", 0),
               "all_final_layer.2-1.adaLN_modulation.1": ("final_layer.adaLN_modulation.1", 0)}
    for name in names:
        if name.endswith(".attention.qkv"):
            stem = name[: -len("qkv")]
            for i, part in enumerate(("to_q", "to_k", "to_v")):
                aliases[stem + part] = (name, i * a.width)
            aliases[stem + "to_out.0"] = (stem + "out", 0)
    return aliases


def _positions_to_sequence(a: Arch, pos: torch.Tensor, device: torch.device, dtype: torch.dtype) -> Sequence:
    return sequence_of(pos, torch.zeros(pos.shape[0], dtype=torch.long), a.rope_axes, a.rope_theta, dtype).to(device)


@functools.lru_cache(maxsize=8)
def _caption_sequence(a: Arch, cap_rows: int, device: torch.device, dtype: torch.dtype) -> Sequence:
    """The caption's Sequence of cap_rows rows (pads included), row j at (1 + j, 0, 0): built and copied to the
    device once per length."""
    zeros = torch.zeros(cap_rows, dtype=torch.long)
    return _positions_to_sequence(a, torch.stack([torch.arange(1, cap_rows + 1), zeros, zeros], -1), device, dtype)


@functools.lru_cache(maxsize=8)
def _sequences(a: Arch, hp: int, wp: int, pad_img: int, cap_rows: int, device: torch.device, dtype: torch.dtype):
    """(image, [image; caption]) Sequences of an hp x wp patch grid with pad_img pad rows and cap_rows caption
    rows (pads included): the same every step, so built and copied to the device once per shape.
    Positions: image (h, w) at (cap_rows + 1, h, w); image pads at 0; the caption's as _caption_sequence."""
    grid = torch.stack(torch.meshgrid(torch.arange(hp), torch.arange(wp), indexing="ij"), -1).reshape(-1, 2)
    img_pos = torch.cat([torch.full((hp * wp, 1), cap_rows + 1), grid], dim=1)
    img_seq = _positions_to_sequence(a, torch.cat([img_pos, torch.zeros(pad_img, 3, dtype=torch.long)]), device,
                                     dtype)
    return img_seq, concat([img_seq, _caption_sequence(a, cap_rows, device, dtype)])


def stacked(linears: tuple[Linear, ...], device: torch.device) -> tuple[Linear, tuple[Linear, ...]]:
    """Float linears of one input as one f32 linear on device (their rows one after another, a zero bias where
    one has none) and each of them as a view of its rows."""
    on_device = [float_on(m, device) for m in linears]
    stack = Linear(torch.cat([m.weight for m in on_device]),
                   torch.cat([torch.zeros(m.out_features, device=device) if m.bias is None else m.bias
                              for m in on_device]))
    rows = [0, *itertools.accumulate(m.out_features for m in linears)]
    return stack, tuple(Linear(stack.weight[r0:r1], stack.bias[r0:r1]) for r0, r1 in zip(rows, rows[1:]))


@dataclass(frozen=True)
class ZImage:
    """Z-Image where it runs: embedders, time MLP, the blocks (context refiners, noise refiners, main) with the
    modulation linears of the modulated ones, the pad rows and the final layer."""
    arch: Arch
    time: tuple[Linear, Linear]
    cap_norm: torch.Tensor
    cap_in: Linear
    image_in: Linear
    image_pad: torch.Tensor
    cap_pad: torch.Tensor
    context: tuple[Block, ...]
    noise: tuple[Block, ...]
    noise_mods: tuple[Linear, ...]
    blocks: tuple[Block, ...]
    mods: tuple[Linear, ...]
    final_mod: Linear
    final_out: Linear
    # Per main block, stage()'s files: its tensors the loader keeps as stored, read from the file straight into
    # host memory when the blocks stream (to(device, budget_bytes)).
    files: tuple[dict, ...] = field(default=(), repr=False, compare=False)
    # On a GPU: noise_mods + mods stacked into one linear (each of them a view of its rows), so a step's modulation
    # rows of every block come from one product, one bias add and one tanh (instead of 128 launches).
    mod_stack: Linear | None = field(default=None, repr=False, compare=False)
    # The GPU path's options (dit_core/gpu/options.py), passed to each block: set by to(), default_options()'s
    # unless given; None on a model never moved (the host blocks read none).
    options: object = field(default=None, compare=False)

    @staticmethod
    def default_options():
        """Z-Image's GPU options: the engine's defaults. Its attention keeps cuDNN's bf16 scores (INT8 scores were
        barely faster here: not taken)."""
        from ..gpu.options import Options
        return Options(int8_attention=False)

    @staticmethod
    def load(path: str | Path | Checkpoint, linears: str = "stored",
             loras: tuple[tuple[str | Path, float], ...] = (),
             compute_on: torch.device | None = None, blocks_on_use: bool = False) -> ZImage:
        """Z-Image from ComfyUI's single file (BF16, INT8 ConvRot, FP8; optional model.diffusion_model.
        prefix). linears: 'stored' keeps each block linear as stored, 'int8' quantizes float ones to INT8
        ConvRot (Block.quantized), 'bf16' dequantizes INT8 ones (Block.dequantized). loras: (file, strength)
        pairs merged into the linears as they load. compute_on: the device that quantizes and merges them
        (OpenedFile). blocks_on_use: the main blocks read as they are placed (OpenedFile.blocks; for a model bound
        for a card)."""
        opened = OpenedFile.open(path, DETECTION, linears, compute_on)
        ckpt, p = opened.ckpt, opened.prefix
        a = read_arch(ckpt, p)
        opened = opened.with_loras(loras, lambda names: lora_aliases(a, names))
        lin = opened.linear

        def block(stem: str, source: OpenedFile, i: int) -> Block:
            return source.convert(_read_block(source.ckpt, p, f"{stem}.{i}.", a, source.linear))
        blocks = lambda stem, n, on_use=False: opened.blocks(functools.partial(block, stem), n, on_use)  # noqa: E731
        model = ZImage(
            arch=a, time=(lin("t_embedder.mlp.0"), lin("t_embedder.mlp.2")),
            cap_norm=read_tensor(ckpt, f"{p}cap_embedder.0.weight", (a.text_dim,)), cap_in=lin("cap_embedder.1"),
            image_in=lin("x_embedder"), image_pad=read_tensor(ckpt, f"{p}x_pad_token", (1, a.hidden)),
            cap_pad=read_tensor(ckpt, f"{p}cap_pad_token", (1, a.hidden)),
            context=blocks("context_refiner", _count(ckpt, f"{p}context_refiner.")),
            noise=blocks("noise_refiner", a.refiner),
            noise_mods=tuple(lin(f"noise_refiner.{i}.adaLN_modulation.0") for i in range(a.refiner)),
            blocks=blocks("layers", a.layers, blocks_on_use),
            mods=tuple(lin(f"layers.{i}.adaLN_modulation.0") for i in range(a.layers)),
            final_mod=lin("final_layer.adaLN_modulation.1"), final_out=lin("final_layer.linear"),
            # In-memory sources (TensorSource) are not kept: the files would hold their tensors alive.
            files=() if isinstance(ckpt, TensorSource) else
            tuple(_stored_tensors(ckpt, f"{p}layers.{i}.", bool(loras)) for i in range(a.layers)))
        ckpt.release()  # kept in `files` for staging, which reads the file without its map
        return model

    def to(self, device: str | torch.device, budget_bytes: int | Callable[[int], int] | None = None,
           options=None) -> ZImage:
        """Z-Image where it runs: on a CUDA device the blocks become GpuBlocks (INT8 ConvRot linears on the
        matrix cores, or BF16), the small linears (embedders, modulation, final layer) f32, the modulation linears
        as views of one stacked linear (mod_stack). With budget_bytes the main blocks take at most that much device
        memory: those that do not fit stream from host memory (StreamedBlocks; on the CPU the host blocks stream
        through CPU slots, the same numerics). A function budget_bytes(total bytes of the main blocks) is asked
        once every other part is on the device. options: the GPU path's (dit_core/gpu/options.py; by default the
        model's, else default_options())."""
        dev = torch.device(device)
        options = options or self.options or self.default_options()
        if dev.type == "cpu":
            return replace(self, options=options) if budget_bytes is None else \
                replace(self, blocks=self._streamed(dev, budget_bytes), options=options)
        from ..gpu.block import GpuBlock
        small = lambda lin: float_on(lin, dev)  # noqa: E731
        blocks = lambda bs: tuple(GpuBlock.of(b, dev) for b in bs)
        stack, views = stacked(self.noise_mods + self.mods, dev)
        moved = replace(
            self, time=tuple(map(small, self.time)), cap_norm=self.cap_norm.to(dev), cap_in=small(self.cap_in),
            image_in=small(self.image_in), image_pad=self.image_pad.to(dev), cap_pad=self.cap_pad.to(dev),
            context=blocks(self.context), noise=blocks(self.noise), noise_mods=views[:len(self.noise_mods)],
            mods=views[len(self.noise_mods):], mod_stack=stack, final_mod=small(self.final_mod),
            final_out=small(self.final_out), options=options)
        return replace(moved, blocks=blocks(self.blocks) if budget_bytes is None else
                       self._streamed(dev, budget_bytes))

    def _streamed(self, dev: torch.device, budget_bytes: int | Callable[[int], int]):
        """The main blocks as StreamedBlocks on dev (only imported when a budget asks for streaming)."""
        from ..gpu.streaming import streamed_blocks
        return streamed_blocks(self.blocks, dev, budget_bytes,
                               self.files if len(self.files) == len(self.blocks) else None)

    def timestep(self, sigma: float) -> torch.Tensor:
        """[1] f32 where the model is: the model is fed t = 1 - sigma and embeds 1000 t (section 2, time
        embedding). Made there (torch.full), not copied from the host: such a copy waits for the GPU, a stall
        in every step."""
        return torch.full((1,), (1.0 - float(sigma)) * TIME_SCALE, dtype=torch.float32, device=self.cap_norm.device)

    def time_embedding(self, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """temb [1, time_dim] of timestep(sigma)."""
        return linear(F.silu(linear(sinusoids(t, self.arch.freq_dim), self.time[0])), self.time[1]).to(dtype)

    def modulations(self, temb: torch.Tensor) -> list[Modulation]:
        """Each modulated block's (noise refiners, then main blocks) scale_msa, gate_msa, scale_mlp, gate_mlp from
        its modulation linear (no SiLU before it); tanh gates. One product for all where they are stacked."""
        hidden = self.arch.hidden
        if self.mod_stack is None:
            parts = torch.stack([linear(temb, m).to(temb.dtype).reshape(4, hidden)
                                 for m in self.noise_mods + self.mods])
        else:
            parts = linear(temb, self.mod_stack).to(temb.dtype).reshape(-1, 4, hidden)
        gates = parts[:, 1::2].tanh()  # [blocks, 2, hidden]
        return [Modulation(p[0:1], g[0:1], p[2:3], g[1:2]) for p, g in zip(parts, gates)]

    def output(self, latent: torch.Tensor, sigma: float, caption: torch.Tensor,
               check: Callable[[], None] | None = None) -> torch.Tensor:
        """The raw output (minus the velocity) for one image: latent [C, H, W] (normalized), caption
        [L, text_dim] text-encoder rows; returns [C, H, W] in the latent's dtype (f32 or f64). check() runs
        after each block (it raises to cancel within a step)."""
        self._check(latent, caption)
        return self.output_at(latent, self.timestep(sigma), caption, check)

    def graphed(self, capture: str = "always") -> Callable[..., torch.Tensor]:
        """output() replayed from one CUDA graph a step (dit_core/gpu/step_graph.py) on a CUDA device, else
        output() itself; while some blocks stream the step runs eagerly, and once the blocks have moved the
        graphs are captured again (ModelGraphs.usable). check() is asked before a replayed step, not within it.
        The caption's rows through the context refiners are made once per caption tensor (step_graph.KeptRows).
        step.clear() drops the graphs, their memory pool and the kept rows: call it before the blocks move or the
        model goes (LoadedModels.attached); step.graphs: the GraphedStep.
        capture: GraphedStep's ("host_bound": captured only where a graph pays)."""
        if self.cap_norm.device.type != "cuda":
            return self.output
        from ..gpu.step_graph import KeptRows, ModelGraphs
        graphs = ModelGraphs(lambda latent, t, cap: self._output_with(latent, t, cap), capture=capture)
        # The caption's rows through its embedder and the context refiners: the same every step (no timestep in
        # them), made once per caption tensor outside the graph.
        refined = KeptRows(self._caption_rows)

        def step(latent: torch.Tensor, sigma: float, caption: torch.Tensor,
                 check: Callable[[], None] | None = None) -> torch.Tensor:
            if not graphs.usable(self.blocks):
                return self.output(latent, sigma, caption, check)
            self._check(latent, caption)
            if check is not None:
                check()
            return graphs.steps[0](latent, self.timestep(sigma), refined(caption, latent.dtype))
        step.clear, step.graphs = lambda: (graphs.clear(), refined.clear()), graphs.steps
        return step

    def output_at(self, latent: torch.Tensor, t: torch.Tensor, caption: torch.Tensor,
                  check: Callable[[], None] | None = None) -> torch.Tensor:
        """output() at the timestep tensor t (timestep(sigma)), inputs checked: on a GPU with every block there,
        nothing in it waits for the host or copies from it, so a CUDA graph can capture it (dit_core/gpu/step_graph.py)."""
        return self._output_with(latent, t, self._caption_rows(caption, latent.dtype, check), check)

    def _caption_rows(self, caption: torch.Tensor, dtype: torch.dtype,
                      check: Callable[[], None] | None = None) -> torch.Tensor:
        """The caption's rows, padded to SEQ_MULTIPLE, through the embedder and the context refiners (unmodulated:
        the same every step)."""
        check = check or (lambda: None)
        a, n_cap = self.arch, caption.shape[0]
        pad_cap = -n_cap % SEQ_MULTIPLE
        cap = linear(rms_norm(caption.to(dtype), self.cap_norm, a.eps), self.cap_in).to(dtype)
        cap = torch.cat([cap, self.cap_pad.to(dtype).expand(pad_cap, -1)])
        cap_seq = _caption_sequence(a, n_cap + pad_cap, caption.device, dtype)
        identity = Modulation.identity(a.hidden, dtype=dtype, device=caption.device)
        carry = self._carry(cap)
        options = self.options and self.options.for_prompt_rows()
        for block in self.context:
            cap = block.forward(a, cap, identity, cap_seq, carry, options)
            check()
        return cap

    def _output_with(self, latent: torch.Tensor, t: torch.Tensor, cap: torch.Tensor,
                     check: Callable[[], None] | None = None) -> torch.Tensor:
        """output_at with the caption's rows already refined (_caption_rows)."""
        check = check or (lambda: None)
        a, dtype = self.arch, latent.dtype
        c, h, w = latent.shape
        hp, wp = h // PATCH, w // PATCH
        # Token vector order (ph, pw, c), c fastest (section 3, packing).
        tokens = latent.reshape(c, hp, PATCH, wp, PATCH).permute(1, 3, 2, 4, 0).reshape(hp * wp, -1)
        n_img = tokens.shape[0]
        pad_img = -n_img % SEQ_MULTIPLE

        x = linear(tokens, self.image_in).to(dtype)
        x = torch.cat([x, self.image_pad.to(dtype).expand(pad_img, -1)])
        img_seq, joint = _sequences(a, hp, wp, pad_img, cap.shape[0], latent.device, dtype)
        temb = self.time_embedding(t, dtype)
        mods = self.modulations(temb)
        carry = self._carry(x)
        for block, m in zip(self.noise, mods):
            x = block.forward(a, x, m, img_seq, carry, self.options)
            check()

        # One unified sequence [image; caption] (diffusers' order; nothing is masked, so the order is free).
        x = torch.cat([x, cap])
        carry = self._carry(x)
        for block, m in zip(self.blocks, mods[len(self.noise):]):
            x = block.forward(a, x, m, joint, carry, self.options)
            check()
        return self._final(x[:n_img], temb).reshape(hp, wp, PATCH, PATCH, c).permute(4, 0, 2, 1, 3).reshape(c, h, w)

    def _carry(self, x: torch.Tensor) -> NormStats | None:
        """Each block's first norm statistics from the block before (GPU blocks), unless the options say not."""
        return NormStats.of(x) if self.options is None or self.options.carry_norms else None

    def _final(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        scale = linear(F.silu(temb), self.final_mod).to(x.dtype)
        return linear(layer_norm(x, self.arch.final_eps) * (1 + scale), self.final_out).to(x.dtype)

    def _check(self, latent: torch.Tensor, caption: torch.Tensor) -> tuple[int, int, int]:
        a = self.arch
        if latent.dim() != 3 or latent.shape[0] != a.latents:
            raise ValueError(f"Z-Image: latent_image must be [{a.latents}, H, W] per image, got "
                             f"{tuple(latent.shape)}")
        c, h, w = latent.shape
        if h % PATCH or w % PATCH:
            raise ValueError(f"Z-Image: latent size {h}x{w} is not a multiple of the patch grid {PATCH} "
                             f"(image width and height must be multiples of {PATCH * 8} pixels)")
        if caption.dim() != 2 or caption.shape[1] != a.text_dim or caption.shape[0] == 0:
            raise ValueError(f"Z-Image: conditioning must be [tokens >= 1, {a.text_dim}] text-encoder rows, got "
                             f"{tuple(caption.shape)}; use a Z-Image text encoder (Qwen3-4B, "
                             f"{a.text_dim} values a row)")
        return c, h, w

    def dry_pass(self, pixels: int = 1024, text_rows: int = 77) -> torch.Tensor:
        """One pass as the sampler makes it (denoised over a batch of one) of a pixels x pixels image and a prompt of
        text_rows rows, on zeros: the kernels a first step launches (the template's size and a typical prompt; the
        row counts are not specialized), for a stand-in built beside the load (builds.built_beside)."""
        device, side = self.cap_norm.device, pixels // 8  # FLUX.1's VAE: a latent cell is 8x8 pixels
        return self.denoised(torch.zeros(1, self.arch.latents, side, side, device=device), 1.0,
                             torch.zeros(1, text_rows, self.arch.text_dim, device=device))

    def denoised(self, x: torch.Tensor, sigma: float, cond: torch.Tensor,
                 check: Callable[[], None] | None = None,
                 step: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
        """x0 for a batch of normalized latents x [B, C, H, W] and conditioning [B or 1, L, text_dim]:
        v = -out, x0 = x - sigma v = x + sigma out (ComfyUI CONST sampling). step: output() or its twin
        (graphed())."""
        step = step or self.output
        outs = [step(x[i], sigma, cond[min(i, cond.shape[0] - 1)], check) for i in range(x.shape[0])]
        return x + float(sigma) * torch.stack(outs)
