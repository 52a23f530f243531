"""The pack's import rules (layout.md section 2, issue 33): no import circle between the pack's modules; dit_core
reaches kernels/ through one place (dit_core/gpu/block.py's kernels()); the host (reference) path imports nothing
from dit_core/gpu/ when it loads; the engine never imports ComfyUI."""
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dit_core", "kernels", "nodes", "swiftdit")
KERNELS_DOOR = "dit_core.gpu.block"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def _walk_run_time(node):
    """ast.walk without the bodies of `if TYPE_CHECKING:` (imports for annotations only, never run)."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not (isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING"):
            yield from _walk_run_time(child)


def _imports(name: str, path: Path, module_level_only: bool) -> set[str]:
    """The pack's modules `name` imports (`from a import b` counts b when b is a module of the pack)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = tree.body if module_level_only else list(_walk_run_time(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    modules = _modules()
    return {m for m in found if m in modules and m != name}


def test_no_import_circle():
    """Every import, at module level or inside a function: a lazy import in a circle is still a circle."""
    modules = _modules()
    graph = {name: _imports(name, path, module_level_only=False) for name, path in modules.items()}
    # A package's __init__ importing its own submodules is how a package exports them, not a circle.
    graph = {name: {m for m in deps if not m.startswith(name + ".")} for name, deps in graph.items()}
    state, circles = {}, []

    def visit(name, stack):
        state[name] = "open"
        for dep in sorted(graph[name]):
            if state.get(dep) == "open":
                circles.append(" -> ".join([*stack[stack.index(dep):], dep]))
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_dit_core_reaches_kernels_through_one_place():
    openers = []
    for name, path in _modules().items():
        if not name.startswith("dit_core"):
            continue
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[-1] == "kernels":
                openers.append(name)
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "kernels" for a in node.names):
                openers.append(name)
        if "import_module" in text and "kernels" in text:
            openers.append(name)
    assert set(openers) <= {KERNELS_DOOR}, f"dit_core modules that open kernels/ themselves: {sorted(set(openers))}"


def test_host_modules_import_nothing_from_gpu_at_load():
    """Statically (module level) and by loading every host room in a fresh interpreter."""
    offenders = sorted(
        f"{name} -> {dep}" for name, path in _modules().items()
        if name.startswith("dit_core") and not name.startswith("dit_core.gpu")
        for dep in _imports(name, path, module_level_only=True) if dep.startswith("dit_core.gpu"))
    assert not offenders, "host modules importing dit_core.gpu at load:\n" + "\n".join(offenders)
    rooms = [n for n in _modules() if n.startswith("dit_core") and not n.startswith("dit_core.gpu")]
    code = ("import importlib, importlib.machinery, sys, types\n"
            # conftest's shim: the CUDA torchvision wheel beside CPU torch, which transformers imports
            "from host.run_comfy import TorchvisionOpsShim\n"
            "sys.meta_path.insert(0, TorchvisionOpsShim())\n"
            # transformers imports a top-level `kernels` (the Hub's kernels library) to probe for it, which from this
            # folder finds ours: a stand-in answers that probe, and no kernels.* module may load behind it
            "stand_in = types.ModuleType('kernels')\n"
            "stand_in.__spec__ = importlib.machinery.ModuleSpec('kernels', None)\n"
            "sys.modules['kernels'] = stand_in\n"
            f"for name in {rooms!r}: importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m.startswith(('dit_core.gpu', 'kernels.', 'comfy'))))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr


def test_the_engine_never_imports_comfyui():
    offenders = sorted(
        name for name, path in _modules().items() if name.startswith(("dit_core", "kernels"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        and any(m.split(".")[0] in ("comfy", "comfy_api", "folder_paths", "nodes")
                for m in ([node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                          else [a.name for a in node.names] if isinstance(node, ast.Import) else [])))
    assert not offenders, f"engine modules importing ComfyUI: {offenders}"
