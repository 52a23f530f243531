"""ComfyUI test-host launcher: `python host/run_comfy.py ROOT [comfy flags]` runs ROOT/main.py as __main__."""

import importlib.abc
import importlib.util
import os
import runpy
import sys

# The torch.library.Library that owns the shim's op schemas: it must live as long as the process.
_TORCHVISION_LIB = None


class TorchvisionOpsShim(importlib.abc.MetaPathFinder):
    """On the first `import torchvision`, make sure the ops its fake registrations name exist.

    The torchvision 0.28.0 wheel we can get is a CUDA build: its _C.so does not load next to CPU torch, and
    torchvision/_meta_registrations.py then fails with "operator torchvision::nms does not exist", which stops
    ComfyUI at comfy.sd (reference/comfyui_host.md section 3). Acting lazily, on the first import only, keeps
    torch unimported until main.py has set its environment ("Torch already imported" otherwise).
    """

    def find_spec(self, name, path=None, target=None):
        global _TORCHVISION_LIB
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)  # one-shot
        import torch

        spec = importlib.util.find_spec("torchvision")
        try:
            torch.ops.load_library(os.path.join(spec.submodule_search_locations[0], "_C.so"))
        except Exception:
            if _TORCHVISION_LIB is not None:  # another shim of this process defined them already
                return spec
            _TORCHVISION_LIB = torch.library.Library("torchvision", "DEF")
            for op in ("nms", "qnms"):
                _TORCHVISION_LIB.define(
                    op + "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
                )
        return spec


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: run_comfy.py COMFYUI_ROOT [comfy flags...]")
    root = os.path.abspath(argv[0])
    if not os.path.isfile(os.path.join(root, "main.py")):
        raise SystemExit(f"run_comfy.py: {root} has no main.py; unpack ComfyUI there (tests/comfyui_tree.py)")
    if os.environ.get("SWIFTDIT_STACKS"):
        from stack_sampler import StackSampler  # (host/ is sys.path[0] until below)
        StackSampler(os.path.join(os.environ["SWIFTDIT_STACKS"], f"stacks_{os.getpid()}.txt")).start()
    sys.meta_path.insert(0, TorchvisionOpsShim())
    sys.argv = [os.path.join(root, "main.py"), *argv[1:]]
    os.chdir(root)
    # The script's own folder (host/) is sys.path[0]; ComfyUI's top-level `server` module must not meet ours.
    sys.path[0] = root
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
