"""OmniVoice nodes, text to speech and voice cloning (BF16 on ComfyUI's CUDA device, else f32 on the CPU): the model
folder's loader, the request, a voice reference (AUDIO and its transcript, encoded), the sampler, the decode."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

import folder_paths
import torch
from comfy_api.latest import io

from ..dit_core.codecs.higgs_audio import FOLDER as CODEC_FOLDER, HiggsAudioCodec
from ..dit_core.codecs.omnivoice_audio import finish_speech, prepare_reference
from ..dit_core.families.omnivoice import (FRAME_RATE, SPLIT_MARKS, WEIGHTS_FILE, OmniVoice, Speech, load_tokenizer,
                                           punctuated, speech_codes, target_frames, text_chunks)
from ..dit_core.sampling.omnivoice import Unmasking
from ..dit_core.weights import WeightsError
from .base import (FileHandle, ModelHandle, SwiftDiTError, cancellable, check_family, checked, finite, interrupt_check,
                   loading_shown, run_sampler)
from .memory import LOADED, engine_device, on_device
from .types import DiTModel

CATEGORY = "SwiftDiT/OmniVoice"
FAMILY = "omnivoice"
CODEBOOK = "quantizer.quantizers.0.codebook.embed"  # the codec's first codebook: its rows are the codes
MODELS = "omnivoice"  # models/omnivoice/<folder>/ as k2-fsa/OmniVoice: model.safetensors, tokenizer, audio_tokenizer/
folder_paths.add_model_folder_path(MODELS, os.path.join(folder_paths.models_dir, MODELS))
MAX_PIECE_S = 30.0  # the package makes at most this much at once when a text can be split (audio_chunk_threshold)
MIN_REFERENCE_S = 1.0  # a shorter voice prompt is refused (3 to 10 s advised)

# The sampler's float widgets, Unmasking's fields (the package's defaults): (name, min, max, step, tooltip)
UNMASKING = (("guidance", 0.0, 20.0, 0.1, "Guidance on log probabilities; 0: no unconditional pass"),
             ("t_shift", 0.01, 10.0, 0.01, "The schedule's shift: small reveals few codes early"),
             ("layer_penalty", 0.0, 100.0, 0.1, "Confidence taken off per codebook: earlier codebooks first"),
             ("position_temperature", 0.0, 100.0, 0.1, "Randomness of which codes are revealed; 0: the surest"),
             ("class_temperature", 0.0, 100.0, 0.1, "Randomness of each code; 0: the most likely"))

# OmniVoice's own wire types (the shared ones are in nodes/types.py):
SpeechText = io.Custom("SWIFTDIT_OMNIVOICE_TEXT")    # the engine's Speech without a voice
VoicePrompt = io.Custom("SWIFTDIT_OMNIVOICE_VOICE")  # a Voice: the reference's transcript, codes, RMS
AudioCodes = io.Custom("SWIFTDIT_AUDIO_CODES")       # a Codes: the speech's codes chunk by chunk, its RMS
AudioCodec = io.Custom("SWIFTDIT_AUDIO_CODEC")       # a FileHandle of kind "codec": the folder's audio_tokenizer


@dataclass(frozen=True)
class Voice:  # on SWIFTDIT_OMNIVOICE_VOICE
    text: str
    codes: torch.Tensor  # [codebooks, frames] int64
    rms: float           # the reference's loudness, which the decode matches


@dataclass(frozen=True)
class Codes:  # on SWIFTDIT_AUDIO_CODES
    chunks: tuple[torch.Tensor, ...]  # [codebooks, frames] int64 each: a long text's pieces in order
    rms: float | None                 # the voice reference's RMS, None without one


def model_folders() -> list[str]:
    """Folders of the models/omnivoice lists holding a model.safetensors and audio_tokenizer/model.safetensors."""
    files = set(folder_paths.get_filename_list(MODELS))
    return sorted(d for d in {os.path.dirname(f) for f in files if os.path.basename(f) == WEIGHTS_FILE}
                  if d and os.path.join(d, CODEC_FOLDER, WEIGHTS_FILE) in files)


def load_speech_model(handle: ModelHandle) -> tuple[OmniVoice, object]:
    """The model on engine_device() and its tokenizer in LOADED's DiT slot; a GPU form is its own companion (graphs)."""
    device = engine_device()
    load = lambda: (cancellable(OmniVoice.load, handle.path).to(device), load_tokenizer(os.path.dirname(handle.path)))
    held = LOADED.get("dit", (*handle.key(), str(device), FAMILY), load, device)
    return held if device.type != "cuda" else (LOADED.attached("dit", "graphs", lambda: held[0]), held[1])


