"""OmniVoice (masked-token text to speech) on the shared block, on the host: the model folder's safetensors ->
token and codebook-sum embeddings, Qwen3 layers as bidirectional blocks, final norm and the codebook heads;
the prompt rows, and each step's conditional and unconditional rows packed without padding into one forward.

Facts: reference/families/omnivoice.md (the omnivoice 0.2.1 package, omnivoice/models/omnivoice.py, on
transformers' Qwen3Model). The layout is converted once, here, at load: q, k, v stack into QKV (grouped-query:
16 query heads on 8 key heads), gate and up interleave into UP; the rotary already turns split halves of the
whole head (Qwen3), so no row moves. No time embedding: every row takes one constant modulation row (scale 0,
gate 1). Attention is bidirectional within segments of unequal length (a prompt's conditional rows, its
unconditional rows), which the shared Block cannot express yet (Sequence.group is one group size), so the
layer below is Block.forward's math with attention per segment.

Also here, as the family's surroundings (section 4): the prompt (prompt_rows), the length rule
(target_frames) and the split of long texts (text_chunks). generate_codes runs the unmasking loop of
sampling/omnivoice.py over prompts; speech_codes makes utterances as the package's generate does up to the
codec (short ones together, long ones in chunks); the codec is dit_core/codecs/higgs_audio.py. On a GPU,
OmniVoice.to gives the device form (dit_core/gpu/omnivoice.py: BF16 or stored INT8 linears, a graphed step per
length bucket), which both take in place of the model; this file stays its reference.
"""
from __future__ import annotations

import bisect
import re
import unicodedata
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

import torch

from ..arch import Arch
from ..block import (DOWN, K_NORM, NORM1, NORM2, OUT, Q_NORM, QKV, UP, Block, attention, head_norm_rotary,
                     modulated_norm, rms_norm, split_qkv, swiglu)
from ..linear import linear
from ..modulation import Modulation
from ..sampling.omnivoice import Codebooks, Unmasking, sample_unmasking
from ..sequence import Sequence
from ..weights import Checkpoint, Linear, WeightsError, glu_rows, read_tensor, stack_rows
from .loading import Detection, OpenedFile

WEIGHTS_FILE = "model.safetensors"  # in the model folder, beside config.json and the tokenizer's files
EPS = 1e-6         # Qwen3's rms_norm_eps: block, head and final norms
ROPE_THETA = 1e6   # Qwen3-0.6B's rope_theta, one axis over the whole head
CODEBOOKS = 8      # where the file lacks codebook_layer_offsets (a buffer the package saves)
# The package's non-verbal tags, tokenized on their own (_tokenize_with_nonverbal_tags)
NONVERBAL = re.compile(r"\[(laughter|sigh|confirmation-en|question-en|question-ah|question-oh|question-ei|"
                       r"question-yi|surprise-ah|surprise-oh|surprise-wa|surprise-yo|dissatisfaction-hnn)\]")
HAN = r"[\u4e00-\u9fff]"
SPECIAL_TOKENS = ("<|denoise|>", "<|lang_start|>", "<|lang_end|>", "<|instruct_start|>", "<|instruct_end|>",
                  "<|text_start|>", "<|text_end|>")
