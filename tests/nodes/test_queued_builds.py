"""nodes/queued_builds.py: a queued prompt's DiT loaders start their stand-ins' kernel builds at once (on a CUDA GPU
with room), once a file and linears mode, and the loader takes them; what cannot be read as a loader of ours (links
for values, a file not in the folder list or outside it, a bad mode, several GPUs) starts nothing and leaves the
prompt as it was. The GPU run is bench/bench_graph.py's."""
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file


@pytest.fixture
def queued(swiftdit_pack, tmp_path, monkeypatch):
    """The handler on a ComfyUI 'on a GPU with room' (the builds themselves recorded, not run), a tiny Z-Image file in
    diffusion_models, and a fresh registry."""
    import folder_paths
    from tiny_models import random_z_image, z_image_comfy_layout

    import swiftdit_pack.nodes.queued_builds as q
    from swiftdit_pack.nodes import NODE_CLASSES
    from swiftdit_pack.nodes.family_nodes import DiTLoaderNode
    (tmp_path / "diffusion_models").mkdir()
    folder_paths.add_model_folder_path("diffusion_models", str(tmp_path / "diffusion_models"), is_default=True)
    save_file(z_image_comfy_layout(random_z_image().state_dict()), tmp_path / "diffusion_models" / "zq.safetensors")
    started = []
    monkeypatch.setattr(q, "QUEUED", q.QueuedBuilds())
    monkeypatch.setattr(q, "engine_device", lambda: torch.device("cuda", 0))
    monkeypatch.setattr(q, "fits_on_card", lambda nbytes: True)
    monkeypatch.setattr(q, "beside_dit_load", lambda *args: started.append(args) or f"thread {len(started)}")
    handler = q.on_prompt({c.NODE_ID: c for c in NODE_CLASSES if issubclass(c, DiTLoaderNode)})
    return q, handler, started, str(tmp_path / "diffusion_models" / "zq.safetensors")


def loader(unet_name="zq.safetensors", linears="as stored", **more):
    return {"class_type": "SwiftDiTZImageLoader",
            "inputs": {"unet_name": unet_name, "weight_dtype": "default", "linears": linears, "gpu_budget_gb": 0.0,
                       **more}}


def test_a_queued_loader_starts_its_builds_once_and_its_load_takes_them(queued):
    q, handler, started, path = queued
    body = {"prompt": {"1": loader(), "2": {"class_type": "KSampler", "inputs": {}}}}
    assert handler(body) is body
    handler({"prompt": {"5": loader()}})  # queued again: its kernels are built or building
    (engine, at, linears, device), = started
    assert (engine.__name__, at, linears, device.type) == ("ZImage", path, "stored", "cuda")
    assert q.QUEUED.take(q.build_key(path, "stored")) == "thread 1"
    assert q.QUEUED.take(q.build_key(path, "stored")) is None
    handler({"prompt": {"6": loader(weight_dtype="fp8_e4m3fn")}})  # another mode (int8 at load): its own builds
    assert started[-1][2] == "int8"


def test_what_is_not_a_loader_of_ours_with_values_starts_nothing(queued, monkeypatch):
    q, handler, started, path = queued
    (Path(path).parents[1] / "secret.safetensors").write_bytes(b"")  # beside the folder, reached by ".."
    for node in (loader(unet_name=["9", 0]), loader(unet_name="missing.safetensors"), loader(linears="fp4"),
                 loader(unet_name="../secret.safetensors"),
                 loader(gpus="2"), {"class_type": "SwiftDiTLTX25Loader", "inputs": loader()["inputs"]}):
        assert handler({"prompt": {"1": node}}) == {"prompt": {"1": node}}
    assert handler({"no prompt": 1}) == {"no prompt": 1}
    monkeypatch.setattr(q, "engine_device", lambda: torch.device("cpu"))  # the host path builds nothing
    handler({"prompt": {"1": loader()}})
    assert started == []


def test_a_queued_decoder_of_a_stock_vae_starts_its_norm_builds_once(queued, monkeypatch):
    """Krea 2's VAE Decode makes its decoder from the stock VAE at its own node: its norm kernels build from the
    moment the prompt is queued, once a process, and the decode takes them."""
    import swiftdit_pack.nodes.krea2 as k
    q, _, _, _ = queued
    begun = []
    monkeypatch.setattr(k.qwen_image_vae, "norms_built_ahead", lambda device, dtype: begun.append(device) or "norms")
    handler = q.on_prompt({}, {"SwiftDiTKrea2VAEDecode": k.Krea2VAEDecode})
    body = {"prompt": {"8": {"class_type": "SwiftDiTKrea2VAEDecode", "inputs": {"samples": ["6", 0], "vae": ["7", 0]}}}}
    assert handler(body) is body and handler(body) is body
    assert begun == [torch.device("cuda", 0)]
    assert q.QUEUED.take(k.Krea2VAEDecode.queued_builds(torch.device("cuda", 0))[0]) == "norms"
