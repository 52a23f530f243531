"""`swiftdit swap --for-host`: reduce a UI workflow to node types ComfyUI v0.3.75 (our test host) has, then
swap: literal sizes for ResolutionSelector, switches resolved, the prompt upsampler skipped, ReferenceMultiLatent
spelled out with ReferenceLatent, LTX's AV latent plumbing and a reference method v0.3.75 lacks as the pack's
twins (reference/templates.md section 7 lists what the host lacks)."""
from __future__ import annotations

import ast
import copy
import math
import operator
import re
from dataclasses import dataclass, field

from .reference_multi_latent import ReferenceSpelling
from .swap import PACK, Report, detect_format, swap
from .ui_edit import UIEditor, widget_index
from .ui_graph import SUBGRAPH_INPUT
from .workflow_api import KEEP, _promoted

HOST = "ComfyUI v0.3.75"
# reference/templates.md section 7: node types of our families' official templates that v0.3.75 lacks.
HOST_LACKS = frozenset({
    "ComfySwitchNode", "CreateBoundingBoxes", "Flux3LayoutPrompt", "ResolutionSelector", "TextGenerate",
    "ComfyMathExpression", "LTXVSeparateAVLatent", "ModelAttentionBackend", "LTXVAudioVAEDecode",
    "LTXVConcatAVLatent", "LTXVDualCFGGuider", "LTXVEmptyLatentAudio", "LTXVLatentUpsampler", "ManualSigmas",
    "TextGenerateLTX2Prompt", "ReferenceMultiLatent", "BatchImagesNode", "ImageCompare", "SaveImageAdvanced",
    "ResizeImageMaskNode", "LTXVImgToVideoInplace", "BlockSparseAttention",
    # v0.3.75 has GetImageSize (comfy_extras/nodes_images.py); the reduced graphs still write its sizes where they
    # are fixed and drop it where it feeds nothing, as the shipped reduced workflows were made
    "GetImageSize"})
LACKING_PREFIXES = ("MiniMaxH3",)
# Nodes run for what they show or save: never removed for feeding nothing.
OUTPUT_NODES = frozenset({"SaveImage", "PreviewImage", "PreviewAny", "SaveImageAdvanced", "ImageCompare",
                          "SaveVideo", "SaveAudio", "PreviewAudio", "SaveAnimatedWEBP", "SaveAnimatedPNG",
                          "SaveLatent", "SwiftDiTSaveImage"})
# On v0.3.75 these give no output (newer ComfyUI passes the value on): what read them reads their input.
NO_OUTPUT_ON_HOST = {"PreviewAny": "source", "SaveImage": "images", "PreviewImage": "images"}
VIEWERS = ("ImageCompare",)  # show two images side by side and give nothing: removed
PRIMITIVES = frozenset({"PrimitiveBoolean", "PrimitiveInt", "PrimitiveFloat", "PrimitiveString",
                        "PrimitiveStringMultiline", "PrimitiveNode"})
OFF = (2, 4)  # muted, bypassed: the frontend never sends them, so they need no reducing
UPSAMPLERS = ("TextGenerate", "TextGenerateLTX2Prompt")  # prompt rewriters: generated text from `prompt`
# Stock nodes the host lacks whose twin in the pack takes the same inputs and gives the same outputs (docs/nodes.md)
PACK_TWINS = {"LTXVConcatAVLatent": "SwiftDiTLTX25ConcatAVLatent",
              "LTXVSeparateAVLatent": "SwiftDiTLTX25SeparateAVLatent"}
# Stock nodes the host has, but without a value a template sets: (the widget, the host's values, the pack's twin
# that takes the same inputs and the value too)
VALUE_TWINS = {"FluxKontextMultiReferenceLatentMethod": ("reference_latents_method", ("offset", "index", "uxo/uno"),
                                                         "SwiftDiTKrea2ReferenceLatentMethod")}


@dataclass
class HostReport:
    changes: list = field(default_factory=list)  # (where, node type, what became of it, why)

    def lines(self) -> list[str]:
        out = [f"reduced for {HOST}: {len(self.changes)} change(s)"]
        return out + [f"  {where}  {kind}: {what} ({why})" for where, kind, what, why in self.changes]