END_PUNCTUATION = frozenset(";:,.!?…)]}\"'“”‘’；：，。！？、）】")  # a transcript ending otherwise gains one
FRAME_RATE = 25  # codec frames a second (Higgs audio v2: 24 kHz, hop 960)
# The length rule (section 4; the package's RuleDurationEstimator): frames = a text's weight (speaking time
# per character relative to a Latin letter) at the reference's frames per unit of weight; without a
# reference, this one's.
DEFAULT_REFERENCE = ("Nice to meet you.", 25)
SHORT_FRAMES, SHORT_BOOST = 50.0, 3.0  # estimates under 50 frames rise to 50 (x/50)^(1/3)
SPACE, MARK, PUNCTUATION, DIGIT, CJK, OTHER = 0.2, 0.0, 0.5, 3.5, 3.0, 1.0
# Weights of the remaining characters by Unicode block: (last code point, weight), consecutive blocks of one
# weight merged; past the table, 3.0 above U+20000 (CJK extensions), else 1.0.
BLOCK_WEIGHTS = ((0x058F, 1.0), (0x08FF, 1.5), (0x0DFF, 1.8), (0x0EFF, 1.5), (0x109F, 1.8), (0x10FF, 1.0),
                 (0x11FF, 2.5), (0x139F, 3.0), (0x177F, 1.0), (0x17FF, 1.8), (0x18FF, 1.0), (0x1C7F, 1.8),
                 (0x1CBF, 1.0), (0x1CFF, 1.8), (0x1EFF, 1.0), (0x30FF, 2.2), (0x312F, 3.0), (0x318F, 2.5),
                 (0xA4CF, 3.0), (0xA7FF, 1.0), (0xA82F, 1.8), (0xA87F, 1.0), (0xA95F, 1.8), (0xA97F, 2.5),
                 (0xAAFF, 1.8), (0xAB2F, 3.0), (0xABBF, 1.0), (0xABFF, 1.8), (0xD7AF, 2.5), (0xFAFF, 3.0),
                 (0xFDFF, 1.5), (0xFE6F, 1.0), (0xFEFF, 1.5), (0xFFEF, 1.0))
# Long texts split at these marks into chunks (the package's chunk_text_punctuation), never after these
# abbreviations; a chunk under 3 characters joins its neighbour.
SPLIT_MARKS = frozenset(".,;:!?。，；：！？")
CLOSING_MARKS = frozenset("\"'“”‘’）]》>」】")
ABBREVIATIONS = frozenset(
    "Mr. Mrs. Ms. Dr. Prof. Sr. Jr. Rev. Fr. Hon. Pres. Gov. Capt. Gen. Sen. Rep. Col. Maj. Lt. Cmdr. Sgt. "
    "Cpl. Co. Corp. Inc. Ltd. Est. Dept. St. Ave. Blvd. Rd. Mt. Ft. No. Jan. Feb. Mar. Apr. Aug. Sep. Sept. "
    "Oct. Nov. Dec. i.e. e.g. vs. Vs. Etc. approx. fig. def.".split())
MIN_CHUNK = 3

DETECTION = Detection(("audio_embeddings.weight", "audio_heads.weight", "llm.norm.weight"), ("",),
                      "an OmniVoice model",
                      f"the {WEIGHTS_FILE} of an OmniVoice model folder (k2-fsa/OmniVoice)")


def weights_file(path: str | Path) -> Path:
    """The safetensors file of a model folder (or the file itself)."""
    path = Path(path)
    return path / WEIGHTS_FILE if path.is_dir() else path


def read_arch(ckpt: Checkpoint) -> Arch:
    """The layers' Arch from the file's shapes (section 2); latents: the codebooks."""
    stem = "llm.layers.0."
    hidden = ckpt.shape("llm.norm.weight")[0]
    head = ckpt.shape(f"{stem}self_attn.q_norm.weight")[0]
    q_rows = ckpt.shape(f"{stem}self_attn.q_proj.weight")[0]
    k_rows = ckpt.shape(f"{stem}self_attn.k_proj.weight")[0]
    audio_rows = ckpt.shape("audio_embeddings.weight")[0]
    codebooks = ckpt.shape("codebook_layer_offsets")[0] if "codebook_layer_offsets" in ckpt else CODEBOOKS
    if q_rows % head or k_rows % head or audio_rows % codebooks:
        raise WeightsError(f"{ckpt.path.name}: queries of {q_rows}, keys of {k_rows} in heads of {head}, or "
                           f"{audio_rows} audio rows in {codebooks} codebooks do not fit OmniVoice")
    return Arch(family="omnivoice", hidden=hidden,
                layers=ckpt.numbered("llm.layers.", ".self_attn.q_proj.weight"), refiner=0,
                heads=q_rows // head, head=head, kv_heads=k_rows // head, inner=q_rows,
                ffn=ckpt.shape(f"{stem}mlp.gate_proj.weight")[0], latents=codebooks, patch=(1,),
                text_dim=hidden, freq_dim=0, time_hidden=0, time_dim=0, eps=EPS, qk_eps=EPS, final_eps=EPS,
                rope_axes=(head,), rope_theta=ROPE_THETA)


