"""Run by ComfyUI-Manager after it installs or updates the pack: the first prompt's GPU kernels built once for the
models already in ComfyUI's folders (`swiftdit prebuild`, which builds only on a Hopper GPU with room to spare: about
8 s of a first Z-Image prompt). It never fails the install; what it did not build builds on the first prompt.

    python install.py [COMFYUI_DIR]   (default: the ComfyUI this pack's custom_nodes folder is in)
"""
import os
import subprocess
import sys

PACK = os.path.dirname(os.path.abspath(__file__))


def main(argv):
    comfyui = argv[0] if argv else os.path.dirname(os.path.dirname(PACK))
    if not os.path.isdir(os.path.join(comfyui, "models")):
        print(f"SwiftDiT: no models folder in {comfyui}: no GPU kernels built ahead (they build on the first prompt)")
        return 0
    print("SwiftDiT: building the GPU kernels of the models in ComfyUI's folders, once per machine "
          "(swiftdit prebuild)", flush=True)
    try:
        subprocess.run([sys.executable, "-m", "swiftdit.cli", "prebuild", "--comfyui", comfyui], cwd=PACK,
                       timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"SwiftDiT: kernels not built ahead ({e}); they build on the first prompt")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
