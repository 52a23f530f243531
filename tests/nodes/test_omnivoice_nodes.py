"""The OmniVoice nodes run in-process on ComfyUI v0.3.75's modules (no server): schemas, the graph text -> sampler ->
decode against the engine called directly (with and without a voice reference; a long text's pieces joined),
errors naming node and input, and cancel between steps. A tiny random model folder as published (model.safetensors
and config.json by the package's save_pretrained, the tokenizer's files, audio_tokenizer/) from the builders of
tests/families/test_omnivoice.py and test_omnivoice_codec.py; the model's codebooks hold the tiny codec's 32 codes."""
import shutil

import pytest
import torch
from node_contract import assert_schemas_follow, run
from safetensors.torch import save_file
from tiny_models import builders, randomize_language_model

FOLDER, CODES, RATE = "OmniVoice-tiny", 32, 24000
TEXT = "Hello there [laughter], nice to see you."


FAMILY = builders("families/test_omnivoice.py")
CODEC = builders("families/test_omnivoice_codec.py")


def tiny_tokenizer():
    return FAMILY.tokenizer.__wrapped__()  # the family test's fixture, built directly


@pytest.fixture(scope="module", autouse=True)
def plain_convs():
    """oneDNN builds its convs anew for every length (0.5 to 0.9 s each here); both sides of every comparison run
    the same plain convs instead."""
    enabled = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    yield
    torch.backends.mkldnn.enabled = enabled


@pytest.fixture(scope="module")
def pack(swiftdit_pack):
    import swiftdit_pack.nodes.omnivoice as o
    yield o
    from swiftdit_pack.nodes.memory import LOADED
    LOADED.free()  # the codec's slot is OmniVoice's alone: later tests count the models they load


@pytest.fixture(scope="module")
def models(pack, tmp_path_factory):
    """models/omnivoice/: the tiny model folder, one whose weights are not OmniVoice's, one without its codec."""
    import folder_paths
    from transformers import Qwen3Config
    root = tmp_path_factory.mktemp("models") / "omnivoice"
    torch.manual_seed(0)
    cfg = Qwen3Config(**FAMILY.TINY)
    cfg._attn_implementation = "sdpa"
    model = FAMILY.package.OmniVoice(FAMILY.package.OmniVoiceConfig(llm_config=cfg, audio_vocab_size=CODES + 1,
                                                                     audio_mask_id=CODES)).eval()
    randomize_language_model(model).save_pretrained(root / FOLDER)
    for name in (FOLDER, "not_omnivoice", "no_codec"):
        tiny_tokenizer().save_pretrained(root / name)
    shutil.copy(root / FOLDER / "model.safetensors", root / "no_codec" / "model.safetensors")
    save_file({"decoder.conv_in.weight": torch.zeros(4, 16, 3, 3)}, root / "not_omnivoice" / "model.safetensors")
    codec = CODEC.folder.__wrapped__(tmp_path_factory)[0]  # the codec test's fixture: audio_tokenizer/ in a folder
    shutil.copytree(codec / "audio_tokenizer", root / "not_omnivoice" / "audio_tokenizer")
    shutil.move(codec / "audio_tokenizer", root / FOLDER / "audio_tokenizer")
    folder_paths.add_model_folder_path("omnivoice", str(root), is_default=True)
    return root / FOLDER


CONTRACT = {
    "SwiftDiTOmniVoiceLoader": (["model_name"], ["SWIFTDIT_MODEL", "SWIFTDIT_AUDIO_CODEC"]),
    "SwiftDiTOmniVoiceText": (["text", "language", "instruct", "speed", "duration"], "SWIFTDIT_OMNIVOICE_TEXT"),
    "SwiftDiTOmniVoiceReference": (["codec", "audio", "text", "preprocess"], "SWIFTDIT_OMNIVOICE_VOICE"),
    "SwiftDiTOmniVoiceSampler": (["model", "text", "voice", "seed", "steps", "guidance", "t_shift", "layer_penalty",
                                  "position_temperature", "class_temperature"], "SWIFTDIT_AUDIO_CODES"),
    "SwiftDiTOmniVoiceDecode": (["codes", "codec", "postprocess"], "AUDIO"),
}


def test_schemas_follow_the_contract(pack, models):
    assert_schemas_follow(pack.NODES, CONTRACT, "SwiftDiT/OmniVoice")
    sampler = {i.id: getattr(i, "default", None) for i in pack.OmniVoiceSampler.GET_SCHEMA().inputs}
    assert (sampler["steps"], sampler["guidance"], sampler["t_shift"], sampler["position_temperature"],
            sampler["class_temperature"]) == (32, 2.0, 0.1, 5.0, 0.0)  # OmniVoiceGenerationConfig's
    loader = pack.OmniVoiceLoader.GET_SCHEMA().inputs[0]
    assert loader.options == ["OmniVoice-tiny", "not_omnivoice"]  # with their codec; not the codec's own folder