def _read_block(ckpt: Checkpoint, stem: str, a: Arch, lin) -> Block:
    """Layer `stem` ('llm.layers.3.'): QKV = [q; k; v], UP = gluRows(gate, up)."""
    qkv = stack_rows([lin(f"{stem}self_attn.{n}_proj") for n in "qkv"])
    if qkv.weight.shape != (a.qkv_width, a.hidden):
        raise WeightsError(f"{ckpt.path.name}: '{stem}self_attn.q/k/v_proj' give {tuple(qkv.weight.shape)}, "
                           f"expected {(a.qkv_width, a.hidden)}")
    norm = lambda key, n: read_tensor(ckpt, f"{stem}{key}.weight", (n,))  # noqa: E731
    up = glu_rows(lin(f"{stem}mlp.gate_proj"), lin(f"{stem}mlp.up_proj"))
    return Block((qkv, lin(f"{stem}self_attn.o_proj"), up, lin(f"{stem}mlp.down_proj"),
                  norm("input_layernorm", a.hidden),
                  norm("post_attention_layernorm", a.hidden), norm("self_attn.q_norm", a.head),
                  norm("self_attn.k_norm", a.head), None, None))


def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      lengths: tuple[int, ...]) -> torch.Tensor:
    """The block's attention within each segment of consecutive rows (lengths sum to the rows)."""
    return torch.cat([attention(*parts, 0) for parts in zip(*(t.split(lengths) for t in (q, k, v)))])


def bidirectional_layer(block: Block, a: Arch, x: torch.Tensor, m: Modulation, s: Sequence,
                        lengths: tuple[int, ...]) -> torch.Tensor:
    """Block.forward (no sandwich norms, no attention gate) with rows attending only within their segment."""
    w = block.w
    h = modulated_norm(a, x, w[NORM1], m.attn_shift, m.attn_scale, s.map)
    q, k, v, _ = split_qkv(a, linear(h, w[QKV]).to(x.dtype))
    q, k = head_norm_rotary(q, w[Q_NORM], a, s), head_norm_rotary(k, w[K_NORM], a, s)
    o = linear(segment_attention(q, k, v, lengths), w[OUT]).to(x.dtype)
    x = x + m.attn_gate.to(x.dtype)[s.map] * o
    h = modulated_norm(a, x, w[NORM2], m.mlp_shift, m.mlp_scale, s.map)
    d = linear(swiglu(linear(h, w[UP]).to(x.dtype)), w[DOWN]).to(x.dtype)
    return x + m.mlp_gate.to(x.dtype)[s.map] * d


def combined_text(text: str, ref_text: str | None = None) -> str:
    """The reference's text then the target's, one space between, cleaned as the package's _combine_text: no
    line breaks, full-width parentheses as ASCII, runs of spaces and tabs as one space, none beside Han
    characters."""
    full = f"{ref_text.strip()} {text.strip()}" if ref_text else text.strip()
    full = re.sub(r"[\r\n]+", "", full).replace("\uff08", "(").replace("\uff09", ")")
    full = re.sub(r"[ \t]+", " ", full)
    return re.sub(rf"(?<={HAN})\s+|\s+(?={HAN})", "", full)


def text_ids(tokenizer, text: str) -> list[int]:
    """Token ids of text with each non-verbal tag tokenized on its own (no special tokens added)."""
    pieces, last = [], 0
    for m in NONVERBAL.finditer(text):
        pieces += [text[last:m.start()], m.group()]
        last = m.end()
    pieces.append(text[last:])
    return [i for piece in pieces if piece for i in tokenizer(piece, add_special_tokens=False)["input_ids"]]


def load_tokenizer(folder: str | Path):
    """A model folder's tokenizer as the package loads it (transformers' AutoTokenizer, local files only), its seven
    special tokens checked; WeightsError naming what is missing."""
    from transformers import AutoTokenizer
    folder = Path(folder)
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise WeightsError(f"{folder.name}: no tokenizer.json or tokenizer_config.json; an OmniVoice model folder "
                           f"holds its tokenizer's files (k2-fsa/OmniVoice)")
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    missing = [t for t in SPECIAL_TOKENS if t not in tokenizer.get_vocab()]
    if missing:
        raise WeightsError(f"{folder.name}: its tokenizer lacks {', '.join(missing)}; not OmniVoice's")
    return tokenizer