def resolution_size(aspect_ratio: str, megapixels: float, multiple: int) -> tuple[int, int]:
    """Width and height as ResolutionSelector gives them: the ratio's sides scaled to `megapixels` (of 1024 x
    1024 pixels each), each rounded to the nearest multiple of `multiple` (Python's round, as the node's)."""
    m = re.match(r"\s*(\d+)\s*:\s*(\d+)", str(aspect_ratio))
    if not m or multiple <= 0:
        raise ValueError(f"aspect_ratio {aspect_ratio!r} / multiple {multiple!r} is not a ratio W:H and a step")
    w, h = int(m[1]), int(m[2])
    scale = math.sqrt(megapixels * 1024 * 1024 / (w * h))
    return round(w * scale / multiple) * multiple, round(h * scale / multiple) * multiple


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
              ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_,
              ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
              ast.Gt: operator.gt, ast.GtE: operator.ge}
_FUNCTIONS = {"min": min, "max": max, "abs": abs, "round": round, "sqrt": math.sqrt, "ceil": math.ceil,
              "floor": math.floor, "log": math.log, "log2": math.log2, "log10": math.log10, "sin": math.sin,
              "cos": math.cos, "tan": math.tan, "int": int, "float": float,
              "sum": lambda *a: sum(a[0]) if len(a) == 1 and hasattr(a[0], "__iter__") else sum(a),
              "pow": lambda b, e: pow(b, e) if abs(e) <= 4000 else math.inf}


def math_expression(expression: str, names: dict):
    """The number ComfyMathExpression computes: arithmetic, comparisons, `x if c else y` and its function table
    over the named values (and `values`, all of them in order); nothing else is evaluated."""
    names = {**names, "values": list(names.values())}

    def value(n):
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)):
            return n.value
        if isinstance(n, ast.Name) and n.id in names:
            return names[n.id]
        if isinstance(n, ast.BinOp) and type(n.op) in _OPERATORS:
            if isinstance(n.op, ast.Pow) and abs(value(n.right)) > 4000:
                raise ValueError("an exponent over 4000")
            return _OPERATORS[type(n.op)](value(n.left), value(n.right))
        if isinstance(n, ast.UnaryOp) and type(n.op) in _OPERATORS:
            return _OPERATORS[type(n.op)](value(n.operand))
        if isinstance(n, ast.Compare) and all(type(o) in _OPERATORS for o in n.ops):
            left, ok = value(n.left), True
            for op, right in zip(n.ops, map(value, n.comparators)):
                ok, left = ok and _OPERATORS[type(op)](left, right), right
            return ok
        if isinstance(n, ast.BoolOp):
            parts = [value(v) for v in n.values]
            return all(parts) if isinstance(n.op, ast.And) else any(parts)
        if isinstance(n, ast.IfExp):
            return value(n.body) if value(n.test) else value(n.orelse)
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _FUNCTIONS
                and not n.keywords):
            return _FUNCTIONS[n.func.id](*map(value, n.args))
        raise ValueError(f"{ast.unparse(n)!r} in {expression!r} is not a number, a known name "
                         f"({', '.join(names)}) or an operation ComfyMathExpression allows")

    if not str(expression).strip():
        raise ValueError("the expression is empty")
    try:
        tree = ast.parse(str(expression).strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"{expression!r} does not parse: {e.msg}") from None
    result = value(tree.body)
    if not isinstance(result, (int, float)) or not math.isfinite(float(result)):
        raise ValueError(f"{expression!r} gives {result!r}, not a finite number")
    return result


