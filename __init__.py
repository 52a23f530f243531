"""ComfyUI entry point of SwiftDiT: the V3 extension, exported only where ComfyUI's comfy_api is importable."""
try:
    import comfy_api.latest  # noqa: F401
except ImportError:  # imported outside ComfyUI (tests, tools): the engine needs no entry point
    pass
else:
    from .nodes import comfy_entrypoint

    __all__ = ["comfy_entrypoint"]