def load_codec(handle: FileHandle) -> HiggsAudioCodec:  # f32 on either device, as the package runs its codec
    return on_device("vae", handle, lambda: HiggsAudioCodec.load(handle.path), FAMILY, role=handle.role)


def node_schema(cls, inputs: list, outputs: list, description: str) -> io.Schema:
    return io.Schema(node_id=cls.NODE_ID, display_name=cls.DISPLAY, category=CATEGORY, description=description,
                     inputs=inputs, outputs=outputs)


class OmniVoiceLoader(io.ComfyNode):
    NODE_ID, DISPLAY = "SwiftDiTOmniVoiceLoader", "OmniVoice Loader (SwiftDiT)"

    @classmethod
    def define_schema(cls):
        return node_schema(cls, [io.Combo.Input("model_name", options=model_folders(), tooltip=(
            "An OmniVoice model folder from models/omnivoice (model.safetensors, tokenizer files, audio_tokenizer/)"))],
            [DiTModel.Output(display_name="model", tooltip="The OmniVoice model, for its Sampler"),
             AudioCodec.Output(display_name="codec", tooltip="The folder's codec, for the Reference and Decode")],
            "Loads an OmniVoice model folder (model, tokenizer and codec) for the SwiftDiT engine.")

    @classmethod
    def validate_inputs(cls, model_name) -> bool | str:
        return True if model_name in model_folders() else \
            f"{cls.DISPLAY} · model_name: '{model_name}' is not a folder with {WEIGHTS_FILE} and {CODEC_FOLDER}/ " \
            f"in ComfyUI's models/{MODELS} folders; put the model folder there (as k2-fsa/OmniVoice) and refresh"

    @classmethod
    def execute(cls, model_name) -> io.NodeOutput:
        why = cls.validate_inputs(model_name)
        if why is not True:
            raise SwiftDiTError(why.replace(cls.DISPLAY, cls.NODE_ID, 1))
        path = folder_paths.get_full_path_or_raise(MODELS, os.path.join(model_name, WEIGHTS_FILE))
        model = ModelHandle(FAMILY, path, "stored")
        codec = FileHandle("codec", os.path.join(os.path.dirname(path), CODEC_FOLDER, WEIGHTS_FILE), "codec")
        with checked(cls.NODE_ID, "model_name"), loading_shown():
            try:
                speech, audio = load_speech_model(model)[0], load_codec(codec)
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:  # the folder's JSON files, unreadable
                if isinstance(e, FileNotFoundError):
                    raise
                raise WeightsError(f"{model_name}: a file of the folder cannot be read ({e}); its config.json, "
                                   f"tokenizer files or {CODEC_FOLDER}/config.json are damaged: download the folder "
                                   f"again (k2-fsa/OmniVoice)") from e
            if (speech.codebooks, speech.mask_id) != (audio.codebooks, len(audio.w[CODEBOOK])):
                raise WeightsError(f"{model_name}: the model makes {speech.codebooks} codebooks of {speech.mask_id} "
                                   f"codes, its {CODEC_FOLDER}/ decodes {audio.codebooks} of {len(audio.w[CODEBOOK])}")
        return io.NodeOutput(model, codec)


