"""The Triton kernels a 16-32 GB consumer card runs, built for those cards on this GPU-less host: Ampere (sm_86), Ada
(sm_89) and Blackwell (sm_120). Those cards have no Gluon path and no TMA, so the INT8 linears there are
kernels/int8/linear.py's and kernels/int8/qkv_rope_linear.py's, autotuned over int8_tiles.candidate_tiles' pointer-load
tiles, beside the quantizer's two passes.

Each case goes through the whole build: Triton's frontend, LLVM and the wheel's ptxas for that card. A build error
would leave the card with nothing to run, while a tile past the card's shared memory is only skipped by the
autotuner. So every case must build, and every form must have a tile within the card's 99 KB a block. The builds
run in a child Python, because the tests' interpreter mode replaces triton.jit.
"""
import json
import os
import subprocess
import sys

import pytest

CARDS = {"sm_86": 86, "sm_89": 89, "sm_120": 120}
SHARED_PER_BLOCK = 99 * 1024  # sm_86, sm_89 and sm_120: 100 KB an SM, 99 KB a block
TOO_LARGE = "a Hopper ring (must not fit)"


def pointer_tiles(gated: bool) -> list:
    """The autotuner's tiles without TMA (what these cards are offered), as launches."""
    from kernels.int8.tiles import candidate_tiles, launch_of
    return [launch_of(tile) for tile in candidate_tiles(gated) if not tile.kwargs["TMA"]]


def consumer_cases() -> dict:
    """name -> (form label, kernel, signature, constants, launch): every pointer-load tile of each INT8 linear form
    and the fused QKV (whole heads of 128), and the quantizer passes at their default launches."""
    from sm90_builds import CODES, FORMS, linear_case, qkv_rope_case, rotate_case, turned_case
    cases = {}
    for form, one in ((0, False), (1, True), (1, False), (2, False)):
        label = f"int8_linear {FORMS[form]}" + (" one gate row" if one else " (gathered)" if form == 1 else "")
        for tile in pointer_tiles(gated=form == 1):
            cases[f"{label} {tile}"] = (label, *linear_case(form, one, tile))
            if form == 2 and tile["BLOCK_N"] % 128 == 0:  # rows turned: whole 64 of them a tile (int8_linear's check)
                kernel, signature, constants, launch = linear_case(form, one, tile)
                cases[f"{label}, rows turned {tile}"] = (f"{label}, rows turned", kernel, signature,
                                                         {**constants, "TURN": True}, launch)
    for turn_v in (False, True):
        qkv = qkv_rope_case(False, turn_v)
        for tile in pointer_tiles(gated=False):
            if tile["BLOCK_N"] % 128 == 0:  # whole heads of 128 (qkv_rope_linear's pruning)
                launch = {k: tile.pop(k) for k in ("num_warps", "num_stages")}
                label = "qkv_rope, v turned" if turn_v else "qkv_rope"
                cases[f"{label} {tile}"] = (label, qkv[0], qkv[1], {**qkv[2], **tile}, launch)
    for norm, has_scale, act in ((2, 1, 0), (1, 2, 0), (0, 0, 0), (0, 0, 1)):
        name = f"rotate norm {norm} modulation {has_scale} act {act}"
        cases[name] = (name, *rotate_case(norm, has_scale, act, num_stages=3 if norm == act == 0 else 2))
    from kernels.int8.codes import _codes_kernel
    cases["codes"] = ("codes", _codes_kernel, CODES, {"GROUPS": 15, "GROUPS_P2": 16, "BLOCK_M": 16, "BLOCK_K": 256,
                                                      "LAST_FIRST": True}, {"num_warps": 4})
    cases["turned codes"] = ("turned codes", *turned_case())
    cases["plain codes in one pass"] = ("plain codes in one pass", *turned_case(turned=False))
    for span in (1, 128):  # the attention gates: Krea 2's (a value a feature), LTX-2.5's (a value a head)
        cases[f"rotate gated {span}"] = (f"rotate gated {span}", *rotate_case(0, 0, 0, gate_span=span))
        cases[f"gated codes in one pass {span}"] = (f"gated codes in one pass {span}",
                                                   *turned_case(6144, turned=False, gate_span=span))
    # A Hopper-sized ring (5 x 48 KB), to show the shared memory read is the build's: it must not fit these cards.
    cases[TOO_LARGE] = (TOO_LARGE, *linear_case(0, False, {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128,
                                                           "GROUP_M": 8, "num_warps": 8, "num_stages": 5}))
    return cases


def build_for(capability: int) -> dict:
    """case -> [form label, shared bytes] or [form label, the build's error], for one card (a child's work). The
    launches' divisibility as triton.jit specializes them there (sm90_builds.launch_divisibility), so that the
    loads vectorize and pipeline as they will."""
    import triton
    from sm90_builds import launch_divisibility
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    results = {}
    for name, (label, kernel, signature, constants, launch) in consumer_cases().items():
        source = ASTSource(kernel, {**signature, **{c: "constexpr" for c in constants}}, constants,
                           launch_divisibility(kernel, signature))
        try:
            built = triton.compile(source, target=GPUTarget("cuda", capability, 32),
                                   options={**launch, "enable_fp_fusion": False})
            results[name] = [label, built.metadata.shared]
        except Exception as e:  # noqa: BLE001 - the test names what failed
            results[name] = [label, f"{type(e).__name__}: {(str(e).strip() or '-').splitlines()[-1]}"]
    return results


@pytest.fixture(scope="module")
def built() -> dict:
    """card -> its child's results; the three cards build side by side."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    from conftest import compiler_env  # (not at the top: the child runs this file with Triton compiling)
    env = compiler_env()
    children = {card: subprocess.Popen([sys.executable, __file__, str(capability)], env=env, text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                for card, capability in CARDS.items()}
    results = {}
    for card, child in children.items():
        out, err = child.communicate(timeout=1800)
        assert child.returncode == 0, (card, err[-3000:])
        results[card] = json.loads(out.splitlines()[-1])
    return results


def test_every_kernel_builds_for_the_consumer_cards(built):
    assert set(built) == set(CARDS)
    for card, cases in built.items():
        failed = {name: why for name, (_, why) in cases.items() if isinstance(why, str)}
        assert not failed, (card, failed)
        assert len(cases) > 20, card  # every form's tiles, the fused QKV's, the quantizer's passes


def test_each_form_has_a_tile_within_the_cards_shared_memory(built):
    for card, cases in built.items():
        best = {}
        for label, shared in cases.values():
            best[label] = min(best.get(label, shared), shared)
        assert best.pop(TOO_LARGE) > SHARED_PER_BLOCK, card  # the check can fail
        too_large = {label: shared for label, shared in best.items() if shared > SHARED_PER_BLOCK}
        assert not too_large, (card, too_large)


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)
    print(json.dumps(build_for(int(sys.argv[1]))))
