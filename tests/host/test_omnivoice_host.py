"""OmniVoice text to speech and voice clone on a real ComfyUI v0.3.75 server: the shipped workflows
(workflows/omnivoice_tts.json, omnivoice_voice_clone.json) converted with the server's /object_info and run to
SaveAudio's FLAC, LoadAudio reading a reference from the input folder; an error that names node and input, and the
server running the next prompt. A tiny random model folder under the workflows' name in models/omnivoice, as the
loader lists it (model.safetensors and config.json, the tokenizer's files, audio_tokenizer/), from the builders of
tests/families/test_omnivoice.py and test_omnivoice_codec.py, as tests/nodes/test_omnivoice_nodes.py builds it."""

import copy
import json
import shutil
import sys
from pathlib import Path

import pytest
import soundfile
import torch
from safetensors.torch import save_file
from tiny_models import builders, randomize_language_model

from dit_core.families.omnivoice import FRAME_RATE, target_frames
from host.server import ComfyHost, of_type
from swiftdit.workflow_api import to_api

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
COMFYUI_TREE = ROOT / ".cache" / "comfyui-0.3.75"
TIMEOUT = 120.0
MODEL, REFERENCE = "OmniVoice", "voice_reference.wav"  # the names the workflows' loaders ask for
NOT_OMNIVOICE, SHORT_REFERENCE = "not_omnivoice", "short_reference.wav"
CODES, RATE = 32, 24000  # the tiny codec's codes a codebook; its rate, which SaveAudio keeps
# The shipped graphs' nodes (workflows/api/omnivoice_*.json): the same ids in both.
LOADER, TEXT, SAMPLER, SAVE, LOAD_AUDIO, REFERENCE_NODE = "1", "2", "3", "5", "6", "7"
# CI sizes: the workflows ask for 32 steps of a paragraph; two cores get 4 steps of a short sentence (about 2 s
# estimated) and, for the clone, a fixed 2 s.
SENTENCE, RUN_STEPS, CLONE_SECONDS = "Hello there, nice to see you.", 4, 2.0
PAD_S = 0.2  # the finish's padding: 0.1 s at each end


FAMILY = builders("families/test_omnivoice.py")
CODEC = builders("families/test_omnivoice_codec.py")


@pytest.fixture(scope="module")
def omnivoice_models(tmp_path_factory) -> Path:
    """models/omnivoice/OmniVoice/: the tiny model (its codebooks of the tiny codec's 32 codes), the byte-level
    tokenizer, the tiny codec as audio_tokenizer/; beside it a folder laid out alike whose weights are a VAE's."""
    from transformers import Qwen3Config
    root = tmp_path_factory.mktemp("omnivoice_models")
    torch.manual_seed(0)
    cfg = Qwen3Config(**FAMILY.TINY)
    cfg._attn_implementation = "sdpa"
    model = FAMILY.package.OmniVoice(FAMILY.package.OmniVoiceConfig(llm_config=cfg, audio_vocab_size=CODES + 1,
                                                                     audio_mask_id=CODES)).eval()
    randomize_language_model(model).save_pretrained(root / MODEL)
    for name in (MODEL, NOT_OMNIVOICE):
        FAMILY.tokenizer.__wrapped__().save_pretrained(root / name)  # the family test's fixture, built directly
    save_file({"decoder.conv_in.weight": torch.zeros(4, 16, 3, 3)}, root / NOT_OMNIVOICE / "model.safetensors")
    codec = CODEC.folder.__wrapped__(tmp_path_factory)[0]  # the codec test's fixture: audio_tokenizer/ in a folder
    shutil.copytree(codec / "audio_tokenizer", root / NOT_OMNIVOICE / "audio_tokenizer")
    shutil.move(codec / "audio_tokenizer", root / MODEL / "audio_tokenizer")
    return root


@pytest.fixture(scope="module")
def omnivoice_host(tmp_path_factory, omnivoice_models, serving):
    """The server, with the model folder linked and in its input folder for LoadAudio a 2.5 s reference (noise
    bursts with a gap, 16-bit WAV) and a 0.5 s one."""
    server = ComfyHost(COMFYUI_TREE, tmp_path_factory.mktemp("omnivoice_base"), sys.executable)
    server.link_models({"omnivoice": omnivoice_models})
    (server.base / "input").mkdir(parents=True)
    for name, seconds, gaps in ((REFERENCE, 2.5, [(1.2, 0.3)]), (SHORT_REFERENCE, 0.5, [])):
        voice = CODEC.speech_like(1, seconds, gaps)[0].numpy()
        soundfile.write(server.base / "input" / name, voice, RATE, subtype="PCM_16")
    yield from serving(server)


def queued(host: ComfyHost, name: str) -> dict:
    """A shipped workflow as the editor queues it (to_api with the server's /object_info), equal to its API twin."""
    prompt = to_api(json.loads((ROOT / "workflows" / f"{name}.json").read_text()), host.object_info())
    twin = json.loads((ROOT / "workflows" / "api" / f"{name}.json").read_text())
    assert {n: b["inputs"] for n, b in prompt.items()} == {n: b["inputs"] for n, b in twin.items()}
    return prompt


