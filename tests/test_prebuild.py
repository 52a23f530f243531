"""swiftdit/prebuild.py (`swiftdit prebuild`): each file read as the nodes read it at load (a DiT by its family's
stand-in, a text encoder by its one-layer stand-in), the kernels of their dry steps built, and a run that built
nothing says so and exits non-zero. On the CPU the builds refuse (a Hopper GPU builds them: bench_graph's
--prebuild)."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from tiny_models import (qwen3_comfy_layout, qwen3_vl_layout, random_qwen3, random_qwen3_vl, random_z_image,
                         z_image_comfy_layout)

pytest.importorskip("diffusers")
from dit_core.gpu.builds import Built  # noqa: E402
from swiftdit import prebuild  # noqa: E402


@pytest.fixture(scope="module")
def comfyui(tmp_path_factory):
    """A ComfyUI folder with a Z-Image DiT, a Qwen3 and a Qwen3-VL text encoder in their model folders, and a file of
    neither."""
    root = tmp_path_factory.mktemp("comfyui")
    for folder in ("diffusion_models", "text_encoders", "vae"):
        (root / "models" / folder).mkdir(parents=True)
    save_file(z_image_comfy_layout(random_z_image().state_dict()), root / "models/diffusion_models/z.safetensors")
    save_file(qwen3_comfy_layout(random_qwen3()), root / "models/text_encoders/qwen.safetensors")
    save_file(qwen3_vl_layout(random_qwen3_vl()), root / "models/text_encoders/qwen_vl.safetensors")
    save_file({"x": torch.zeros(2)}, root / "models/text_encoders/other.safetensors")
    save_file({"x": torch.zeros(2)}, root / "models/vae/not_scanned.safetensors")
    (root / "models" / "unet").symlink_to(root / "models" / "diffusion_models")  # read once, not twice
    return root


def test_each_file_read_as_the_nodes_read_it_and_refused_off_a_hopper(comfyui, capsys):
    assert prebuild.main(["--comfyui", str(comfyui)]) == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()  # (the model folders in turn)
    assert lines[0].startswith("z.safetensors (Z-Image DiT): nothing built: not a GPU")
    assert lines[1] == "other.safetensors: not a file whose kernels build ahead (a DiT of Z-Image, FLUX.3 Klein, " \
                       "Krea 2, or a Qwen3 or Qwen3-VL text encoder)"
    assert lines[2].startswith("qwen.safetensors (Qwen3 text encoder): nothing built: not a GPU")
    assert lines[3].startswith("qwen_vl.safetensors (Qwen3-VL text encoder): nothing built: not a GPU")
    assert lines[4].startswith("VAE decoders' norms: nothing built: not a GPU")
    assert "not_scanned" not in out and "nothing done" in err


def test_the_stand_ins_dry_steps_run_and_their_kernels_count(comfyui, monkeypatch, capsys):
    """As on a Hopper GPU: build_ahead runs each file's dry step (here the references of the kernels, on the CPU)."""
    ran = []

    def build_ahead(step, device):
        ran.append(step())
        return Built(3, 0.5, 3)
    monkeypatch.setattr(prebuild, "build_ahead", build_ahead)
    z = comfyui / "models/diffusion_models/z.safetensors"
    assert prebuild.main([str(z), str(comfyui / "models/text_encoders/qwen.safetensors")]) == 0
    out = capsys.readouterr().out
    assert "z.safetensors (Z-Image DiT): 3 kernels ready in 0.50 s" in out and "6 kernels in Triton's cache" in out
    assert ran[0].shape == (1, 4, 128, 128) and ran[1] is None  # the DiT's dry pass at 1024 px; no fused layers here


def test_bad_arguments_say_what_is_wrong(tmp_path, capsys):
    (tmp_path / "model.ckpt").write_bytes(b"")
    assert prebuild.main([str(tmp_path / "model.ckpt")]) == 2
    assert prebuild.main([]) == 2
    err = capsys.readouterr().err
    assert "not a .safetensors file" in err and "no model files" in err


def test_a_file_that_fails_is_said_and_the_next_one_built(comfyui, monkeypatch, capsys):
    monkeypatch.setattr(prebuild, "build_ahead", lambda step, device: Built(2, 0.1, 2))
    real = prebuild.stand_in

    def stand_in(recipe, path, *rest):
        if path.name == "z.safetensors":
            raise RuntimeError("out of memory")
        return real(recipe, path, *rest)
    monkeypatch.setattr(prebuild, "stand_in", stand_in)
    assert prebuild.main([str(comfyui / "models/diffusion_models/z.safetensors"),
                          str(comfyui / "models/text_encoders/qwen.safetensors")]) == 0
    out = capsys.readouterr().out
    assert "z.safetensors: failed: RuntimeError: out of memory" in out
    assert "qwen.safetensors (Qwen3 text encoder): 2 kernels ready" in out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_second_prebuild_finds_every_kernel_in_the_cache(comfyui, tmp_path):
    """On a Hopper GPU: the prebuild fills Triton's cache (a fresh one here), and a new process that builds the same
    stand-ins' kernels (as the nodes' builds beside the loads do) adds nothing to it."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    cubins = lambda: sorted(p.name for p in (tmp_path / "triton").rglob("*.cubin"))  # noqa: E731
    args = [sys.executable, "-m", "swiftdit.cli", "prebuild", "--comfyui", str(comfyui)]
    first = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stdout + first.stderr
    built = cubins()
    assert built and "(Z-Image DiT):" in first.stdout and "(Qwen3 text encoder):" in first.stdout, first.stdout
    again = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True)
    assert again.returncode == 0 and cubins() == built, again.stdout + again.stderr


def test_a_card_without_room_for_a_stand_in_is_left_alone(comfyui, monkeypatch, capsys):
    """A server may be running on the card: a stand-in that may not fit is not loaded."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (2 << 30, 80 << 30))
    done = prebuild.prebuild([comfyui / "models/diffusion_models/z.safetensors"], torch.device("cuda"))
    assert done[0].failed == "the card has 2.0 GiB free, a stand-in may take 8; run it again when it has"


def test_the_install_script_runs_the_prebuild_and_never_fails_the_install(comfyui, tmp_path):
    """install.py (run by ComfyUI-Manager after an install or update): the prebuild of the models in ComfyUI's
    folders, which here (no Hopper GPU) builds nothing and says so; exit 0 all the same, and 0 without a models
    folder."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "install.py"), str(comfyui)], capture_output=True, text=True)
    assert done.returncode == 0 and "z.safetensors (Z-Image DiT): nothing built: not a GPU" in done.stdout, \
        done.stdout + done.stderr
    empty = subprocess.run([sys.executable, str(root / "install.py"), str(tmp_path)], capture_output=True, text=True)
    assert empty.returncode == 0 and "no models folder" in empty.stdout