class OmniVoiceText(io.ComfyNode):
    NODE_ID, DISPLAY = "SwiftDiTOmniVoiceText", "OmniVoice Text (SwiftDiT)"

    @classmethod
    def define_schema(cls):
        return node_schema(cls, [
            io.String.Input("text", multiline=True, dynamic_prompts=True,
                            tooltip="What to say; non-verbal tags such as [laughter] or [sigh] are read as such"),
            io.String.Input("language", default="", tooltip="A language id (en, zh, ja, de, ...); empty: any"),
            io.String.Input("instruct", default="", tooltip="Voice design, e.g. 'female, low pitch'; empty: none"),
            io.Float.Input("speed", default=1.0, min=0.25, max=4.0, step=0.05, tooltip="Speaking speed"),
            io.Float.Input("duration", default=0.0, min=0.0, max=600.0, step=0.1,
                           tooltip="A fixed length in seconds (overrides speed); 0: estimated from the text")],
            [SpeechText.Output(tooltip="The speech request, for the OmniVoice Sampler")],
            "What to say and how: text, language, instruction, speed or a fixed duration (no model needed).")

    @classmethod
    def execute(cls, text, language, instruct, speed, duration) -> io.NodeOutput:
        node, text = cls.NODE_ID, text.strip()
        speed, duration = finite(node, "speed", speed, 0.25, 4.0), finite(node, "duration", duration, 0.0, 600.0)
        if not text:
            raise SwiftDiTError(f"{node} · text: nothing to say; type the text to speak")
        if not duration:  # a piece that the chunker cannot split is made at once: refused past the package's limit
            for piece in text_chunks(text, 0):
                seconds = target_frames(piece, speed=speed) / FRAME_RATE
                if seconds > MAX_PIECE_S:
                    raise SwiftDiTError(
                        f"{node} · text: '{piece[:40]}...' runs about {seconds:.0f} s without a split mark; long "
                        f"texts are made in pieces of about 15 s split after {' '.join(sorted(SPLIT_MARKS))}, and "
                        f"a piece over {MAX_PIECE_S:.0f} s is refused: add punctuation")
        lang = language.strip() if language.strip().lower() not in ("", "none") else None
        frames = max(1, int(duration * FRAME_RATE)) if duration else None  # the package's duration x frame rate
        return io.NodeOutput(Speech(text, lang, instruct.strip() or None, speed=speed, frames=frames))


class OmniVoiceReference(io.ComfyNode):
    NODE_ID, DISPLAY = "SwiftDiTOmniVoiceReference", "OmniVoice Reference (SwiftDiT)"

    @classmethod
    def define_schema(cls):
        return node_schema(cls, [
            AudioCodec.Input("codec", tooltip="The codec from the OmniVoice Loader"),
            io.Audio.Input("audio", tooltip="The voice to clone (3 to 10 s advised), e.g. from Load Audio"),
            io.String.Input("text", multiline=True, tooltip="What the reference says, word for word"),
            io.Boolean.Input("preprocess", default=True, tooltip="Trim silences, end the transcript with punctuation")],
            [VoicePrompt.Output(tooltip="The voice prompt (codes, transcript, loudness), for the Sampler's voice")],
            "A voice to clone: the reference audio (mono, 24 kHz, silences trimmed) encoded, with its transcript.")

    @classmethod
    def execute(cls, codec, audio, text, preprocess) -> io.NodeOutput:
        node = cls.NODE_ID
        wave, rate = audio["waveform"], int(audio["sample_rate"])
        if wave.dim() != 3 or wave.shape[0] != 1 or wave.shape[-1] == 0 or rate <= 0:
            raise SwiftDiTError(f"{node} · audio: an empty recording or a batch of several ({tuple(wave.shape)} at "
                                f"{rate} Hz); load one clip of the voice")
        if not text.strip():
            raise SwiftDiTError(f"{node} · text: the reference's transcript is empty; type what the recording says")
        encoder = load_codec(codec)
        with checked(node, "audio"):
            prepared, rms = prepare_reference(wave[0], rate, encoder.cfg.sample_rate, encoder.hop, preprocess)
            seconds = prepared.shape[-1] / encoder.cfg.sample_rate
            if seconds < MIN_REFERENCE_S:
                trimmed = " after trimming silences" if preprocess else ""
                raise SwiftDiTError(f"{node} · audio: {seconds:.2f} s of voice{trimmed}; at least "
                                    f"{MIN_REFERENCE_S:g} s is needed (3 to 10 s advised)")
            codes = encoder.encode(prepared[None], check=interrupt_check)[0].cpu()
        return io.NodeOutput(Voice(punctuated(text) if preprocess else text.strip(), codes, rms))