def graph(o, text=TEXT, voice=None, seed=3, steps=3, **request):
    model, codec = run(o.OmniVoiceLoader, model_name=FOLDER)
    (req,) = run(o.OmniVoiceText, text=text, **{"language": "en", "instruct": "female", "speed": 1.0,
                                                "duration": 0.0, **request})
    (codes,) = run(o.OmniVoiceSampler, model=model, text=req, voice=voice, seed=seed, steps=steps, guidance=2.0,
                   t_shift=0.1, layer_penalty=5.0, position_temperature=5.0, class_temperature=0.0)
    (audio,) = run(o.OmniVoiceDecode, codes=codes, codec=codec, postprocess=True)
    return codes, audio


def engine(folder, item, seed=3, steps=3, ref_rms=None):
    """The engine called directly: speech_codes, the codec's decode of each piece, the package's finish."""
    from dit_core.codecs.higgs_audio import HiggsAudioCodec
    from dit_core.codecs.omnivoice_audio import finish_speech
    from dit_core.families.omnivoice import OmniVoice, speech_codes
    from dit_core.sampling.omnivoice import Unmasking
    chunks = speech_codes(OmniVoice.load(folder), tiny_tokenizer(), [item], Unmasking(steps=steps), seed)[0]
    codec = HiggsAudioCodec.load(folder)
    waves = [codec.decode(c)[0] for c in chunks]
    return chunks, finish_speech(waves if len(waves) > 1 else waves[0], RATE, ref_rms)


def assert_same(codes, audio, chunks, wave):
    assert len(codes.chunks) == len(chunks) and all(torch.equal(a, b) for a, b in zip(codes.chunks, chunks))
    assert audio["sample_rate"] == RATE and audio["waveform"].shape == (1, *wave.shape)
    assert torch.equal(audio["waveform"][0], wave)


def test_tts_graph_equals_the_engine(pack, models):
    from dit_core.families.omnivoice import Speech
    codes, audio = graph(pack)
    chunks, wave = engine(models, Speech(TEXT, "en", "female"))
    assert_same(codes, audio, chunks, wave)
    assert codes.rms is None and len(chunks) == 1 and (chunks[0] < CODES).all()
    assert not torch.equal(graph(pack, seed=4)[0].chunks[0], chunks[0])  # the seed is used
    fixed, _ = graph(pack, duration=2.5, speed=1.7)  # a fixed length: 62 frames, speed unused
    assert fixed.chunks[0].shape == (8, 62)
    assert torch.equal(fixed.chunks[0], engine(models, Speech(TEXT, "en", "female", speed=1.7, frames=62))[0][0])


def test_voice_clone_graph_equals_the_engine(pack, models):
    """A stereo 16 kHz reference with silences: prepared, encoded, its transcript punctuated; the speech in its
    voice, matched to its loudness."""
    from dit_core.codecs.higgs_audio import HiggsAudioCodec
    from dit_core.codecs.omnivoice_audio import prepare_reference
    from dit_core.families.omnivoice import Speech
    left, right = (CODEC.speech_like(seed, 2.5, [(0.2, 0.5), (1.5, 0.3)], 0.05) for seed in (1, 2))
    n = min(left.shape[-1], right.shape[-1])
    recording = torch.cat([left[:, :n], right[:, :n]])
    _, codec = run(pack.OmniVoiceLoader, model_name=FOLDER)
    (voice,) = run(pack.OmniVoiceReference, codec=codec, audio={"waveform": recording[None], "sample_rate": 16000},
                   text=" Ref said", preprocess=True)
    prepared, rms = prepare_reference(recording, 16000, RATE, 960)
    assert voice.text == "Ref said." and voice.rms == rms and rms < 0.1  # a quiet one: the decode scales it down
    assert torch.equal(voice.codes, HiggsAudioCodec.load(models).encode(prepared[None])[0])
    codes, audio = graph(pack, voice=voice)
    assert codes.rms == rms
    assert_same(codes, audio, *engine(models, Speech(TEXT, "en", "female", voice.text, voice.codes), ref_rms=rms))


def test_decode_joins_pieces(pack, models):
    """A long text's pieces (the sampler's chunks of about 15 s): each decoded, cross-faded, finished as one."""
    from dit_core.codecs.higgs_audio import HiggsAudioCodec
    from dit_core.codecs.omnivoice_audio import finish_speech
    g = torch.Generator().manual_seed(5)
    chunks = tuple(torch.randint(0, CODES, (8, n), generator=g) for n in (30, 45))
    _, codec = run(pack.OmniVoiceLoader, model_name=FOLDER)
    (audio,) = run(pack.OmniVoiceDecode, codes=pack.Codes(chunks, 0.05), codec=codec, postprocess=False)
    decoder = HiggsAudioCodec.load(models)
    want = finish_speech([decoder.decode(c)[0] for c in chunks], RATE, 0.05, trim=False)
    assert audio["waveform"].shape == (1, *want.shape) and torch.equal(audio["waveform"][0], want)