def ci_graph(prompt: dict, **text) -> dict:
    """A copy of a queued graph at CI sizes, the workflow's own values checked first; text: the Text node's
    changes."""
    prompt = copy.deepcopy(prompt)
    sampler = prompt[SAMPLER]["inputs"]
    assert (sampler["steps"], sampler["guidance"], sampler["t_shift"]) == (32, 2, 0.1)
    assert prompt[LOADER]["inputs"]["model_name"] == MODEL and prompt[TEXT]["inputs"]["duration"] == 0
    prompt[TEXT]["inputs"].update(text=SENTENCE, **text)
    sampler["steps"] = RUN_STEPS
    return prompt


def saved_seconds(host: ComfyHost, entry: dict, events: list) -> float:
    """The seconds of SaveAudio's FLAC, which must be in the output folder, mono at the codec's rate, not silent."""
    errors = of_type(events, "execution_error")
    assert entry["status"]["status_str"] == "success", (errors[:1] or entry["status"], host.log_tail())
    [saved] = entry["outputs"][SAVE]["audio"]
    path = host.base / "output" / saved["subfolder"] / saved["filename"]
    assert path.suffix == ".flac" and path.is_file()
    wave, rate = soundfile.read(path, dtype="float32")
    assert rate == RATE and wave.ndim == 1, (rate, wave.shape)
    assert abs(wave).max() > 1e-3, "a silent file: the run or the random model is degenerate"
    return len(wave) / rate


def test_tts_workflow_runs_to_an_audio_file(omnivoice_host):
    """The TTS graph to a FLAC as long as the length rule's estimate for the sentence (its silences trimmed,
    0.1 s padding at each end)."""
    entry, events, seconds = omnivoice_host.run(ci_graph(queued(omnivoice_host, "omnivoice_tts")), TIMEOUT)
    length = saved_seconds(omnivoice_host, entry, events)
    print(f"\nOmniVoice TTS, {RUN_STEPS} steps: {length:.2f} s of speech in {seconds:.1f} s")
    estimate = target_frames(SENTENCE) / FRAME_RATE
    assert 0.5 * estimate <= length <= estimate + PAD_S + 0.01, (length, estimate)


def test_voice_clone_workflow_runs_to_an_audio_file(omnivoice_host):
    """The clone graph (LoadAudio's WAV, the Reference's transcript) at a fixed length to a FLAC."""
    prompt = ci_graph(queued(omnivoice_host, "omnivoice_voice_clone"), duration=CLONE_SECONDS)
    assert prompt[LOAD_AUDIO]["inputs"]["audio"] == REFERENCE
    entry, events, seconds = omnivoice_host.run(prompt, TIMEOUT)
    length = saved_seconds(omnivoice_host, entry, events)
    print(f"\nOmniVoice clone, {RUN_STEPS} steps: {length:.2f} s of speech in {seconds:.1f} s")
    assert 0.5 * CLONE_SECONDS <= length <= CLONE_SECONDS + PAD_S + 0.01, length


# case -> (the node and input changed, its value; the node and input the error names, what it says after them)
BAD_INPUTS = {
    "wrong_folder": (LOADER, "model_name", NOT_OMNIVOICE, LOADER, "model_name",
                     "model.safetensors: not an OmniVoice model"),
    "empty_text": (TEXT, "text", "  ", TEXT, "text", "nothing to say"),
    "short_reference": (LOAD_AUDIO, "audio", SHORT_REFERENCE, REFERENCE_NODE, "audio",
                        "s of voice after trimming silences; at least 1 s"),
    "empty_transcript": (REFERENCE_NODE, "text", "  ", REFERENCE_NODE, "text", "the reference's transcript is empty"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_names_the_node_and_the_input(omnivoice_host, case):
    """A folder of another model, an empty text, a reference too short, a reference without its transcript: the
    prompt ends at the node that says so, naming node and input, and nothing is saved; the server then runs the
    graph as shipped."""
    node, name, value, failing_node, failing_input, says = BAD_INPUTS[case]
    prompt = ci_graph(queued(omnivoice_host, "omnivoice_voice_clone"), duration=CLONE_SECONDS)
    failing = copy.deepcopy(prompt)
    failing[node]["inputs"][name] = value
    omnivoice_host.run_failing(failing, failing_node, failing_input, says, SAVE, TIMEOUT)
    prompt[SAVE]["inputs"]["filename_prefix"] = f"audio/after_{case}"
    entry, events, _ = omnivoice_host.run(prompt, TIMEOUT)
    saved_seconds(omnivoice_host, entry, events)


def test_cancel_ends_the_sampler_and_the_server_stays_usable(omnivoice_host):
    """Cancel at the sampler's second step of 200 (10 s of speech): the prompt ends interrupted at the sampler, its
    last step never reached and nothing saved; then the next prompt runs."""
    prompt = ci_graph(queued(omnivoice_host, "omnivoice_tts"), duration=10.0)
    prompt[SAMPLER]["inputs"]["steps"] = 200
    prompt[SAVE]["inputs"]["filename_prefix"] = "audio/cancelled"
    prompt_id, events, latency = omnivoice_host.run_cancelled_at_step(prompt, SAMPLER, 2, TIMEOUT)
    steps = [data["value"] for data in of_type(events, "progress", node=SAMPLER)]
    print(f"\ncancel: interrupted {latency:.2f} s after Cancel, at step {steps[-1]} of 200")
    assert steps[-1] < 200 and latency < 5
    assert not omnivoice_host.wait(prompt_id, 30)["outputs"].get(SAVE)
    entry, events, _ = omnivoice_host.run(ci_graph(queued(omnivoice_host, "omnivoice_tts")), TIMEOUT)
    saved_seconds(omnivoice_host, entry, events)
