"""A family's model in the ranks of a RankPool standing in for it where the samplers run it (dit_core/parallel
ranked.py, the loaders' `gpus` option): tiny MiniMax H3 and LTX-2.5 sampled on 2 gloo ranks give the one-process
latents within float32 rounding; attribute reads; Cancel; a rank's failure; the ranks started from a package named as
ComfyUI names a custom node's (its folder's path) under a __main__ that must not be imported again."""
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import rel_err
from tiny_models import MINIMAX_H3_TINY, minimax_h3_file

from dit_core.families.minimax_h3 import MiniMaxH3
from dit_core.parallel import RankedModel, RankFailed
from dit_core.sampling.minimax_h3 import sample_t2va

ROOT = Path(__file__).resolve().parents[2]
FRAMES, LH, LW, NA, NT = 3, 4, 6, 5, 6
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def h3_file(tmp_path_factory):
    pytest.importorskip("diffusers")
    return minimax_h3_file(tmp_path_factory.mktemp("h3_ranked"))


@pytest.fixture(scope="module")
def h3_ranked(h3_file):
    model = RankedModel.start(2, MiniMaxH3.load, h3_file, MiniMaxH3, CPU)
    yield model
    model.close()


def text_features():
    return torch.randn(1, NT, MINIMAX_H3_TINY["text_dim"], generator=torch.Generator().manual_seed(7))


def test_h3_sampling_on_two_ranks_gives_the_one_process_latents(h3_file, h3_ranked):
    """ComfyUI's way (res_multistep on the shifted grid, a first-frame keyframe's condition rows): the sampler here,
    each forward's blocks on the two ranks."""
    model = MiniMaxH3.load(h3_file)
    first = torch.randn(1, MINIMAX_H3_TINY["in_channels"], 1, LH, LW, generator=torch.Generator().manual_seed(2))
    run = lambda m, **kw: sample_t2va(m, text_features(), FRAMES, LH, LW, NA, 2, seed=5,  # noqa: E731
                                      sampler="res_multistep", keyframes=(("first", first),), **kw)
    want, steps = run(model), []
    got = run(h3_ranked, callback=lambda i, n, x, x0: steps.append(i))
    assert steps == [1, 2]
    assert all(rel_err(g, w) <= 1e-5 for g, w in zip(got, want)), [rel_err(g, w) for g, w in zip(got, want)]
    assert h3_ranked.arch == model.arch and h3_ranked.audio_in.in_features == model.audio_in.in_features
    assert h3_ranked.world == 2 and h3_ranked.alive and h3_ranked.device == CPU


def test_cancel_stops_the_ranks_within_a_step_and_keeps_them(h3_ranked):
    """The sampler's check (ComfyUI's interrupt) is called here while the ranks work; the ranks stop at one block
    and the model goes on."""
    class Interrupted(Exception):
        pass

    def interrupt():
        raise Interrupted

    with pytest.raises(Interrupted):
        sample_t2va(h3_ranked, text_features(), FRAMES, LH, LW, NA, 2, seed=5, sampler="euler", check=interrupt)
    assert h3_ranked.alive
    sample_t2va(h3_ranked, text_features(), FRAMES, LH, LW, NA, 1, seed=5, sampler="euler")


def test_a_file_that_fails_in_the_ranks_is_reported_and_stops_them(tmp_path):
    from safetensors.torch import save_file
    bad = tmp_path / "not_h3.safetensors"
    save_file({"w": torch.zeros(2)}, bad)
    with pytest.raises(RankFailed, match=r"rank \d of 2 failed: WeightsError"):
        RankedModel.start(2, MiniMaxH3.load, bad, MiniMaxH3, CPU)


def one_head(path) -> MiniMaxH3:
    """The tiny H3 as a model of one head (for the refusal below; never run)."""
    model = MiniMaxH3.load(path)
    return replace(model, arch=replace(model.arch, heads=1, head=model.arch.heads * model.arch.head))


def test_fewer_heads_than_ranks_are_refused_at_load(h3_file):
    from dit_core.parallel import RanksDoNotFit
    with pytest.raises(RanksDoNotFit, match="1 heads are fewer than the ranks; use 1 GPUs or fewer"):
        RankedModel.start(2, one_head, h3_file, MiniMaxH3, CPU)


def test_a_step_that_fails_in_a_rank_closes_the_model(h3_file):
    model = RankedModel.start(2, MiniMaxH3.load, h3_file, MiniMaxH3, CPU)
    with pytest.raises(RankFailed, match=r"rank \d of 2 failed: ValueError"):
        model.text_rows(torch.zeros(3, 5))  # text rows of the wrong width
    assert not model.alive
    with pytest.raises(RuntimeError, match="closed"):
        model.text_rows(text_features()[0])


def test_ltx25_stage_on_two_ranks_gives_the_one_process_latents(tmp_path):
    pytest.importorskip("diffusers")
    from safetensors.torch import save_file
    from tiny_models import ltx25_comfy_layout, random_ltx25

    from dit_core.families.ltx25 import LTX25
    from dit_core.sampling.ltx25 import Prompt, Stage, packed_model, sample_stage
    path = tmp_path / "ltx25.safetensors"
    save_file(ltx25_comfy_layout(random_ltx25()), path)
    g = torch.Generator().manual_seed(4)
    video, audio = torch.randn(1, 8, 2, 2, 3, generator=g), torch.randn(1, 2, 5, 4, generator=g)
    prompt = Prompt(torch.randn(4, 32, generator=g), torch.randn(4, 16, generator=g))
    stage = Stage(torch.tensor([1.0, 0.7, 0.3, 0.0]), seed=9)

    def run(model):
        net = packed_model(model, [video.shape, audio.shape], 24.0, video_mask=torch.tensor([0.0, 1.0]))
        return sample_stage(net, video, audio, stage, prompt)

    want = run(LTX25.load(path))
    with RankedModel.start(2, LTX25.load, path, LTX25, CPU) as ranked:
        assert ranked.video.proj_in.in_features == 8
        got = run(ranked)
    assert all(rel_err(g, w) <= 1e-5 for g, w in zip(got, want)), [rel_err(g, w) for g, w in zip(got, want)]


def test_ranks_start_from_a_package_named_as_comfyui_names_custom_nodes(h3_file, tmp_path):
    """ComfyUI imports a custom node's package under its folder's path as the name, and runs from its main.py: the
    ranks import the engine from the package's folder without its __init__ and never run that main."""
    main = tmp_path / "main.py"
    main.write_text(textwrap.dedent(f"""
        import importlib.util, sys, torch
        if __name__ != "__main__":
            raise SystemExit("the parent's main ran in a rank")
        name = {str(ROOT)!r}.replace(".", "_x_")
        spec = importlib.util.spec_from_file_location(name, {str(ROOT / "__init__.py")!r})
        pack = importlib.util.module_from_spec(spec)
        sys.modules[name] = pack
        spec.loader.exec_module(pack)
        ranked = importlib.import_module(name + ".dit_core.parallel.ranked")
        h3 = importlib.import_module(name + ".dit_core.families.minimax_h3")
        model = ranked.RankedModel.start(2, h3.MiniMaxH3.load, {str(h3_file)!r}, h3.MiniMaxH3, torch.device("cpu"))
        rows = model.text_rows(torch.ones({NT}, {MINIMAX_H3_TINY["text_dim"]}))
        model.close()
        print("rows", tuple(rows.shape))
    """))
    done = subprocess.run([sys.executable, str(main)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and "rows (6, " in done.stdout, done.stderr[-2000:]