class OmniVoiceSampler(io.ComfyNode):
    NODE_ID, DISPLAY = "SwiftDiTOmniVoiceSampler", "OmniVoice Sampler (SwiftDiT)"

    @classmethod
    def define_schema(cls):
        d = Unmasking()
        return node_schema(cls, [
            DiTModel.Input("model", tooltip="The OmniVoice model from its loader"),
            SpeechText.Input("text", tooltip="The request from the OmniVoice Text node"),
            VoicePrompt.Input("voice", optional=True, tooltip="A voice to clone, from the OmniVoice Reference"),
            io.Int.Input("seed", default=0, min=0, max=0xFFFFFFFFFFFFFFFF, control_after_generate=True,
                         tooltip="The seed of the sampler's draws (the package's after torch.manual_seed)"),
            io.Int.Input("steps", default=d.steps, min=1, max=200, tooltip="Unmasking steps (12 is often enough)"),
            *[io.Float.Input(name, default=getattr(d, name), min=low, max=high, step=step, tooltip=tip)
              for name, low, high, step, tip in UNMASKING]],
            [AudioCodes.Output(tooltip="The speech's codes, for the OmniVoice Decode")],
            "OmniVoice's unmasking sampler: every code starts masked and each step reveals the most confident ones; "
            "long texts are made in pieces of about 15 s, as the package makes them.")

    @classmethod
    def execute(cls, model, text, seed, steps, voice=None, **settings) -> io.NodeOutput:
        node = cls.NODE_ID
        check_family(node, model, FAMILY, "OmniVoice Loader")
        values = {name: finite(node, name, settings[name], low, high) for name, low, high, *_ in UNMASKING}
        with checked(node, "steps"):
            u = Unmasking(steps=steps, **values)
        with checked(node, "model"):
            speech, tokenizer = load_speech_model(model)
        item = text if voice is None else replace(text, ref_text=voice.text, ref_codes=voice.codes)
        sample = lambda callback, should_stop: speech_codes(  # run_sampler's callback: (step, steps, x, x0)
            speech, tokenizer, [item], u, seed, callback=lambda i, n, codes: callback(i, n, codes, None),
            should_stop=should_stop)[0]
        with checked(node, "text"):
            chunks = run_sampler(sample, steps)
        return io.NodeOutput(Codes(tuple(chunks), None if voice is None else voice.rms))


class OmniVoiceDecode(io.ComfyNode):
    NODE_ID, DISPLAY = "SwiftDiTOmniVoiceDecode", "OmniVoice Decode (SwiftDiT)"

    @classmethod
    def define_schema(cls):
        return node_schema(cls, [
            AudioCodes.Input("codes", tooltip="The speech's codes from the OmniVoice Sampler"),
            AudioCodec.Input("codec", tooltip="The codec from the OmniVoice Loader"),
            io.Boolean.Input("postprocess", default=True,
                             tooltip="Shorten silences over 0.5 s and trim the ends to 0.1 s, as the package does")],
            [io.Audio.Output(tooltip="The speech, mono at 24 kHz, for Save Audio or Preview Audio")],
            "The codec's decode to AUDIO with the package's finish: pieces cross-faded, silences trimmed, loudness "
            "matched to the reference (peak 0.5 without one), 0.1 s fades and padding.")

    @classmethod
    def execute(cls, codes, codec, postprocess) -> io.NodeOutput:
        node, decoder = cls.NODE_ID, load_codec(codec)
        top, size = max(int(c.max()) for c in codes.chunks), len(decoder.w[CODEBOOK])
        if any(c.shape[0] != decoder.codebooks for c in codes.chunks) or top >= size:
            raise SwiftDiTError(f"{node} · codes: {codes.chunks[0].shape[0]} codebooks of codes up to {top}, for a "
                                f"codec of {decoder.codebooks} codebooks of {size} codes; use the model's own codec")
        rate = decoder.cfg.sample_rate
        with checked(node, "codes"):
            waves = [decoder.decode(c, check=interrupt_check)[0].cpu() for c in codes.chunks]  # [1, S] each
            speech = finish_speech(waves if len(waves) > 1 else waves[0], rate, codes.rms, trim=postprocess)
        return io.NodeOutput({"waveform": speech[None], "sample_rate": rate})


NODES = [OmniVoiceLoader, OmniVoiceText, OmniVoiceReference, OmniVoiceSampler, OmniVoiceDecode]