def punctuated(text: str) -> str:
    """A reference transcript stripped and ended with punctuation ("." or, holding Han, "。"), as the package's
    add_punctuation prepares it."""
    text = text.strip()
    if text and text[-1] not in END_PUNCTUATION:
        text += "。" if re.search(HAN, text) else "."
    return text


def char_weight(ch: str) -> float:
    """A character's speaking time relative to a Latin letter (the package's _get_char_weight)."""
    code = ord(ch)
    if ch.isascii() and ch.isalpha():
        return 1.0
    if code == 0x20:
        return SPACE
    if code == 0x0640:  # Arabic tatweel: silent
        return MARK
    kind = unicodedata.category(ch)[0]
    if kind in "MPSZN":
        return {"M": MARK, "P": PUNCTUATION, "S": PUNCTUATION, "Z": SPACE, "N": DIGIT}[kind]
    block = bisect.bisect_left(BLOCK_WEIGHTS, (code,))
    if block < len(BLOCK_WEIGHTS):
        return BLOCK_WEIGHTS[block][1]
    return CJK if code > 0x20000 else OTHER


def target_frames(text: str, ref_text: str | None = None, ref_frames: int | None = None,
                  speed: float = 1.0) -> int:
    """The length rule: frames for text at the reference's frames per unit of weight (the default reference's
    without one), raised towards 50 frames when under, divided by speed, at least 1 (the package's
    _estimate_target_tokens)."""
    if ref_frames is None or not ref_text:
        ref_text, ref_frames = DEFAULT_REFERENCE
    ref_weight = sum(char_weight(ch) for ch in ref_text)
    frames = 0.0
    if ref_frames > 0 and ref_weight != 0:
        frames = sum(char_weight(ch) for ch in text) / (ref_weight / ref_frames)
        if frames < SHORT_FRAMES:
            frames = SHORT_FRAMES * (frames / SHORT_FRAMES) ** (1.0 / SHORT_BOOST)
    if speed > 0 and speed != 1.0:
        frames /= speed
    return max(1, int(frames))


def text_chunks(text: str, chunk_len: int) -> list[str]:
    """text split after split marks (a mark or closing mark that would open a sentence stays with the one
    before; a period after an abbreviation does not split), sentences merged up to chunk_len characters, a
    chunk under 3 characters joined to the one before (the first to the second): chunk_text_punctuation."""
    sentences, current = [], []
    for ch in text:
        if not current and sentences and (ch in SPLIT_MARKS or ch in CLOSING_MARKS):
            sentences[-1].append(ch)
            continue
        current.append(ch)
        if ch in SPLIT_MARKS and not (ch == "." and "".join(current).split()[-1] in ABBREVIATIONS):
            sentences.append(current)
            current = []
    sentences += [current] if current else []
    merged, current = [], []
    for sentence in sentences:
        if len(current) + len(sentence) <= chunk_len:
            current = current + sentence
        else:
            merged += [current] if current else []
            current = sentence
    merged += [current] if current else []
    first_short = bool(merged) and len(merged[0]) < MIN_CHUNK
    chunks = []
    for i, chunk in enumerate(merged):
        if chunks and ((i == 1 and first_short) or len(chunk) < MIN_CHUNK):
            chunks[-1] = chunks[-1] + chunk
        else:
            chunks.append(chunk)
    return [joined for joined in ("".join(c).strip() for c in chunks) if joined]


@dataclass(frozen=True)
class Prompt:
    """One item's conditional prefix, [style | text | reference codes] (section 4): ids [C, N] long (text ids
    in every codebook row, only row 0 read), audio [N] bool (the reference's code positions); target: frames
    to make."""
    ids: torch.Tensor
    audio: torch.Tensor
    target: int


