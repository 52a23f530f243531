"""Our wire types: engine models travel on their own types, so a stock node is never handed one by mistake."""
from comfy_api.latest import io

# A ModelHandle (nodes/base.py): family, file, how its linears run, LoRAs, sampling shift.
DiTModel = io.Custom("SWIFTDIT_MODEL")
# A FileHandle of kind "text": a text encoder file; its tokenizer is ComfyUI's own.
TextEncoder = io.Custom("SWIFTDIT_TEXT_ENCODER")
# A FileHandle of kind "vae": a VAE file.
Vae = io.Custom("SWIFTDIT_VAE")
# A FileHandle of kind "latent_upscale": a latent upscale model file (LTX-2.5's x2 spatial upsampler).
LatentUpscaleModel = io.Custom("SWIFTDIT_LATENT_UPSCALE_MODEL")
