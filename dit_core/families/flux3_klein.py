"""FLUX.3 Klein (base and step-distilled flow map) on the shared parallel block: BFL's single file -> blocks.

Facts: reference/families/flux3_klein.md (diffusers 0.42.1 transformer_flux3.py and single_file_utils.py). The
checkpoint layout is converted once, here, at load. The model sees latents as the sampler holds them: packed
[128, H/16, W/16] (ComfyUI's EmptyFlux2LatentImage; section 7, sampling); pack_latent/unpack_latent convert
from and to the VAE's [32, H/8, W/8].
"""
from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..arch import Arch
from ..block import Block, NormStats, layer_norm
from ..linear import float_on, linear
from ..modulation import Modulation, sinusoids
from .loading import Detection, OpenedFile
from ..sequence import Sequence, angle_factors, halves_permutation, rotary_angles
from ..sampling.step_cache import RefSlots, StepCache, joint_blocks
from ..weights import BlocksOnUse, Checkpoint, Linear, WeightsError, glu_rows, read_tensor, stack_rows

# Flux3TextEncoderStep(pad_multiple=80): the text encoder pads a prompt's rows to a multiple of this, and the pads are
# attended (the window is part of the model recipe), so the DiT always sees such a count (text/qwen3_vl.py pads).
TEXT_PAD_MULTIPLE = 80

PREFIXES = ("model.diffusion_model.", "")
MARKER = "early_stream_modulations.image.lin.weight"
FLOW_MAP = "ref_time_in.in_layer.weight"
MODES = ("txt", "image", "image_cond")  # also the joint blocks' modulation rows: [txt | img | ref]
MODE_BLOCKS = {"txt": "txt_mode_blocks.", "image": "content_mode_blocks.image.",
               "image_cond": "content_mode_blocks.image_cond."}
ROPE_THETA = 10000.0
IMAGE_ROPE_SCALE = 0.5  # diffusers Flux3PrepareLatentsStep image_rope_scale (section 4, positions; 12 item 2)
TIME_SCALE = 1000.0
# diffusers' names of the linears (LoRAs trained on diffusers): single_file_utils.py's key map reversed.
DIFFUSERS_BLOCK = {"q_proj": "attn.to_q", "k_proj": "attn.to_k", "v_proj": "attn.to_v",
                   "attn_out": "attn.to_out.0", "mlp_in": "ff.linear_in", "mlp_out": "ff.linear_out"}
DIFFUSERS_STEMS = (("content_mode_blocks.", "mode_blocks."), ("single_blocks.", "single_transformer_blocks."),
                   ("emb_in.", "x_embedders."), ("txt_in", "context_embedder"),
                   ("final_layer.image.linear", "proj_out"),
                   ("time_in.in_layer", "timestep_embedder.linear_1"),
                   ("time_in.out_layer", "timestep_embedder.linear_2"))