def test_errors_name_node_and_input(pack, models):
    from swiftdit_pack.nodes.base import ModelHandle, SwiftDiTError
    for name, message in [("not_omnivoice", "model_name: model.safetensors: not an OmniVoice model"),
                          ("no_codec", "model_name: 'no_codec' is not a folder with model.safetensors and "
                                       "audio_tokenizer/"),
                          ("elsewhere", "model_name: 'elsewhere' is not a folder")]:
        with pytest.raises(SwiftDiTError, match=f"SwiftDiTOmniVoiceLoader · {message}"):
            run(pack.OmniVoiceLoader, model_name=name)
    for damaged in ("config.json", "audio_tokenizer/config.json"):  # a folder's JSON that cannot be read
        folder = models.parent / "damaged"
        shutil.copytree(models, folder)
        try:
            (folder / damaged).write_bytes(b"\xff not JSON")
            with pytest.raises(SwiftDiTError, match="SwiftDiTOmniVoiceLoader · model_name: damaged: a file of the "
                                                    "folder cannot be read .*download the folder again"):
                run(pack.OmniVoiceLoader, model_name="damaged")
        finally:
            shutil.rmtree(folder)
    text = dict(text=TEXT, language="", instruct="", speed=1.0, duration=0.0)
    for change, message in [({"text": "  "}, "text: nothing to say"),
                            ({"text": "a b c d e f g " * 60}, "text: 'a b c .*runs about 36 s without a split mark"),
                            ({"speed": float("nan")}, "speed: must be a finite number")]:
        with pytest.raises(SwiftDiTError, match=f"SwiftDiTOmniVoiceText · {message}"):
            run(pack.OmniVoiceText, **{**text, **change})
    model, codec = run(pack.OmniVoiceLoader, model_name=FOLDER)
    voice = CODEC.speech_like(3, 2.0, [])
    reference = dict(codec=codec, audio={"waveform": voice[None], "sample_rate": RATE}, text="Ref said.",
                     preprocess=True)
    for change, message in [({"audio": {"waveform": torch.zeros(1, 1, 0), "sample_rate": RATE}}, "audio: an empty"),
                            ({"audio": {"waveform": voice[None, :, :12000], "sample_rate": RATE}},
                             "audio: 0.48 s of voice after trimming silences; at least 1 s"),
                            ({"audio": {"waveform": torch.zeros(1, 1, 48000), "sample_rate": RATE}},
                             "audio: reference audio: nothing is left after silence removal"),
                            ({"text": " "}, "text: the reference's transcript is empty")]:
        with pytest.raises(SwiftDiTError, match=f"SwiftDiTOmniVoiceReference · {message}"):
            run(pack.OmniVoiceReference, **{**reference, **change})
    (req,) = run(pack.OmniVoiceText, **text)
    sampler = dict(model=model, text=req, seed=0, steps=1, guidance=2.0, t_shift=0.1, layer_penalty=5.0,
                   position_temperature=5.0, class_temperature=0.0)
    for change, message in [({"model": ModelHandle("z_image", model.path, "stored")}, "model: a z_image model"),
                            ({"t_shift": 0.0}, "t_shift: must be a finite number in \\[0.01, 10\\]"),
                            ({"guidance": float("inf")}, "guidance: must be a finite number")]:
        with pytest.raises(SwiftDiTError, match=f"SwiftDiTOmniVoiceSampler · {message}"):
            run(pack.OmniVoiceSampler, **{**sampler, **change})
    foreign = pack.Codes((torch.full((8, 5), CODES),), None)  # a code past the codec's 32
    with pytest.raises(SwiftDiTError, match="SwiftDiTOmniVoiceDecode · codes: 8 codebooks of codes up to 32, "
                                            "for a codec of 8 codebooks of 32 codes"):
        run(pack.OmniVoiceDecode, codes=foreign, codec=codec, postprocess=True)


def test_cancel_between_steps(pack, models, monkeypatch):
    """Cancel during the first step: the sampler stops before the second forward, and runs again after."""
    import comfy.model_management
    from swiftdit_pack.dit_core.families.omnivoice import OmniVoice
    forwards, target_logits = [], OmniVoice.target_logits

    def counted(self, *args, **kwargs):
        forwards.append(1)
        comfy.model_management.interrupt_current_processing(True)  # Cancel, during the step
        return target_logits(self, *args, **kwargs)
    monkeypatch.setattr(OmniVoice, "target_logits", counted)
    try:
        with pytest.raises(comfy.model_management.InterruptProcessingException):
            graph(pack, steps=4)
    finally:
        comfy.model_management.interrupt_current_processing(False)
    assert forwards == [1]
    monkeypatch.undo()
    graph(pack, steps=2)  # usable after