def prompt_rows(tokenizer, text: str, target: int, codebooks: int = CODEBOOKS, lang: str | None = None,
                instruct: str | None = None, ref_text: str | None = None,
                ref_codes: torch.Tensor | None = None, denoise: bool = True) -> Prompt:
    """The package's _prepare_inference_inputs less the target rows: <|denoise|> (with a reference, when
    denoise), the language and instruction ("None" when absent), then <|text_start|>ref_text text<|text_end|>,
    then the reference's codes [C, T_ref]. lang and instruct are taken as given (the package resolves names
    first)."""
    style = ("<|denoise|>" if denoise and ref_codes is not None else "") + \
        f"<|lang_start|>{lang or 'None'}<|lang_end|><|instruct_start|>{instruct or 'None'}<|instruct_end|>"
    wrapped = f"<|text_start|>{combined_text(text, ref_text)}<|text_end|>"
    words = tokenizer(style)["input_ids"] + text_ids(tokenizer, wrapped)
    ids = torch.tensor(words, dtype=torch.long).repeat(codebooks, 1)
    audio = torch.zeros(len(words), dtype=torch.bool)
    if ref_codes is not None:
        if ref_codes.dim() != 2 or ref_codes.shape[0] != codebooks:
            raise ValueError(f"OmniVoice: reference codes must be [{codebooks}, frames], got "
                             f"{tuple(ref_codes.shape)}")
        ids = torch.cat([ids, ref_codes.long().cpu()], dim=1)
        audio = torch.cat([audio, torch.ones(ref_codes.shape[1], dtype=torch.bool)])
    if target < 1:
        raise ValueError(f"OmniVoice: the target must be at least one frame, got {target}")
    return Prompt(ids, audio, target)


