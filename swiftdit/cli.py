"""The `swiftdit` command: `swap` stock nodes for ours in a workflow; `to-api` turns UI format into API; `quantize`
writes a checkpoint's linears as INT8 ConvRot (the offline converter); `prebuild` builds the first prompt's GPU
kernels once per machine. `swap` reads the one family table
(dit_core/families/__init__.py), so importing it imports the engine, and with it torch."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from .families import FAMILIES
from .for_host import HOST, swap_for_host
from .swap import detect_format, swap
from .ui_graph import problems
from .workflow_api import to_api


class UserError(Exception):
    """A problem with what the user asked for: printed as one line, exit status 2."""


def _read(path: Path, what: str):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{what} {path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{what} {path} is not readable JSON: {e}") from None


def _check_out(src: Path, out: Path, overwrite: bool) -> None:
    if out.exists() and out.resolve() == src.resolve():
        raise UserError(f"OUT {out} is the input file: write the result somewhere else")
    if out.exists() and not overwrite:
        raise UserError(f"OUT {out} exists: pass --overwrite to replace it")
    if not out.parent.is_dir():
        raise UserError(f"folder {out.parent} does not exist")


def umask() -> int:
    """The process's umask (reading it means setting it: set back at once)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write(out: Path, data) -> None:
    """Write through a temporary file in OUT's folder: OUT is either the old file or the whole new one."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    except OSError as e:
        raise UserError(f"cannot write in {out.parent}: {e}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, ensure_ascii=False)
            f.write("\n")
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp's 0600 -> what a file the user saves gets
        os.replace(tmp, out)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise UserError(f"cannot write {out}: {e}") from None
        raise


def _swap(args) -> None:
    data = _read(args.input, "IN")
    _check_out(args.input, args.output, args.overwrite)
    try:
        fmt = detect_format(data)
        before = problems(data) if fmt == "ui" else []
        host_report = None
        if args.for_host:
            result, report, host_report = swap_for_host(data, args.family, args.format)
        else:
            result, report = swap(data, args.family, args.format)
    except ValueError as e:
        raise UserError(f"IN {args.input}: {e}") from None
    except (KeyError, IndexError, TypeError, AttributeError) as e:  # a field missing or of the wrong kind
        raise UserError(f"IN {args.input} is not a well-formed workflow ({type(e).__name__}: {e})") from None
    if not report.changed and report.not_yet:  # the family's graph, of a kind the swap cannot take yet
        raise UserError(f"IN {args.input}: nothing swapped: {'; '.join(report.not_yet)}; OUT not written")
    if not report.changed:  # a tool that did nothing says so (and the user's OUT is not made)
        wanted = (f"a family SwiftDiT runs ({', '.join(f.title for f in FAMILIES.values())})"
                  if args.family == "auto" else FAMILIES[args.family].title)
        raise UserError(f"IN {args.input}: nothing to swap: it holds no {wanted} graph of stock nodes; OUT not "
                        f"written")
    if fmt == "ui":
        after = problems(result)
        if after and not before:  # a bug of ours, never the user's: keep their file as it was
            raise UserError("the swapped graph would not load; nothing written:\n  " + "\n  ".join(after))
        for line in before:
            print(f"warning: IN already has: {line}", file=sys.stderr)
    _write(args.output, result)
    if host_report is not None:
        print("\n".join(host_report.lines()))
    print("\n".join(report.lines()))
    print(f"wrote {args.output} ({fmt} format)")


def _to_api(args) -> None:
    data = _read(args.input, "IN")
    info = _read(args.object_info, "--object-info")
    _check_out(args.input, args.output, args.overwrite)
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise UserError(f"IN {args.input} is not a UI-format workflow (no 'nodes' list)")
    if not isinstance(info, dict):
        raise UserError(f"--object-info {args.object_info} is not an /object_info dict")
    try:
        prompt = to_api(data, info)
    except ValueError as e:
        raise UserError(f"IN {args.input}: {e}") from None
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        raise UserError(f"IN {args.input} is not a well-formed workflow ({type(e).__name__}: {e})") from None
    _write(args.output, prompt)
    print(f"wrote {args.output}: {len(prompt)} node(s)")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="swiftdit", description=__doc__)
    sub = top.add_subparsers(dest="command", required=True)
    p = sub.add_parser("swap", help="replace the stock nodes of a family's graph with SwiftDiT's")
    p.add_argument("input", type=Path, metavar="IN")
    p.add_argument("output", type=Path, metavar="OUT")
    p.add_argument("--family", choices=[*sorted(FAMILIES), "auto"], default="auto",
                   help="the family's swap table (default auto: the one family whose graph IN holds)")
    p.add_argument("--format", choices=("ui", "api"), help="IN's format (default: detected)")
    p.add_argument("--for-host", action="store_true",
                   help=f"first reduce IN (UI format) to node types {HOST} has: literal sizes for "
                        f"ResolutionSelector, switches resolved, the prompt upsampler skipped, ...")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists (never IN)")
    p.set_defaults(run=_swap)
    p = sub.add_parser("to-api", help="turn a UI-format workflow into an API-format prompt")
    p.add_argument("input", type=Path, metavar="IN")
    p.add_argument("output", type=Path, metavar="OUT")
    p.add_argument("--object-info", type=Path, required=True, metavar="FILE",
                   help="the server's /object_info JSON (names the positional widget values)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists (never IN)")
    p.set_defaults(run=_to_api)
    sub.add_parser("quantize", help="a BF16/F16/F32 checkpoint's linears as INT8 ConvRot in ComfyUI's layout "
                                    "(swiftdit quantize --help)")
    sub.add_parser("prebuild", help="the first prompt's GPU kernels built once per machine from the model files "
                                    "(swiftdit prebuild --help)")
    return top


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["quantize"]:  # its own options (swiftdit/quantize.py); torch is imported for it alone
        from .quantize import main as quantize
        return quantize(argv[1:])
    if argv[:1] == ["prebuild"]:  # its own options (swiftdit/prebuild.py)
        from .prebuild import main as prebuild
        return prebuild(argv[1:])
    args = parser().parse_args(argv)
    try:
        args.run(args)
    except UserError as e:
        print(f"swiftdit {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