class Reducer:
    """One pass over a workflow copy; every rule reports what it changed and why."""
    host = HOST

    def __init__(self, workflow: dict):
        self.ed = UIEditor(workflow)
        self.report = HostReport()
        # (scope key, node id) of nodes that fed a removed node: removed too if they end up feeding nothing
        self.orphans: set = set()
        # (scope key, prompt rewriter id) -> ((origin id, slot), switch id): unrefined_prompts
        self.unrefined: dict = {}

    def placements(self, key) -> list[tuple]:
        graph = self.ed.graph
        if key is None:
            return [()]
        return [p.path for p in graph.placed() if graph.is_instance(p.node) and p.node["type"] == key]

    def where(self, scope, node) -> str:
        return ", ".join(":".join(map(str, prefix + (node["id"],))) for prefix in self.placements(scope.key))

    def live_scopes(self) -> list:
        """The top level and every subgraph placed at least once (an unplaced definition never runs)."""
        return [scope for scope in self.ed.graph.scopes() if self.placements(scope.key)]

    def nodes_of(self, kinds) -> list[tuple]:
        return [(scope, node) for scope in self.live_scopes() for node in list(scope.body.get("nodes", []))
                if node.get("type") in kinds and node.get("mode") not in OFF]

    def note(self, scope, node, what: str, why: str) -> None:
        kind = node.get("type")
        if self.ed.graph.is_instance(node):  # its type is a UUID: name the subgraph instead
            kind = f"subgraph {self.ed.graph.subgraphs[kind].body.get('name') or kind!r}"
        self.report.changes.append((self.where(scope, node), kind, what, why))

    def drop(self, scope, node) -> None:
        for origin_id, _ in self.ed.remove_node(scope, node):
            if origin_id != SUBGRAPH_INPUT:
                self.orphans.add((scope.key, origin_id))

    def constant(self, scope, node, name: str, prefixes=None):
        """The value input `name` has in every placement: its widget, a promoted subgraph value or a primitive's
        value; ValueError when it is computed by another node or differs between placements."""
        entry = next((e for e in node.get("inputs", []) if e.get("name") == name), None)
        if entry is None or entry.get("link") is None:
            return node["widgets_values"][widget_index(node, name)]
        values = []
        for prefix in self.placements(scope.key) if prefixes is None else prefixes:
            trace = self.ed.graph.trace(prefix, scope, entry["link"])
            origin = trace.origin
            if trace.promoted:
                value = _promoted(self.ed.graph, *trace.promoted)
                values.append(node["widgets_values"][widget_index(node, name)] if value is KEEP else value)
            elif origin is not None and origin.node.get("type") in PRIMITIVES:
                values.append(self.constant(origin.scope, origin.node, "value", [origin.path[:-1]]))
            else:
                source = f"{origin.node.get('type')} ({origin.id})" if origin else "nothing"
                raise ValueError(f"node {self.where(scope, node)} ({node['type']}): its {name} comes from "
                                 f"{source}, not from a widget or primitive, so it is not known before a run")
        if len({repr(v) for v in values}) != 1:
            raise ValueError(f"node {self.where(scope, node)} ({node['type']}): its {name} differs between the "
                             f"placements of its subgraph ({values})")
        return values[0]

    # --- the rules, in the order they run -----------------------------------------------------------------
    def write_outputs(self, scope, node, values: tuple, names: tuple) -> None:
        """What read output slot i of `node` (named names[i]) now holds the constant values[i] instead."""
        for slot, value in enumerate(values):
            for link_id in self.ed.consumers(scope, node["id"], slot):
                link = scope.link(link_id)
                target = scope.nodes.get(link["target_id"])
                name = target["inputs"][link["target_slot"]]["name"] if target else "output"
                try:
                    self.ed.set_input_value(scope, link["target_id"], name, value)
                except (ValueError, StopIteration, KeyError) as e:
                    raise ValueError(f"node {self.where(scope, node)} ({node['type']}): cannot write its "
                                     f"{names[slot]} into what reads it: {e}") from None
                self.note(scope, target, f"{name} = {value}", f"was wired from {node['type']} "
                          f"{self.where(scope, node)}")

    def resolutions(self) -> None:
        for scope, node in self.nodes_of({"ResolutionSelector"}):
            args = [self.constant(scope, node, n) for n in ("aspect_ratio", "megapixels", "multiple")]
            try:
                size = resolution_size(*args)
            except (ValueError, TypeError, ZeroDivisionError) as e:
                raise ValueError(f"node {self.where(scope, node)} (ResolutionSelector): {e}") from None
            self.write_outputs(scope, node, size, ("width", "height"))
            self.note(scope, node, "removed", f"{args[0]}, {args[1]} MP, multiple of {args[2]} gives "
                      f"{size[0]}x{size[1]}, now written where it was read; {HOST} has no ResolutionSelector")
            self.drop(scope, node)

    def math_expressions(self) -> None:
        for scope, node in self.nodes_of({"ComfyMathExpression"}):
            expression = self.constant(scope, node, "expression")
            # Unwired value inputs are absent, as the node's autogrow group leaves them.
            names = {e["name"].split(".", 1)[1]: self.constant(scope, node, e["name"])
                     for e in node.get("inputs", []) if e.get("name", "").startswith("values.")
                     and e.get("link") is not None}
            try:
                result = math_expression(expression, names)
            except (ValueError, TypeError, ZeroDivisionError, OverflowError) as e:
                raise ValueError(f"node {self.where(scope, node)} (ComfyMathExpression): {e}") from None
            self.write_outputs(scope, node, (float(result), int(result), bool(result)), ("FLOAT", "INT", "BOOL"))
            shown = ", ".join(f"{k} = {v}" for k, v in names.items())
            self.note(scope, node, "removed", f"{expression!r} with {shown or 'no values'} gives {result}, now "
                      f"written where it was read; {HOST} has no ComfyMathExpression")
            self.drop(scope, node)

    def switches(self) -> None:
        for scope, node in self.nodes_of({"ComfySwitchNode"}):
            value = self.constant(scope, node, "switch")
            chosen = "on_true" if value else "on_false"
            self.ed.pass_through(scope, node, 0, chosen, self.where(scope, node))
            self.note(scope, node, f"removed, its {chosen} wired straight through",
                      f"switch is {value}; {HOST} has no ComfySwitchNode")
            self.drop(scope, node)

    def unrefined_prompts(self) -> None:
        """Before the switches go: for each prompt rewriter whose text a switch chooses between it and another
        wire, that other wire's origin, the prompt the template uses with the rewriter off. A rewriter's `prompt`
        input can be more than the user's prompt (Krea 2's is its system prompt joined to it by StringConcatenate),
        so that input is not what the text encoder would read without it."""
        for scope, node in self.nodes_of(set(UPSAMPLERS)):
            others = set()
            for lid in self.ed.consumers(scope, node["id"], 0):
                link = scope.link(lid)
                switch = scope.nodes.get(link["target_id"])
                if switch is None or switch.get("type") != "ComfySwitchNode" or switch.get("mode") in OFF:
                    continue
                here = switch["inputs"][link["target_slot"]]["name"]
                other = {"on_true": "on_false", "on_false": "on_true"}.get(here)
                origin = self.ed.origin(scope, switch, other) if other else None
                if origin is not None:
                    others.add((origin, switch["id"]))
            if len({origin for origin, _ in others}) == 1:
                (origin, switch_id), *_ = sorted(others, key=repr)
                self.unrefined[(scope.key, node["id"])] = (origin, switch_id)

    def upsamplers(self) -> None:
        for scope, node in self.nodes_of(set(UPSAMPLERS)):
            kind = node["type"]
            if self.ed.consumers(scope, node["id"], 1):
                raise ValueError(f"node {self.where(scope, node)} ({kind}): its thinking output is used; "
                                 f"only its generated text can be skipped")
            unrefined = self.unrefined.get((scope.key, node["id"]))
            readers = self.ed.consumers(scope, node["id"], 0)
            if not readers:
                self.note(scope, node, "skipped, nothing reads its generated text once the switches are resolved",
                          f"{HOST} has no {kind}; the template's switch leaves it off")
            elif unrefined is not None:
                origin, switch_id = unrefined
                for lid in readers:
                    self.ed.reorigin(scope, lid, origin)
                source = "a subgraph input" if origin[0] == SUBGRAPH_INPUT else \
                    f"{scope.nodes[origin[0]].get('type')} {self.where(scope, scope.nodes[origin[0]])}"
                self.note(scope, node, f"skipped, prompt refiner reduced: what read its generated text now reads "
                          f"{source}, the prompt switch {self.where(scope, {'id': switch_id})} passes with the "
                          f"refiner off",
                          f"{HOST} has no {kind}: the text encoder gets the prompt unrefined, not {kind}'s "
                          f"rewrite, so the image differs from the template's with the refiner on")
            else:
                self.ed.pass_through(scope, node, 0, "prompt", self.where(scope, node))
                self.note(scope, node, "skipped, prompt refiner reduced: its prompt wired straight to what read "
                          "the generated text", f"{HOST} has no {kind}: the prompt reaches the text encoder as "
                          f"typed, not upsampled")
            self.drop(scope, node)

    def layout_prompts(self) -> None:
        for scope, node in self.nodes_of({"Flux3LayoutPrompt"}):
            caption = node["widgets_values"][widget_index(node, "prompt")]
            for entry in node.get("inputs", []):
                origin = self.ed.origin(scope, node, entry["name"])
                if origin and origin[0] != SUBGRAPH_INPUT:
                    self.orphans.add((scope.key, origin[0]))
                if entry.get("link") is not None:
                    self.ed.remove_link(scope, entry["link"])
            out = (node.get("outputs") or [{}])[0]
            node.update(type="PrimitiveStringMultiline", widgets_values=[caption],
                        inputs=[{"name": "value", "type": "STRING", "widget": {"name": "value"}, "link": None}],
                        outputs=[{"name": "STRING", "type": "STRING", "links": out.get("links") or []}])
            node.setdefault("properties", {})["Node name for S&R"] = "PrimitiveStringMultiline"
            if "widgets_values_named" in node:
                node["widgets_values_named"] = {"value": caption}
            self.report.changes.append((self.where(scope, node), "Flux3LayoutPrompt",
                                        "-> PrimitiveStringMultiline with its caption",
                                        f"the bounding-box layout it would add is dropped: {HOST} has neither "
                                        f"Flux3LayoutPrompt nor CreateBoundingBoxes"))

    def reference_latents(self) -> None:
        for scope, node in self.nodes_of({"ReferenceMultiLatent"}):
            ReferenceSpelling(self, scope, node).run()

    def separated_latents(self) -> None:
        """LTXVSeparateAVLatent whose audio output nothing reads: what read its video part reads the AV latent
        (MiniMax H3's t2i template: our VAE Decode takes the AV latent as well as its video part)."""
        for scope, node in self.nodes_of({"LTXVSeparateAVLatent"}):
            if self.ed.consumers(scope, node["id"], 1):
                continue  # its audio part is read too: the pack's twin splits it (twins)
            self.ed.pass_through(scope, node, 0, "av_latent", self.where(scope, node))
            self.note(scope, node, "removed, the AV latent passed on to what read its video part",
                      f"{HOST} has no LTXVSeparateAVLatent; the MiniMax H3 VAE Decode takes the AV latent")
            self.drop(scope, node)

    def image_resizes(self) -> None:
        """ResizeImageMaskNode's "scale dimensions" of an IMAGE as ImageScale (newer ComfyUI's scale_dimensions is
        ImageScale's upscale); then GetImageSize of such an ImageScale's picture as the sizes it was given (LTX-2.5's
        flf2v template). Other resize types stay for check() to name (no rule yet: "scale longer dimension" would be
        v0.3.75's ImageScaleToMaxDimension once its rounding is checked against newer ComfyUI's)."""
        for scope, node in self.nodes_of({"ResizeImageMaskNode"}):
            values, origin = node.get("widgets_values") or [], self.ed.origin(scope, node, "input")
            if values[:1] != ["scale dimensions"] or origin is None or self._given(scope, node, "input") != {"IMAGE"}:
                continue  # check() names it

            def value(name, at):  # a DynamicCombo's widget, or the primitive / promoted value wired to it
                wired = any(e.get("name") == name and e.get("link") is not None for e in node["inputs"])
                return self._wired(scope, node, name) if wired else values[at]
            kind, widgets = "ImageScale", [values[4], value("resize_type.width", 1), value("resize_type.height", 2),
                                           values[3]]
            ours = self.ed.add_node(scope, kind, node.get("pos") or (0, 0), [("image", "IMAGE")], ["IMAGE"], widgets)
            self.ed.add_link(scope, *origin, ours["id"], 0)
            for link_id in self.ed.consumers(scope, node["id"], 0):
                self.ed.reorigin(scope, link_id, (ours["id"], 0))
            self.note(scope, node, f"-> {kind} {widgets}", f"{HOST} has no ResizeImageMaskNode; {kind} resizes an "
                      f"image by the same rule")
            self.drop(scope, node)
        for scope, node in self.nodes_of({"GetImageSize"}):
            origin = self.ed.origin(scope, node, "image")
            source = scope.nodes.get(origin[0]) if origin else None
            if source is None or source.get("type") != "ImageScale" or 0 in source["widgets_values"][1:3] or \
                    self.ed.consumers(scope, node["id"], 2):
                continue
            size = tuple(source["widgets_values"][1:3])
            self.write_outputs(scope, node, size, ("width", "height"))
            self.note(scope, node, "removed", f"its image is ImageScale's {size[0]}x{size[1]}, now written where it "
                      f"was read")
            self.drop(scope, node)

    def _given(self, scope, node, name) -> set:
        """The wire types input `name` is given in every placement (through subgraph edges)."""
        link_id = next(e["link"] for e in node["inputs"] if e.get("name") == name)
        traces = [self.ed.graph.trace(prefix, scope, link_id) for prefix in self.placements(scope.key)]
        return {t.origin.node["outputs"][t.slot].get("type") if t.origin else None for t in traces}

    def _wired(self, scope, node, name):
        entry = next(e for e in node["inputs"] if e.get("name") == name)
        origin = self.ed.origin(scope, node, name)
        source = scope.nodes.get(origin[0]) if origin else None
        if source is None or source.get("type") not in PRIMITIVES:
            raise ValueError(f"node {self.where(scope, node)} ({node['type']}): its {name} comes from "
                             f"{source and source.get('type')}, not a primitive (link {entry['link']})")
        return self.constant(scope, source, "value")

    def twins(self) -> None:
        for scope, node in self.nodes_of(set(PACK_TWINS)):
            stock, ours = node["type"], PACK_TWINS[node["type"]]
            self.note(scope, node, f"-> {ours}", f"{HOST} has no {stock}; the pack's twin takes the same inputs "
                      f"and gives the same outputs")
            self._retype(node, ours)

    def value_twins(self) -> None:
        for scope, node in self.nodes_of(set(VALUE_TWINS)):
            widget, values, ours = VALUE_TWINS[node["type"]]
            value = self.constant(scope, node, widget)
            if value in values:
                continue
            self.note(scope, node, f"-> {ours}", f"{HOST}'s {node['type']} has no {widget} {value!r}; the pack's "
                      f"twin takes the same inputs and that value")
            self._retype(node, ours)

    def _retype(self, node, ours: str) -> None:
        node["type"] = ours
        props = node.setdefault("properties", {})
        props.update({"Node name for S&R": ours, "cnr_id": PACK})
        props.pop("ver", None)  # the stock node's ComfyUI version says nothing about ours

    def unused(self) -> None:
        """Nodes the host lacks that give nothing to any node: viewers, and nodes whose outputs nothing reads."""
        for scope, node in self.nodes_of(HOST_LACKS):
            used = any(out.get("links") for out in node.get("outputs", []))
            if node["type"] in VIEWERS and used:
                raise ValueError(f"node {self.where(scope, node)} ({node['type']}): {HOST} lacks it and its "
                                 f"output is used")
            if used or (node["type"] in OUTPUT_NODES and node["type"] not in VIEWERS):
                continue
            why = "a viewer that gives nothing" if node["type"] in VIEWERS else "nothing reads its outputs"
            self.note(scope, node, "removed", f"{why}; {HOST} lacks it")
            self.drop(scope, node)
        # muted or bypassed ones never run, but the editor would still ask for their pack
        for scope in self.live_scopes():
            for node in [n for n in scope.body.get("nodes", []) if n.get("type") in HOST_LACKS
                         and n.get("mode") in OFF and not any(out.get("links") for out in n.get("outputs", []))]:
                self.note(scope, node, "removed", f"{'muted' if node['mode'] == 2 else 'bypassed'}, and nothing "
                          f"reads its outputs; {HOST} lacks it")
                self.drop(scope, node)

    def outputless(self) -> None:
        moved = True
        while moved:  # PreviewAny -> PreviewAny chains: repeat until nothing reads one
            moved = False
            for scope, node in self.nodes_of(set(NO_OUTPUT_ON_HOST)):
                for slot in range(len(node.get("outputs") or [])):
                    name = NO_OUTPUT_ON_HOST[node["type"]] if slot == 0 else None
                    if name is None and self.ed.consumers(scope, node["id"], slot):
                        raise ValueError(f"node {self.where(scope, node)} ({node['type']}): its output {slot} "
                                         f"is used; on {HOST} it gives no output")
                    if name and self.ed.pass_through(scope, node, slot, name, self.where(scope, node)):
                        moved = True
                        self.note(scope, node, f"kept; what read its output now reads its {name}",
                                  f"{HOST}'s {node['type']} gives no output")
    
    def prune(self) -> None:
        while self.orphans:
            key, node_id = self.orphans.pop()
            scope = self.ed.scope(key)
            node = scope.nodes.get(node_id)
            if (node is None or node.get("type") in OUTPUT_NODES or self.ed.graph.is_instance(node)
                    or not node.get("outputs") or any(out.get("links") for out in node["outputs"])):
                continue
            self.note(scope, node, "removed", "feeds nothing once the nodes it fed were reduced")
            self.drop(scope, node)

    def view(self) -> None:
        """The saved view moved to show the top level's top-left corner (title bar included) where it no longer
        does: a reduction can take away the nodes the template's view looked at."""
        wf, title = self.ed.wf, 30  # LiteGraph's NODE_TITLE_HEIGHT
        ds = wf.get("extra", {}).get("ds")
        nodes = [n for n in wf.get("nodes", []) if "pos" in n]
        if not ds or not nodes:
            return
        left, top = min(n["pos"][0] for n in nodes), min(n["pos"][1] for n in nodes) - title
        offset = ds.get("offset", [0, 0])
        if left + offset[0] >= 0 and top + offset[1] >= 0:
            return
        ds["offset"] = [-left + title, -top + title]
        self.report.changes.append(("view", "extra.ds", f"offset {ds['offset']}",
                                    "the saved view hid the graph's top-left corner once nodes were reduced"))

    def check(self) -> None:
        for scope in self.live_scopes():
            for node in scope.body.get("nodes", []):
                kind = node.get("type", "")
                if node.get("mode") not in OFF and (kind in HOST_LACKS or kind.startswith(LACKING_PREFIXES)):
                    raise ValueError(f"node {self.where(scope, node)} ({kind}): {HOST} has no {kind}, and "
                                     f"--for-host has no rule to reduce it")