@dataclass(frozen=True)
class OmniVoice(Codebooks):
    """OmniVoice where it runs: the text and audio embedding tables, the layers, the final norm, the heads."""
    arch: Arch
    text_embedding: torch.Tensor   # llm.embed_tokens [vocab, hidden] f32
    audio_embedding: torch.Tensor  # [codebooks x audio_vocab, hidden] f32: code i of codebook c at c V + i
    blocks: tuple[Block, ...]
    final_norm: torch.Tensor
    heads: Linear                  # audio_heads: hidden -> codebooks x audio_vocab

    @staticmethod
    def load(path: str | Path | Checkpoint, linears: str = "stored",
             compute_on: torch.device | None = None) -> OmniVoice:
        """OmniVoice from its model folder (its model.safetensors) or that file. linears: 'stored' keeps each
        layer linear as stored, 'int8' quantizes float ones to INT8 ConvRot (on compute_on: OpenedFile), 'bf16'
        dequantizes INT8 ones."""
        file = path if isinstance(path, Checkpoint) else weights_file(path)
        opened = OpenedFile.open(file, DETECTION, linears, compute_on)
        ckpt = opened.ckpt
        a = read_arch(ckpt)
        vocab = ckpt.shape("audio_embeddings.weight")[0]
        blocks = tuple(opened.convert(_read_block(ckpt, f"llm.layers.{i}.", a, opened.linear))
                       for i in range(a.layers))
        heads = opened.linear("audio_heads")
        if heads.weight.shape != (vocab, a.hidden):
            raise WeightsError(f"{ckpt.path.name}: 'audio_heads.weight' is {tuple(heads.weight.shape)}, "
                               f"expected {(vocab, a.hidden)}")
        return OmniVoice(a, read_tensor(ckpt, "llm.embed_tokens.weight"),
                         read_tensor(ckpt, "audio_embeddings.weight", (vocab, a.hidden)), blocks,
                         read_tensor(ckpt, "llm.norm.weight", (a.hidden,)), heads)

    def to(self, device: str | torch.device, budget_bytes=None, options=None, dtype: torch.dtype | None = None):
        """The model where it runs: itself on the CPU in float32; else its device form (dit_core/gpu/omnivoice.py,
        BF16 by default, INT8 ConvRot linears kept where the file stores them), which the loop also takes.
        budget_bytes: unused (0.6 B parameters stay resident); options: the GPU path's (gpu/options.py)."""
        device = torch.device(device)
        if device.type == "cpu" and dtype in (None, torch.float32):
            return self
        from ..gpu.omnivoice import GpuOmniVoice  # the GPU path is imported only where it runs
        return GpuOmniVoice.of(self, device, dtype or torch.bfloat16, options)

    def embed(self, ids: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        """Rows [rows, hidden]: a text row embeds its id in codebook row 0, an audio row sums its codebooks'
        codes (section 3). The package also looks audio ids up in the text table and drops them; we skip that
        lookup."""
        offsets = torch.arange(self.codebooks)[:, None] * self.audio_vocab
        x = torch.empty(ids.shape[1], self.arch.hidden)
        x[~audio] = self.text_embedding[ids[0, ~audio]]
        x[audio] = self.audio_embedding[ids[:, audio] + offsets].sum(0)
        return x

    def sequence(self, lengths: tuple[int, ...]) -> Sequence:
        """Rows of segments of those lengths, positions restarting at 0 in each; one modulation row. Angles
        are the f32 positions times Qwen3's f32 frequencies, as transformers computes them."""
        a = self.arch
        positions = torch.cat([torch.arange(n) for n in lengths]).float()
        inv_freq = 1.0 / (a.rope_theta ** (torch.arange(0, a.head, 2, dtype=torch.float32) / a.head))
        angles = positions[:, None] * inv_freq
        return Sequence(torch.zeros(positions.shape[0], dtype=torch.long), angles.cos(), angles.sin())

    def logits(self, ids: torch.Tensor, audio: torch.Tensor, lengths: tuple[int, ...],
               rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [C, rows, audio_vocab] f32 of packed rows ids [C, rows], audio [rows] bool, in segments that
        attend only within themselves (lengths); only of `rows` (an index) when given: the heads are the
        widest linear."""
        if ids.shape[1] != sum(lengths) or audio.shape[0] != ids.shape[1] or ids.shape[0] != self.codebooks:
            raise ValueError(f"OmniVoice: ids {tuple(ids.shape)} and audio {tuple(audio.shape)} for segments "
                             f"{lengths} of {self.codebooks} codebooks")
        a = self.arch
        x = self.embed(ids, audio)
        s, m = self.sequence(lengths), Modulation.identity(a.hidden)
        for block in self.blocks:
            x = bidirectional_layer(block, a, x, m, s, lengths)
        x = x if rows is None else x[rows]
        y = linear(rms_norm(x, self.final_norm, a.final_eps), self.heads)
        return y.reshape(-1, self.codebooks, self.audio_vocab).transpose(0, 1)

    def target_logits(self, prompts: list[Prompt], codes: list[torch.Tensor],
                      guided: bool) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Per item, the logits [C, T, V] of its target rows with its codes [C, T] in place: conditional
        ([prefix | codes]) and, when guided, unconditional (the codes alone); one forward of every item's
        segments packed."""
        segments = []  # (ids, audio, T) in packed order: every segment ends in its item's T target rows
        for p, c in zip(prompts, codes):
            t, target = c.shape[1], torch.ones(c.shape[1], dtype=torch.bool)
            segments.append((torch.cat([p.ids, c], 1), torch.cat([p.audio, target]), t))
            segments += [(c, target, t)] if guided else []
        ids, audio, targets = zip(*segments)
        lengths = tuple(i.shape[1] for i in ids)
        rows = torch.cat([torch.arange(end - t, end) for end, t in zip(accumulate(lengths), targets)])
        out = self.logits(torch.cat(ids, 1), torch.cat(audio), lengths, rows).split(targets, dim=1)
        return [(out[i], out[i + 1] if guided else None) for i in range(0, len(out), 1 + guided)]


def generate_codes(model: OmniVoice, prompts: list[Prompt], u: Unmasking, generator: torch.Generator,
                   callback=None, should_stop=None) -> list[torch.Tensor]:
    """Codes [C, T] for each prompt: the unmasking loop (sampling/omnivoice.py) over model's packed forwards,
    its draws from generator (a CPU generator seeded with s draws the package's draws after
    torch.manual_seed(s)). A device form (OmniVoice.to) runs its own loop with the same draws."""
    if not isinstance(model, OmniVoice):
        return model.generate_codes(prompts, u, generator, callback=callback, should_stop=should_stop)
    return sample_unmasking(lambda codes: model.target_logits(prompts, codes, u.guidance != 0),
                            [p.target for p in prompts], model.codebooks, model.mask_id, u, generator,
                            callback=callback, should_stop=should_stop)


@dataclass(frozen=True)
class Speech:
    """One utterance to make: its text, language and instruction (as the model takes them), the voice
    reference (its text and codes [C, T_ref], or neither), a speed (the estimate's divisor) or a fixed length
    in frames (which then sets the speed the chunks' estimates take)."""
    text: str
    lang: str | None = None
    instruct: str | None = None
    ref_text: str | None = None
    ref_codes: torch.Tensor | None = None
    speed: float = 1.0
    frames: int | None = None

    def __post_init__(self):
        if (self.ref_text is None) != (self.ref_codes is None):
            raise ValueError("OmniVoice: a voice reference needs both its text and its codes")
        if self.frames is not None and self.frames < 1:
            raise ValueError(f"OmniVoice: a fixed length must be at least one frame, got {self.frames}")

    def target(self) -> int:
        return self.frames or target_frames(self.text, self.ref_text, self.ref_frames, self.speed)

    @property
    def ref_frames(self) -> int | None:
        return None if self.ref_codes is None else self.ref_codes.shape[1]

    @property
    def chunk_speed(self) -> float:
        """The speed each chunk's length is estimated at: with a fixed length, estimate / frames."""
        return self.speed if self.frames is None else \
            target_frames(self.text, self.ref_text, self.ref_frames) / self.frames


def speech_codes(model: OmniVoice, tokenizer, items: list[Speech], u: Unmasking, seed: int,
                 chunk_seconds: float = 15.0, threshold_seconds: float = 30.0, denoise: bool = True,
                 callback=None, should_stop=None) -> list[list[torch.Tensor]]:
    """Per item, its codes as a list of [C, T] chunks (one for a short item), made as the package's generate
    makes them, draws from one CPU generator seeded with seed: items of at most threshold_seconds together
    first, then the longer ones split into chunks of about chunk_seconds at punctuation. Chunk i of every long
    item is made together, each with its item's reference, or without one, the item's first chunk (its text
    and codes) as the reference of the others. The items with references and those without are not mixed in
    the long ones (the package refuses that too)."""
    generator = torch.Generator().manual_seed(seed)
    run = lambda prompts: generate_codes(model, prompts, u, generator, callback, should_stop)  # noqa: E731
    prompt = lambda it, text, target, ref_text, ref_codes: prompt_rows(  # noqa: E731
        tokenizer, text, target, model.codebooks, it.lang, it.instruct, ref_text, ref_codes, denoise)
    targets = [it.target() for it in items]
    long = [i for i, t in enumerate(targets) if t > int(threshold_seconds * FRAME_RATE)]
    short = [i for i in range(len(items)) if i not in long]
    out: list[list[torch.Tensor]] = [[] for _ in items]
    if short:
        made = run([prompt(items[i], items[i].text, targets[i], items[i].ref_text, items[i].ref_codes)
                    for i in short])
        for i, codes in zip(short, made):
            out[i].append(codes)
    if not long:
        return out
    references = [items[i].ref_codes is not None for i in long]
    if any(references) and not all(references):
        raise ValueError("OmniVoice: long texts with and without a voice reference cannot be made together")
    per_char = {i: targets[i] / len(items[i].text) for i in long}  # frames a character
    chunks = {i: text_chunks(items[i].text, int(chunk_seconds * FRAME_RATE / per_char[i])) for i in long}
    for c in range(max(len(v) for v in chunks.values())):
        batch, prompts = [i for i in long if c < len(chunks[i])], []
        for i in batch:
            it = items[i]
            ref_text, ref_codes = (it.ref_text, it.ref_codes) if all(references) or c == 0 else \
                (chunks[i][0], out[i][0])
            frames = target_frames(chunks[i][c], ref_text, None if ref_codes is None else ref_codes.shape[1],
                                   it.chunk_speed)
            prompts.append(prompt(it, chunks[i][c], frames, ref_text, ref_codes))
        for i, codes in zip(batch, run(prompts)):
            out[i].append(codes)
    return out