def pack_latent(z: torch.Tensor) -> torch.Tensor:
    """VAE latent [C, H, W] -> token grid [4C, H/2, W/2], channel-major: value c*4 + ph*2 + pw (section 4,
    packing)."""
    if z.dim() != 3 or z.shape[1] % 2 or z.shape[2] % 2:
        raise ValueError(f"Flux3Klein: latent {tuple(z.shape)} is not [C, H, W] on the 2x2 patch grid "
                         f"(H and W even: image sizes multiples of 16 pixels)")
    c, h, w = z.shape
    return z.reshape(c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3).reshape(c * 4, h // 2, w // 2)


def unpack_latent(x: torch.Tensor) -> torch.Tensor:
    """pack_latent's inverse: [4C, h, w] -> [C, 2h, 2w]."""
    c4, h, w = x.shape
    return x.reshape(c4 // 4, 2, 2, h, w).permute(0, 3, 1, 4, 2).reshape(c4 // 4, 2 * h, 2 * w)


DETECTION = Detection((MARKER,), PREFIXES, "a FLUX.3 diffusion model",
                      "a FLUX.3 Klein file such as flux3-image-klein-int8-convrot.safetensors")


def _count(ckpt: Checkpoint, stem: str) -> int:
    return ckpt.numbered(stem, ".q_proj.weight")


def read_arch(ckpt: Checkpoint, p: str) -> Arch:
    """FLUX.3's sizes from the file's own shapes (section 1, sizes); the rotary: 4 equal axes over the whole
    head."""
    hidden, latents = ckpt.shape(f"{p}emb_in.image.weight")
    head = ckpt.shape(f"{p}single_blocks.0.norm.query_norm.scale")[0]
    time_hidden, freq_dim = ckpt.shape(f"{p}time_in.in_layer.weight")
    refiner, image = _count(ckpt, p + MODE_BLOCKS["txt"]), _count(ckpt, p + MODE_BLOCKS["image"])
    if image != refiner:
        raise WeightsError(f"{ckpt.path.name}: {refiner} text mode blocks but {image} image mode blocks")
    return Arch(
        family="flux3_klein", hidden=hidden, layers=_count(ckpt, f"{p}single_blocks."), refiner=refiner,
        heads=hidden // head, head=head, ffn=ckpt.shape(f"{p}single_blocks.0.mlp_in.weight")[0] // 2,
        latents=latents, patch=(1, 1), text_dim=ckpt.shape(f"{p}txt_in.weight")[1], freq_dim=freq_dim,
        time_hidden=time_hidden, time_dim=ckpt.shape(f"{p}time_in.out_layer.weight")[0], eps=1e-6,
        qk_eps=1e-6, final_eps=1e-6, rope_axes=(head // 4,) * 4, rope_theta=ROPE_THETA, norm="layer")


def _read_block(ckpt: Checkpoint, p: str, stem: str, a: Arch, lin) -> Block:
    """Block `stem` (e.g. 'single_blocks.3.'): QKV = [q; k; v] with each head's q and k rows (and the q/k
    norm scales) permuted from adjacent-pair rotary to split halves; UP = gluRows of mlp_in's [gate; up]."""
    perm = halves_permutation(a.rotary, a.head)
    qk_rows = (torch.arange(a.heads)[:, None] * a.head + perm).reshape(-1)
    # INT8 files: stack_rows concatenates the row scales with the rows (row-wise scales: exact).
    parts = [lin(f"{stem}{n}_proj") for n in "qkv"]
    shape = (sum(q.out_features for q in parts), *{q.in_features for q in parts})
    if shape != (3 * a.width, a.hidden):
        raise WeightsError(f"{ckpt.path.name}: '{p}{stem}q_proj/k_proj/v_proj' give {shape}, expected "
                           f"{(3 * a.width, a.hidden)}")
    qkv = stack_rows(parts, torch.cat([qk_rows, qk_rows + a.width, torch.arange(2 * a.width, 3 * a.width)]))
    mlp_in = lin(f"{stem}mlp_in")
    if mlp_in.out_features != 2 * a.ffn:
        raise WeightsError(f"{ckpt.path.name}: '{p}{stem}mlp_in.weight' has {mlp_in.out_features} rows, "
                           f"expected {2 * a.ffn} ([gate; up])")
    up = glu_rows(mlp_in.row_slice(0, a.ffn), mlp_in.row_slice(a.ffn, 2 * a.ffn))
    norm = lambda n: read_tensor(ckpt, f"{p}{stem}norm.{n}.scale", (a.head,))[perm]
    return Block((qkv, lin(f"{stem}attn_out"), up, lin(f"{stem}mlp_out"), None, None,
                  norm("query_norm"), norm("key_norm"), None, None))


def lora_aliases(names: set[str]) -> dict[str, tuple[str, int]]:
    """diffusers' names of FLUX.3's linears -> (BFL name, first row)."""
    aliases = {}
    for name in names:
        alias = re.sub(r"\.lin$", ".linear", name)
        for old, new in DIFFUSERS_STEMS:
            alias = new + alias[len(old):] if alias.startswith(old) else alias
        stem, _, last = alias.rpartition(".")
        alias = f"{stem}.{DIFFUSERS_BLOCK[last]}" if last in DIFFUSERS_BLOCK else alias
        if alias != name:
            aliases[alias] = (name, 0)
    return aliases


@functools.lru_cache(maxsize=8)
def _sequences(a: Arch, n_txt: int, grids: tuple, modes: tuple, dev: torch.device, dtype: torch.dtype):
    """({mode: its rows' Sequence}, the joint Sequence of [txt | img | ref]) for n_txt text rows, the image's
    packed grid (h, w) and the references' (grids[1:]): the same every step, so built and copied to the device
    once per shape. Positions (t, h, w, l): image (0, h/2, w/2, 0), reference i (0, h/2, w/2, -(1 + i)), text
    (0, 0, 0, j) (section 4, positions); cos/sin of float64 angles, then rounded (diffusers Flux3PosEmbed)."""
    def grid(hw, layer: int) -> torch.Tensor:
        hh, ww = torch.meshgrid(torch.arange(hw[0]), torch.arange(hw[1]), indexing="ij")
        pos = torch.stack([torch.zeros_like(hh), hh, ww, torch.full_like(hh, layer)], -1).reshape(-1, 4)
        return pos.double() * torch.tensor([1.0, IMAGE_ROPE_SCALE, IMAGE_ROPE_SCALE, 1.0], dtype=torch.float64)

    def seq(positions: torch.Tensor, map_: torch.Tensor) -> Sequence:
        angles = rotary_angles(positions, a.rope_axes, a.rope_theta)
        factors = angle_factors(positions, a.rope_axes, a.rope_theta)
        return Sequence(map_, angles.cos(), angles.sin(), 0, factors).to(dev, dtype)

    pos = {"txt": torch.zeros(n_txt, 4, dtype=torch.float64), "image": grid(grids[0], 0)}
    pos["txt"][:, 3] = torch.arange(n_txt, dtype=torch.float64)
    if "image_cond" in modes:
        pos["image_cond"] = torch.cat([grid(hw, -(1 + i)) for i, hw in enumerate(grids[1:])])
    mode_seqs = {m: seq(pos[m], torch.zeros(len(pos[m]), dtype=torch.long)) for m in modes}
    map_ = torch.cat([torch.full((len(pos[m]),), i, dtype=torch.long) for i, m in enumerate(modes)])
    return mode_seqs, seq(torch.cat([pos[m] for m in modes]), map_)


@dataclass(frozen=True)
class Flux3Klein:
    """FLUX.3 Klein where it runs: time embedders (target: the flow map's, None for the base model), the
    modulation linears per mode, embedders, the per-mode blocks, the joint blocks and the final layer."""
    arch: Arch
    time: tuple[Linear, Linear]
    target: tuple[Linear, Linear] | None
    early_mods: dict                        # mode -> Linear [3 hidden, time_dim] = [shift | scale | gate]
    single_mods: dict
    image_in: Linear
    ref_in: Linear
    text_in: Linear
    mode_blocks: dict                       # mode -> tuple of Blocks
    blocks: tuple[Block, ...]
    final_mod: Linear                       # BFL's [shift; scale] rows, as stored (section 6, tensor names)
    final_out: Linear
    # The GPU path's options (dit_core/gpu/options.py), passed to each block: set by to(), default_options()'s
    # unless given; None on a model never moved (the host blocks read none).
    options: object = field(default=None, compare=False)

    @staticmethod
    def default_options():
        """FLUX.3 Klein's GPU options: attention scores on the INT8 matrix cores where the blocks are INT8 (a run
        about 2% faster, its image as close to diffusers' as cuDNN's bf16 scores leave it); the text's and
        references' mode blocks on side streams beside the image's (concurrent_modes: their few rows leave SMs
        idle that those fill; the rows are the same either way, the kernels keeping their counters per stream)."""
        from ..gpu.options import Options
        return Options(int8_attention=True, concurrent_modes=True)

    @staticmethod
    def load(path: str | Path | Checkpoint, linears: str = "stored",
             loras: tuple[tuple[str | Path, float], ...] = (),
             compute_on: torch.device | None = None, blocks_on_use: bool = False) -> Flux3Klein:
        """FLUX.3 Klein from BFL's single file (bare or model.diffusion_model. names; BF16, INT8 ConvRot,
        FP8). linears: 'stored', 'int8' (float block linears quantized to INT8 ConvRot) or 'bf16' (INT8
        dequantized). loras: (file, strength) pairs merged into the linears as they load (BFL or diffusers
        names). compute_on: the device that quantizes and merges them (OpenedFile). blocks_on_use: the joint blocks
        read as they are placed (OpenedFile.blocks; for a model bound for a card)."""
        opened = OpenedFile.open(path, DETECTION, linears, compute_on)
        ckpt, p = opened.ckpt, opened.prefix
        a = read_arch(ckpt, p)
        opened = opened.with_loras(loras, lora_aliases)
        lin = opened.linear

        def block(stem: str, source: OpenedFile, i: int) -> Block:
            return source.convert(_read_block(source.ckpt, p, f"{stem}{i}.", a, source.linear))
        blocks = lambda stem, n, on_use=False: opened.blocks(functools.partial(block, stem), n, on_use)  # noqa: E731
        time = lambda stem: (lin(f"{stem}.in_layer"), lin(f"{stem}.out_layer"))
        return Flux3Klein(
            arch=a, time=time("time_in"), target=time("ref_time_in") if p + FLOW_MAP in ckpt else None,
            early_mods={m: lin(f"early_stream_modulations.{m}.lin") for m in MODES},
            single_mods={m: lin(f"single_stream_modulations.{m}.lin") for m in MODES},
            image_in=lin("emb_in.image"), ref_in=lin("emb_in.image_cond"), text_in=lin("txt_in"),
            mode_blocks={m: blocks(s, _count(ckpt, p + s)) for m, s in MODE_BLOCKS.items()},
            blocks=blocks("single_blocks.", a.layers, blocks_on_use),
            final_mod=lin("final_layer.image.adaLN_modulation.1"), final_out=lin("final_layer.image.linear"))

    @property
    def flow_map(self) -> bool:
        """The step-distilled model: it also embeds the sigma each step jumps to (sigma_next)."""
        return self.target is not None

    def to(self, device: str | torch.device, budget_bytes: int | Callable[[int], int] | None = None,
           options=None) -> Flux3Klein:
        """Every tensor on device; on a CUDA device the mode and joint blocks become GpuBlocks (INT8 ConvRot or
        BF16 linears through kernels/, GpuBlock.parallel) and the small linears (embedders, modulation, final
        layer) f32 as Z-Image's (stored bf16, each step would convert them again: 0.8 ms a step at 1024^2),
        elsewhere the host blocks compute there. budget_bytes (or budget_bytes(their total bytes), asked once the
        rest is there): the joint blocks' device bytes, the others streaming from host memory (StreamedBlocks).
        options: the GPU path's (dit_core/gpu/options.py; by default the model's, else default_options())."""
        dev = torch.device(device)

        def move(obj):
            if isinstance(obj, torch.Tensor):
                return obj.to(dev)
            if isinstance(obj, Block) and dev.type == "cuda":
                from ..gpu.block import GpuBlock
                return GpuBlock.of(obj, dev)
            if isinstance(obj, Linear) and dev.type == "cuda":
                return float_on(obj, dev)
            if isinstance(obj, (Linear, Block)):
                return replace(obj, **{f.name: move(getattr(obj, f.name)) for f in fields(obj)})
            if isinstance(obj, (tuple, BlocksOnUse)):
                return tuple(move(o) for o in obj)
            return {k: move(v) for k, v in obj.items()} if isinstance(obj, dict) else obj

        moved = replace(self, **{f.name: move(getattr(self, f.name)) for f in fields(self)
                                 if f.name not in ("arch", "blocks")})
        from ..gpu.streaming import streamed_blocks
        return replace(moved, blocks=move(self.blocks) if budget_bytes is None else
                       streamed_blocks(self.blocks, dev, budget_bytes),
                       options=options or self.options or self.default_options())

    def _carry(self, x: torch.Tensor) -> NormStats | None:
        """Each block's norm statistics from the block before (GPU blocks), unless the options say not."""
        return NormStats.of(x) if self.options is None or self.options.carry_norms else None

    def timestep(self, sigma: float) -> torch.Tensor:
        """[1] f32 where the model is: 1000 sigma (diffusers: time_proj(timestep * 1000), the product in f32).
        Made there (torch.full), not copied from the host: such a copy waits for the GPU, a stall every step."""
        return torch.full((1,), float(sigma), dtype=torch.float32, device=self.final_out.weight.device) * TIME_SCALE

    def _embed(self, mlp: tuple[Linear, Linear], t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return linear(F.silu(linear(sinusoids(t, self.arch.freq_dim), mlp[0])), mlp[1]).to(dtype)

    def time_embeddings(self, t: torch.Tensor, t_next: torch.Tensor | None, dtype: torch.dtype):
        """(temb_img, temb_0) [1, time_dim] for timestep(sigma) t (section 2, embeddings): image rows at
        sigma, text and reference rows at 0; the flow map adds the target embedding of t_next =
        timestep(sigma_next) to both."""
        img, zero = self._embed(self.time, t, dtype), self._embed(self.time, self.timestep(0.0), dtype)
        if self.target is not None:
            if t_next is None:
                raise ValueError("Flux3Klein: this is the step-distilled (flow map) model; sigma_next (the "
                                 "sigma the step jumps to, 0 after the last step) is required")
            target = self._embed(self.target, t_next, dtype)
            img, zero = img + target, zero + target
        return img, zero

    @staticmethod
    def _modulation(mod: Linear, act: torch.Tensor) -> Modulation:
        # [shift | scale | gate]; the gate without tanh (section 3, blocks).
        shift, scale, gate = linear(act, mod).to(act.dtype).chunk(3, dim=-1)
        return Modulation(scale, gate, scale, gate, shift, shift)

    def output(self, latent: torch.Tensor, sigma: float, sigma_next: float | None, text_rows: torch.Tensor,
               references: Seq[torch.Tensor] = (), check: Callable[[], None] | None = None,
               cache: StepCache | None = None, slots: RefSlots | None = None) -> torch.Tensor:
        """The velocity for one image: latent [128, h, w] packed (h = H/16), text_rows [L, text_dim] (pad rows
        included: they are attended), references: packed latents [128, h_i, w_i]; sigma_next is read by the
        flow map only. Returns [128, h, w] in the latent's dtype (x0 = x - sigma v). check() runs after each
        block (it raises to cancel within a step). cache, slots: a sampler's step cache and reference slots
        (dit_core/sampling/step_cache.py; issue 6); a step whose slots do not record leaves the references out."""
        check = check or (lambda: None)
        self._check(latent, text_rows, references)
        t, t_next = self.timestep(sigma), None if sigma_next is None else self.timestep(sigma_next)
        slots = slots if references else None
        txt = self._projected_text(text_rows, latent.dtype)
        x, joint, s = self._joint_input(latent, t, t_next, txt, references, check, slots)
        x = joint_blocks(self.blocks, self.arch, x, joint, s, check, self._tracked(latent, text_rows), cache, slots,
                         self.options)
        return self._velocity(x, latent, t, t_next, text_rows)

    def graphed(self, capture: str = "always") -> Callable[..., torch.Tensor]:
        """output() replayed from two CUDA graphs a step (dit_core/gpu/step_graph.py) on a CUDA device while every
        block is resident: one from the embedders through the first joint block, one for the other joint
        blocks, the step cache's decision between them on the host (StepCache.after_first); the final layer
        runs eagerly. Steps whose reference slots record or read (refresh), or while blocks stream, run
        output() itself. check() is asked before a replayed step, not within it. The text rows' txt_in
        projection is made once per conditioning tensor (step_graph.KeptRows). step.clear() drops the graphs,
        their pool and the kept projections: call it before the blocks move or the model goes
        (LoadedModels.attached); step.graphs: the two GraphedSteps.
        capture: GraphedStep's ("host_bound": captured only where a graph pays)."""
        if self.final_out.weight.device.type != "cuda":
            return self.output
        from ..gpu.step_graph import KeptRows, ModelGraphs
        a = self.arch

        def head(latent, t, t_next, txt, *references):
            x, joint, s = self._joint_input(latent, t, t_next, txt, references, lambda: None)
            return x, next(iter(self.blocks)).parallel(a, x, joint, s, options=self.options)

        def rest(x1, latent, t, t_next, txt, *references):
            joint, s = self._joint_context(latent, t, t_next, txt, references, bool(references))[:2]
            carry = self._carry(x1)  # each block's norm statistics from the block before
            for i, block in enumerate(self.blocks):
                if i:  # x1 (the graph's input) stays: StepCache.after_first reads it
                    x1 = block.parallel(a, x1, joint, s, keep_input=i == 1, carry=carry, options=self.options)
            return x1

        graphs = ModelGraphs(head, rest, capture=capture)
        projected = KeptRows(self._projected_text)  # txt_in: 1.3 ms of every step (512 rows of 20480)

        def step(latent, sigma, sigma_next, text_rows, references=(), check=None, cache=None, slots=None):
            # Eager: reference slots (their keys and values change between steps), output()'s error for a missing
            # sigma_next, streamed blocks.
            if (slots is not None and references) or (sigma_next is None and self.flow_map) or \
                    not graphs.usable(self.blocks):
                return self.output(latent, sigma, sigma_next, text_rows, references, check, cache, slots)
            self._check(latent, text_rows, references)
            if check is not None:
                check()
            t, t_next = self.timestep(sigma), self.timestep(0.0 if sigma_next is None else sigma_next)
            inputs = (latent, t, t_next, projected(text_rows, latent.dtype), *references)
            x, x1 = graphs.steps[0](*inputs)
            rest_of = lambda y: graphs.steps[1](y, *inputs)  # noqa: E731
            x = rest_of(x1) if cache is None else cache.after_first(x, x1, self._tracked(latent, text_rows), rest_of)
            return self._velocity(x, latent, t, t_next, text_rows)

        step.clear, step.graphs = lambda: (graphs.clear(), projected.clear()), graphs.steps
        return step

    def _projected_text(self, text_rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The text rows' input projection [L, width] (txt_in), the same every step of a sampler run."""
        return linear(text_rows.to(dtype), self.text_in).to(dtype)

    def _tracked(self, latent: torch.Tensor, text_rows: torch.Tensor) -> int:
        """The joint rows that change each step: text and image (the step cache tracks them)."""
        return text_rows.shape[0] + latent.shape[1] * latent.shape[2]

    def _acts(self, t: torch.Tensor, t_next: torch.Tensor | None, dtype: torch.dtype) -> dict:
        """SiLU of each mode's time embedding: image rows at t, text and reference rows at 0."""
        temb_img, temb_0 = self.time_embeddings(t, t_next, dtype)
        return {"image": F.silu(temb_img), "txt": F.silu(temb_0), "image_cond": F.silu(temb_0)}

    def _joint_context(self, latent, t, t_next, txt, references, with_refs: bool):
        """(the joint blocks' Modulation, their Sequence, the per-mode Sequences, the modes, acts): small work of
        the timesteps and the shapes only (txt: the text rows, only counted)."""
        a, dtype = self.arch, latent.dtype
        modes = tuple(m for m in MODES if m != "image_cond" or with_refs)
        grids = tuple(r.shape[1:] for r in (latent, *(references if with_refs else ())))
        mode_seqs, s = _sequences(a, txt.shape[0], grids, modes, latent.device, dtype)
        act = self._acts(t, t_next, dtype)
        mods = [self._modulation(self.single_mods[m], act[m]) for m in modes]
        joint = Modulation(*(torch.cat([getattr(md, f.name) for md in mods]) for f in fields(Modulation)))
        return joint, s, mode_seqs, modes, act

    def _joint_input(self, latent, t, t_next, txt, references, check, slots=None):
        """(x, the joint Modulation, the joint Sequence): the embedded rows after their mode blocks, [txt | img |
        ref] (diffusers' order; no mask), each row taking its mode's modulation row in the joint blocks. txt: the
        projected text rows (_projected_text)."""
        a, dtype = self.arch, latent.dtype
        with_refs = bool(references) and (slots is None or slots.record)
        joint, s, mode_seqs, modes, act = self._joint_context(latent, t, t_next, txt, references, with_refs)
        tokens = lambda r: r.reshape(a.latents, -1).t().to(dtype)  # row-major grid, a token a row
        rows = {"txt": txt, "image": linear(tokens(latent), self.image_in).to(dtype)}
        if with_refs:
            rows["image_cond"] = linear(torch.cat([tokens(r) for r in references]), self.ref_in).to(dtype)
        made_here = dict(rows)  # blocks update their rows in place: these stay the caller stream's
        # Per-mode blocks: a mode's rows attend only among themselves, with that mode's one modulation row.
        from ..gpu.step_graph import side_stream
        concurrent = self.options is None or self.options.concurrent_modes
        sides = {m: side for m in modes if m != "image"
                 and (side := side_stream(latent, f"FLUX.3 {m} mode blocks", concurrent)) is not None}
        main = torch.cuda.current_stream(latent.device) if sides else None
        for side in sides.values():
            side.wait_stream(main)
        try:
            for m in modes:
                with torch.cuda.stream(sides[m]) if m in sides else contextlib.nullcontext():
                    mod, carry = self._modulation(self.early_mods[m], act[m]), self._carry(rows[m])
                    for block in self.mode_blocks[m]:
                        rows[m] = block.parallel(a, rows[m], mod, mode_seqs[m], keep_input=False, carry=carry,
                                                 options=self.options)
                        check()
        finally:  # joined also when check() cancels: nothing of the step left running on a side stream
            for m, side in sides.items():
                main.wait_stream(side)
                if rows[m] is not made_here[m]:  # made on the side stream, read and freed on the caller's
                    rows[m].record_stream(main)
        return torch.cat([rows[m] for m in modes]), joint, s

    def _velocity(self, x, latent, t, t_next, text_rows) -> torch.Tensor:
        """The final layer over the image rows of the joint blocks' output x: [128, h, w]."""
        a, (h, w), n_txt = self.arch, latent.shape[1:], text_rows.shape[0]
        img = x[n_txt:n_txt + h * w]
        temb_img = self.time_embeddings(t, t_next, x.dtype)[0]
        # BFL's [shift; scale] order as stored (diffusers' converter swaps it to [scale; shift]).
        shift, scale = linear(F.silu(temb_img), self.final_mod).to(x.dtype).chunk(2, dim=-1)
        out = linear(layer_norm(img, a.final_eps) * (1 + scale) + shift, self.final_out).to(x.dtype)
        return out.t().reshape(a.latents, h, w)

    def _check(self, latent: torch.Tensor, text_rows: torch.Tensor, references) -> tuple[int, int]:
        a = self.arch
        packed = (f"[{a.latents}, H/16, W/16] (packed 2x2: pack_latent of the VAE's "
                  f"[{a.latents // 4}, H/8, W/8])")
        if latent.dim() != 3 or latent.shape[0] != a.latents:
            raise ValueError(f"Flux3Klein: latent_image must be {packed}, got {tuple(latent.shape)}")
        if text_rows.dim() != 2 or text_rows.shape[1] != a.text_dim or text_rows.shape[0] == 0:
            raise ValueError(f"Flux3Klein: conditioning must be [tokens >= 1, {a.text_dim}] text rows, got "
                             f"{tuple(text_rows.shape)}; use the FLUX.3 text encoder (Qwen3-VL-4B, 8 layers "
                             f"stacked: {a.text_dim} values a row)")
        for i, r in enumerate(references):
            if r.dim() != 3 or r.shape[0] != a.latents:
                raise ValueError(f"Flux3Klein: references[{i}] must be {packed}, got {tuple(r.shape)}")
        if references and not self.mode_blocks["image_cond"]:
            raise ValueError("Flux3Klein: this file has no image_cond mode blocks, so it takes no references")
        return latent.shape[1], latent.shape[2]

    def dry_pass(self, pixels: int = 1024, text_rows: int = TEXT_PAD_MULTIPLE) -> torch.Tensor:
        """One pass as the sampler makes it (denoised over a batch of one) of a pixels x pixels image and a prompt of
        text_rows rows (as the text encoder pads them), on zeros: the kernels a first step launches, for a stand-in
        built beside the load (builds.built_beside). The first joint block then runs twice more as the later ones
        do (joint_blocks): its input's norm statistics made, then carried in from the block before, and its output's
        written for the next; the first block carries none, so a stand-in of one joint block left a GATED product
        (the one that writes them) to the sampler's first step (2.6 s of an H100's cold Klein graph)."""
        device, side = self.final_out.weight.device, pixels // 16  # packed latents: a cell is 16x16 pixels
        latent = torch.zeros(self.arch.latents, side, side, device=device)
        text = torch.zeros(text_rows, self.arch.text_dim, device=device)
        out = self.denoised(latent[None], 1.0, 0.5, text[None])
        x, joint, s = self._joint_input(latent, self.timestep(1.0), self.timestep(0.5),
                                        self._projected_text(text, latent.dtype), (), lambda: None)
        carry, block = self._carry(x), next(iter(self.blocks))
        for _ in range(2):
            x = block.parallel(self.arch, x, joint, s, keep_input=False, carry=carry, options=self.options)
        return out

    def denoised(self, x: torch.Tensor, sigma: float, sigma_next: float | None, cond: torch.Tensor,
                 references: Seq[torch.Tensor] = (), check: Callable[[], None] | None = None) -> torch.Tensor:
        """x0 for a batch of packed latents x [B, 128, h, w] and text rows cond [B or 1, L, text_dim]:
        x0 = x - sigma v (section 5, output); the references are shared by the batch."""
        outs = [self.output(x[i], sigma, sigma_next, cond[min(i, cond.shape[0] - 1)], references, check)
                for i in range(x.shape[0])]
        return x - float(sigma) * torch.stack(outs)