def reduce_for_host(workflow: dict, check: bool = True) -> tuple[dict, HostReport]:
    """A copy of a UI-format workflow reduced to node types ComfyUI v0.3.75 has, and what changed. ValueError
    naming the node when something cannot be reduced; `check=False` leaves that test to the caller (the swap
    replaces node types the host lacks, such as MiniMax H3's)."""
    if detect_format(workflow) != "ui":
        raise ValueError("--for-host reduces UI-format workflows; reduce first, then convert with to-api")
    reducer = Reducer(copy.deepcopy(workflow))
    for rule in (reducer.resolutions, reducer.math_expressions, reducer.unrefined_prompts, reducer.switches,
                 reducer.upsamplers, reducer.layout_prompts, reducer.reference_latents, reducer.separated_latents,
                 reducer.image_resizes, reducer.twins, reducer.value_twins, reducer.unused, reducer.outputless,
                 reducer.prune, reducer.view):
        rule()
    if check:
        reducer.check()
    return reducer.ed.wf, reducer.report


def swap_for_host(data: dict, family: str = "z_image",
                  fmt: str | None = None) -> tuple[dict, Report, HostReport]:
    """Reduce for the host, then swap (the reduction's stock VAEEncode nodes become ours like any other), then
    check that what is left is all the host has."""
    reduced, host_report = reduce_for_host(data, check=False)
    swapped, report = swap(reduced, family, fmt)
    if report.changed or not report.not_yet:  # a graph the swap cannot take yet: the caller says why instead
        Reducer(swapped).check()
    return swapped, report, host_report
