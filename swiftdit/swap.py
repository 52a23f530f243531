"""Swap the stock nodes of a family's graph for SwiftDiT's, in UI (subgraphs too) or API format, keeping every
link and widget value; the report says what changed and why everything else stayed as it was."""
from __future__ import annotations

import copy
from collections import defaultdict
from dataclasses import dataclass, field

from .families import AUDIO_VAE_INPUTS, AUDIO_VAE_READERS, FAMILIES, STOCK_CLIP_USERS, Family
from .ui_edit import UIEditor, _put
from .ui_graph import UIGraph, link_view
from .workflow_api import is_link

NOTES = ("MarkdownNote", "Note")
PACK = "comfyui-swiftdit"  # properties.cnr_id: tells the frontend and the Manager which pack a node is from


@dataclass
class GNode:
    """A node as the planner sees it, in either format; every placement of one definition shares `key`."""
    id: str
    key: tuple
    type: str
    widgets: dict
    blocked: str | None = None  # a reason ours cannot take this node's values


@dataclass
class Wire:
    """A value's path from an output (src) to an input (dst); an end is None at an open subgraph edge."""
    src: str | None
    slot: int
    dst: str | None
    name: str | None
    type: str | None
    refs: list = field(default_factory=list)  # stored types along the way (UI only)

    @property
    def segments(self) -> set:
        return {id(container) for container, _ in self.refs}


@dataclass
class Report:
    family: str
    changed: list = field(default_factory=list)  # (where, old type, new type)
    left: list = field(default_factory=list)     # (where, type, why it stayed)
    retyped: int = 0                             # link and port types changed to ours
    added: list = field(default_factory=list)    # (where, our type, why): ours beside a stock node kept for others
    not_yet: list = field(default_factory=list)  # what of the family's graph the swap cannot take yet, and why
    folded: list = field(default_factory=list)   # (where, what): SamplerCustomAdvanced groups spelled as a KSampler

    def lines(self) -> list[str]:
        out = [f"{self.family}: swapped {len(self.changed)} node(s), changed {self.retyped} wire type(s)"]
        out += [f"  {where}  {old} -> {new}" for where, old, new in self.changed]
        out += [f"spelled out for SwiftDiT first: {len(self.folded)} change(s)"] if self.folded else []
        out += [f"  {where}  {what}" for where, what in self.folded]
        out += [f"added {len(self.added)} node(s)"] if self.added else []
        out += [f"  {where}  {new}: {why}" for where, new, why in self.added]
        out += [f"not yet supported: {why}" for why in self.not_yet]
        out += [f"left as they were: {len(self.left)} node(s)"] if self.left else []
        out += [f"  {where}  {kind}: {why}" for where, kind, why in self.left]
        return out


@dataclass
class Plan:
    swap: set                                      # node ids whose type becomes ours
    why: dict                                      # node id -> why it stays as it is
    through: set = field(default_factory=set)      # stock pass-through nodes (switches) that now carry ours
    split: dict = field(default_factory=dict)      # stock text loader kept for STOCK_CLIP_USERS -> the wires
    not_yet: list = field(default_factory=list)    # of our encoders it fed, which move to ours added beside it
    ours: dict = field(default_factory=dict)       # node id -> our type where the role's is not it (audio VAE)


def plan(fam: Family, nodes: dict, wires: list) -> Plan:
    """The node ids to swap, and for every stock node of the family's roles left alone, why."""
    into, by_dst, by_src = {}, defaultdict(list), defaultdict(list)
    for w in wires:
        if w.src is not None:
            by_src[w.src].append(w)
        if w.dst is not None:
            by_dst[w.dst].append(w)
            into[(w.dst, w.name)] = w

    def src(nid, name):
        w = into.get((nid, name))
        return nodes.get(w.src) if w and w.src is not None else None

    def plays(node, stock):  # the stock node of this role, or ours already (no role: None, e.g. Krea 2's VAE loader)
        return node is not None and stock is not None and node.type in (stock, fam.roles[stock].ours)

    def reaches(nid, names, goal, wire_type):  # upstream along wires of `wire_type` (or unknown type; any: None)
        todo, seen = [into[(nid, n)] for n in names if (nid, n) in into], set()
        while todo:
            w = todo.pop()
            if w.src is None or w.src in seen:
                continue
            seen.add(w.src)
            if w.src in goal:
                return True
            todo += [x for x in by_dst[w.src] if wire_type is None or x.type in (wire_type, None)]
        return False

    why, cand = {}, set()
    loaders = set()
    for n in nodes.values():
        if n.type == fam.text_loader and n.widgets.get("type") not in fam.text_loader_types:
            why[n.id] = f"type {n.widgets.get('type')!r} is not a {fam.title} text encoder"
        elif plays(n, fam.text_loader):
            loaders.add(n.id)
    encoders = {n.id for n in nodes.values() if any(plays(n, e) for e in fam.text_encoders)
                and getattr(src(n.id, "clip"), "id", None) in loaders}
    not_yet = []
    not_yet_of = dict(fam.not_yet)
    model_loaders = {n.id for n in nodes.values() if plays(n, fam.model_loader)}
    for n in nodes.values():  # a graph of the family that the swap cannot take yet (H3's reference videos)
        # the node's type, or its type with an input wired ("MiniMaxH3ReferenceToVideo.ref_videos.ref_video_0"); it
        # counts when a loader of the family (text or VAE) feeds it, or its model loader does along MODEL wires
        reason = not_yet_of.get(n.type) or next((not_yet_of[f"{n.type}.{w.name}"] for w in by_dst[n.id]
                                                 if w.src is not None and f"{n.type}.{w.name}" in not_yet_of), None)
        if reason and (any(w.src in loaders or plays(nodes.get(w.src), fam.vae_loader)
                           for w in by_dst[n.id])
                       or reaches(n.id, [w.name for w in by_dst[n.id]], model_loaders, "MODEL")):
            why[n.id] = reason
            not_yet += [reason] if reason not in not_yet else []
    if not_yet:  # half a graph swapped would hand stock nodes our models and conditioning: it all stays
        for n in nodes.values():
            if n.type in fam.roles:
                why.setdefault(n.id, f"part of a {fam.title} graph the swap cannot take yet")
        return Plan(set(), why, not_yet=not_yet)
    through = set()

    def model_path(sid):  # the nodes on a sampler's model path back to the loader(s), or why it is not ours
        path, todo = [], [(sid, "model")]
        while todo:
            nid, name = todo.pop()
            m = src(nid, name)
            if m is None:
                return None, "its model input is open"
            if m.id in path or m.id in through:
                continue
            if any(plays(m, p) for p in fam.model_patches):
                path.append(m.id)
                todo.append((m.id, "model"))
            elif m.type in fam.switches:  # a switch: every wired branch must be the family's model
                branches = [(m.id, x) for x in fam.switches[m.type] if (m.id, x) in into]
                if not branches:
                    return None, f"its model comes through {m.type} ({m.id}), which has no model wired"
                through.add(m.id)
                todo += branches
            elif plays(m, fam.model_loader):
                path.append(m.id)
            else:
                return None, f"its model comes through stock {m.type} ({m.id})"
        return path, None
    sampler_role = fam.roles[fam.sampler]
    conds = [name for name, t in sampler_role.sockets if t == "CONDITIONING"]
    samplers = set()
    for n in (n for n in nodes.values() if plays(n, fam.sampler)):
        if not reaches(n.id, conds, encoders, "CONDITIONING"):
            why[n.id] = f"its conditioning comes from no {fam.title} text encoder"
            continue
        known = set(through)
        path, reason = model_path(n.id)
        if path is None:
            through.intersection_update(known)
            why[n.id] = reason
            continue
        samplers.add(n.id)
        cand.update([n.id, *path])
    audio_vaes = {}  # VAELoader -> ours for an audio decode

    def vae_loader(n):  # the VAE loader (stock or ours) on the VAE input of a node of the family's roles
        name = next(name for name, t in fam.roles[fam.ours_roles.get(n.type, n.type)].sockets if t == "VAE")
        vae = src(n.id, name)
        return vae if plays(vae, fam.vae_loader) or (vae is not None and vae.type == fam.audio_vae_loader) else None

    # decoders and upsamplers (with their model file's loader) of a sampler's latent
    for n in (n for n in nodes.values() if any(plays(n, d) for d in (*fam.decoders, *fam.upsamplers))):
        if reaches(n.id, ["samples"], samplers, "LATENT"):
            cand.add(n.id)
            vae = vae_loader(n)
            if vae is not None:
                cand.add(vae.id)
                if _audio(fam, n.type):
                    audio_vaes[vae.id] = fam.audio_vae_loader
            socket, loader = next((fam.upsamplers[u] for u in fam.upsamplers if plays(n, u)), (None, None))
            model = src(n.id, socket) if socket else None
            if plays(model, loader):
                cand.add(model.id)
        else:
            why.setdefault(n.id, f"its samples come from no {fam.title} sampler")
    for n in (n for n in nodes.values() if any(plays(n, r) for r in fam.audio_latents)):
        vae = vae_loader(n)  # an empty audio latent reads the audio VAE: ours when its loader is
        if vae is not None and vae.id in audio_vaes:
            cand.add(n.id)
        else:
            why.setdefault(n.id, f"its audio VAE feeds no {fam.title} audio decode")
    for sid in samplers:  # VAE encodes of reference images: upstream of the conditioning, never past a sampler
        todo, seen = [into[(sid, n)] for n in conds if (sid, n) in into], set()
        while todo:
            w = todo.pop()
            if w.src is None or w.src in seen or w.src not in nodes:
                continue
            seen.add(w.src)
            n = nodes[w.src]
            if any(plays(n, e) for e in fam.vae_encoders):
                cand.add(n.id)
                vae = src(n.id, "vae")
                if plays(vae, fam.vae_loader):
                    cand.add(vae.id)
            elif not plays(n, fam.sampler):
                todo += [x for x in by_dst[w.src] if x.type in ("CONDITIONING", "LATENT", None)]
    for sid in samplers:  # frame nodes (LTX-2.5's i2v, flf2v): upstream of its latent or conditioning
        todo, seen = [into[(sid, n)] for n in (*conds, "latent_image") if (sid, n) in into], set()
        while todo:
            w = todo.pop()
            if w.src is None or w.src in seen or w.src not in nodes or plays(nodes[w.src], fam.sampler):
                continue
            seen.add(w.src)
            n = nodes[w.src]
            if any(plays(n, e) for e in fam.frame_encoders):
                cand.add(n.id)
                vae = vae_loader(n)
                if vae is not None:
                    cand.add(vae.id)
            todo += [x for x in by_dst[w.src] if x.type in ("CONDITIONING", "LATENT", None)]
    for n in (n for n in nodes.values() if any(plays(n, c) for c in fam.guide_croppers)):
        if reaches(n.id, ["latent"], samplers, "LATENT"):
            cand.add(n.id)
        else:
            why.setdefault(n.id, f"its latent comes from no {fam.title} sampler")
    for n in nodes.values():
        if any(plays(n, e) for e in fam.vae_encoders) and n.id not in cand:
            why.setdefault(n.id, f"its latent reaches the conditioning of no {fam.title} sampler")
        elif any(plays(n, e) for e in fam.frame_encoders) and n.id not in cand:
            why.setdefault(n.id, f"its latent and conditioning reach no {fam.title} sampler")
    cand |= loaders | encoders
    cand = {c for c in cand if nodes[c].type in fam.roles}  # ours are already swapped

    placements = defaultdict(set)
    for n in nodes.values():
        placements[n.key].add(n.id)

    def drop(nid, reason):
        for other in placements[nodes[nid].key]:
            cand.discard(other)
            why.setdefault(other, reason)

    for nid in sorted(cand):
        if nodes[nid].blocked:
            drop(nid, nodes[nid].blocked)
        elif not placements[nodes[nid].key] <= cand:
            drop(nid, "its subgraph is placed more than once and not every placement is the same graph")

    def swapped(nid, seen=frozenset()):
        if nid in through:  # a switch carries ours when everything it switches between is ours
            ins = [w.src for w in by_dst[nid] if fam.is_engine_wire(w.type)]
            return bool(ins) and nid not in seen and all(s is not None and swapped(s, seen | {nid}) for s in ins)
        return nid in cand or nodes[nid].type in fam.ours_roles

    # A text loader that feeds our encodes and stock nodes needing ComfyUI's own CLIP (TextGenerate) stays stock for
    # those; ours is added beside it for the encodes (direct links, a definition placed once).
    split = {}
    for lid in sorted(loaders & cand):
        outs = [w for w in by_src[lid] if fam.is_engine_wire(w.type)]
        users = [w for w in outs if w.dst is not None and nodes[w.dst].type in STOCK_CLIP_USERS]
        encodes = [w for w in outs if w.dst in encoders and w.dst in cand]
        if (users and encodes and len(users) + len(encodes) == len(outs) and all(len(w.refs) <= 1 for w in encodes)
                and placements[nodes[lid].key] == {lid}):
            split[lid] = encodes
            cand.discard(lid)

    engine = [w for w in wires if fam.is_engine_wire(w.type) and w.src not in split]
    changed = True
    while changed:  # an engine wire joins two of ours or two stock nodes, never one of each
        changed = False
        for w in engine:
            if w.src is None or w.dst is None or swapped(w.src) == swapped(w.dst):
                continue
            if w.src in through and swapped(w.src):  # ours reach a stock node through a switch: what the switch passes stays stock
                for x in by_dst[w.src]:
                    if x.src in cand and fam.is_engine_wire(x.type):
                        stock = nodes[w.dst]
                        drop(x.src, f"its {x.type} reaches stock {stock.type} ({stock.id}) through "
                                    f"{nodes[w.src].type} ({w.src}), which needs {x.type}")
                        changed = True
            elif w.src in cand:
                stock = nodes[w.dst]
                drop(w.src, f"its {w.type} also feeds stock {stock.type} ({stock.id}), which needs {w.type}")
                changed = True
            elif w.dst in cand:
                drop(w.dst, f"its {w.name} comes from stock {nodes[w.src].type} ({w.src})")
                changed = True
        shared = defaultdict(list)  # a subgraph edge placed twice must carry one type
        for w in engine:
            for seg in w.segments:
                shared[seg].append(w)
        for group in shared.values():
            if len({w.src is not None and swapped(w.src) for w in group}) > 1:
                for w in group:
                    if w.src in cand:
                        drop(w.src, "its subgraph is placed more than once with different models")
                        changed = True
    for lid, encodes in list(split.items()):
        split[lid] = [w for w in encodes if w.dst in cand]
        users = [w.dst for w in by_src[lid] if w.dst is not None and nodes[w.dst].type in STOCK_CLIP_USERS]
        named = ", ".join(f"{nodes[u].type} ({u})" for u in users)
        if split[lid]:
            why[lid] = (f"kept for stock {named}, which needs ComfyUI's CLIP; the encode path reads "
                        f"{fam.roles[nodes[lid].type].ours} from the same file (added)")
        else:
            del split[lid]
            why[lid] = f"its CLIP also feeds stock {named}, which needs CLIP"
    through = {t for t in through if swapped(t)}
    # image savers after the drops (no engine wire reaches them): those of images a sampler of ours makes
    for n in (n for n in nodes.values() if n.type in fam.savers):
        if reaches(n.id, ["images"], {s for s in samplers if swapped(s)}, None):
            cand.add(n.id)
        else:
            why.setdefault(n.id, f"its images come from no {fam.title} sampler")
    for n in nodes.values():
        if n.type in fam.roles and n.id not in cand:
            why.setdefault(n.id, _outside(fam, n.type))
    for vid in list(audio_vaes):  # one loader for both an audio and a video decode (or encode) cannot be both
        video = [w.dst for w in by_src[vid] if w.dst is not None and not _audio(fam, nodes[w.dst].type, w.name)]
        if video and vid in cand:
            drop(vid, f"feeds an audio decode and {nodes[video[0]].type} ({video[0]}): one VAE cannot be both")
            del audio_vaes[vid]
    return Plan(cand, why, through, split, not_yet, audio_vaes)


def _audio(fam: Family, kind: str, name: str | None = None) -> bool:
    """Whether a node (stock or ours) reads the audio VAE (an audio decode, an empty audio latent), or its input
    `name` does (H3's Reference To Video's audio_vae)."""
    stock = fam.ours_roles.get(kind, kind)
    return stock in AUDIO_VAE_READERS or name in AUDIO_VAE_INPUTS.get(stock, ())


def _outside(fam: Family, stock: str) -> str:
    """Why a stock node of one of the family's roles is not part of any of its graphs."""
    if stock in fam.text_encoders:
        return f"its clip comes from no {fam.text_loader} of type {' or '.join(fam.text_loader_types)}"
    if stock == fam.model_loader or stock in fam.model_patches:
        return f"not on the model path of a {fam.title} sampler"
    if stock == fam.vae_loader:
        return f"feeds no {fam.title} decode" + (" or reference encode" if fam.vae_encoders else "")
    return f"not part of a {fam.title} graph"


def _widgets(fam: Family, node: dict) -> tuple[dict, str | None]:
    """A UI node's widget values by name (for the roles' rules), and a reason it cannot be swapped, if any."""
    role = fam.roles.get(node.get("type"))
    values = node.get("widgets_values") or []
    if role is None or not isinstance(values, list):
        return {}, None if role is None else "its widgets_values are not a list"
    named = dict(zip(role.widgets, values))
    if role.extra_widgets and len(values) != len(role.widgets):
        return named, f"has {len(values)} widget values, {len(role.widgets)} expected"
    linked = {e.get("name") for e in node.get("inputs", []) if e.get("widget") and e.get("link") is not None}
    return named, _refused(role, named, linked)


def _refused(role, values: dict, linked: set) -> str | None:
    for name, allowed in role.accepts:
        if name in values and name not in linked and values[name] not in allowed:
            return f"{name} {values[name]!r} is not one SwiftDiT runs ({', '.join(map(str, allowed))})"
    return None


def _left(fam: Family, node_type: str, why: str | None, sockets: tuple) -> str:
    if why:
        return why
    if node_type in fam.ours_roles or node_type.startswith("SwiftDiT"):
        return "already a SwiftDiT node"
    if node_type in NOTES:
        return "note"
    if fam.vae_loader is None and node_type == "VAELoader" and "VAEDecode" in fam.decoders:
        return f"{fam.title}'s VAE is the stock loader's ({fam.roles['VAEDecode'].ours} reads its weights), stays stock"
    if fam.vae_loader is None and node_type in ("VAELoader", "VAEDecode"):
        return f"{fam.title} has no VAE of SwiftDiT's: its latents decode with the stock VAE, stays stock"
    if node_type == "Reroute":
        return "reroute (frontend only): passes its wire on"
    takes, gives = sockets
    parts = [f"takes {', '.join(takes)}"] if takes else []
    parts += [f"gives {', '.join(gives)}"] if gives else []
    return ", ".join(parts + ["stays stock"]) if parts else "no SwiftDiT counterpart, stays stock"


def _retype(fam: Family, entry: dict) -> None:
    stock = entry.get("type")
    if stock in fam.wire_types:
        entry["type"] = fam.wire_types[stock]
        for key in ("name", "localized_name"):  # outputs are named after their type unless renamed by hand
            if entry.get(key) == stock:
                entry[key] = fam.wire_types[stock]


def _folded(fam: Family, data: dict, fold, core) -> tuple[dict, Report] | None:
    """The swap of `data` with its SamplerCustomAdvanced groups spelled as KSamplers, when the swap takes every one
    of those with the values the group gives our sampler's own widgets (else None: the groups stay as they were)."""
    from .custom_sampler import drop_api, drop_ui, fold_api, fold_ui
    work = copy.deepcopy(data)
    why_dropped = dict(fam.dropped)
    dropped = (drop_ui if fold == "ui" else drop_api)(work, set(why_dropped))
    done = (fold_ui if fold == "ui" else fold_api)(work)
    role = fam.roles.get(fam.sampler)
    extra_names = [name for name, _ in role.extra_widgets] if role else []
    if not done or any(set(f.extra) - set(extra_names) for f in done):
        return None
    out, report = core(work, fam.name)
    swapped = {where for where, old, _ in report.changed if old == "KSampler"}
    ids = [str(f.id) for f in done]
    if not all(any(w == k or w.endswith(f":{k}") for w in swapped) for k in ids):
        return None
    ui = UIEditor(out) if fold == "ui" else None
    for f, where in zip(done, ids):
        at = next(w for w in swapped if w == where or w.endswith(f":{where}"))
        report.folded.append((at, f.what()))
        if fold == "api":
            out[f.id]["inputs"].update(f.extra)
            continue
        values = ui.scope(f.scope).nodes[f.id]["widgets_values"]
        for name, value in f.extra.items():
            values[len(role.widgets) + extra_names.index(name)] = value
    graph = UIGraph(data) if fold == "ui" and dropped else None  # where dropped nodes were placed
    for key, nid, kind in dropped:
        where = str(nid) if key is None else ", ".join(":".join(map(str, p.path + (nid,))) for p in graph.placed()
                                                       if graph.is_instance(p.node) and p.node["type"] == key)
        report.folded.append((where, f"{kind} removed, its model passed on: {why_dropped[kind]}"))
    return out, report


def swap_ui(workflow: dict, family: str = "z_image") -> tuple[dict, Report]:
    """A swapped copy of a UI-format workflow (subgraphs included) and its report."""
    return _swapped(workflow, family, "ui", _swap_ui)


def _swapped(data: dict, family: str, fold: str, core) -> tuple[dict, Report]:
    """core's swap of data, its SamplerCustomAdvanced groups first spelled as KSamplers where the family's row
    asks for it and the swap then takes them all (_folded)."""
    fam = FAMILIES[family]
    folded = _folded(fam, data, fold, core) if fam.custom_sampler else None
    return folded if folded is not None else core(data, family)


def _swap_ui(workflow: dict, family: str) -> tuple[dict, Report]:
    fam, wf = FAMILIES[family], copy.deepcopy(workflow)
    graph = UIGraph(wf)
    everything = list(graph.placed())
    placed = [p for p in everything if not graph.is_instance(p.node) and p.node.get("type") != "Reroute"]
    nodes = {}
    for p in placed:
        named, blocked = _widgets(fam, p.node)
        nodes[p.id] = GNode(p.id, (p.scope.key, p.node["id"]), p.node.get("type"), named, blocked)
    wires = []
    for p in placed:
        for entry in p.node.get("inputs", []):
            if entry.get("link") is not None:
                wires.append(_ui_wire(graph.trace(p.path[:-1], p.scope, entry["link"]), p.id, entry))
    for p in everything:  # subgraph outputs nobody outside reads still carry a type inside
        if graph.is_instance(p.node):
            inner, outs = graph.subgraphs[p.node["type"]], p.node.get("outputs", [])
            for j, port in enumerate(inner.body.get("outputs", [])):
                if not (j < len(outs) and outs[j].get("links")):
                    wires += [_ui_wire(graph.trace(p.path, inner, lid), None, port)
                              for lid in port.get("linkIds", [])]
    p_ = plan(fam, nodes, wires)
    swap, why = p_.swap, p_.why
    report = Report(fam.title, not_yet=p_.not_yet)
    links = {id(raw) for scope in graph.scopes() for raw in scope.raw_links.values()}
    for w in wires:
        ours = w.src in swap or w.src in p_.through or (w.src is None and w.dst in swap)
        if fam.is_engine_wire(w.type) and ours:
            for container, key in w.refs:
                if container[key] in fam.wire_types:
                    container[key] = fam.wire_types[container[key]]
                    report.retyped += id(container) in links
    done = set()
    for p in everything:
        node, kind = p.node, p.node.get("type")
        if graph.is_instance(node):
            continue
        if p.id in swap and nodes[p.id].key not in done:
            done.add(nodes[p.id].key)
            role = fam.roles[kind]
            ours = p_.ours.get(p.id, role.ours)
            node["type"] = ours
            props = node.setdefault("properties", {})
            props.update({"Node name for S&R": ours, "cnr_id": PACK})
            props.pop("ver", None)  # the stock node's ComfyUI version says nothing about ours
            if role.extra_widgets:
                extra = [value for _, value in role.extra_widgets]
                node["widgets_values"] = list(node.get("widgets_values") or []) + extra
            for entry in node.get("inputs", []) + node.get("outputs", []):
                _retype(fam, entry)
            _rename_inputs(role, node, p.scope)
            report.changed.append((p.id, kind, ours))
        elif p.id in p_.through and nodes[p.id].key not in done:
            done.add(nodes[p.id].key)
            for entry in node.get("inputs", []) + node.get("outputs", []):
                _retype(fam, entry)
            report.left.append((p.id, kind, _THROUGH))
        elif p.id not in swap:
            takes = tuple(dict.fromkeys(e.get("type") for e in node.get("inputs", []) if not e.get("widget")))
            gives = tuple(dict.fromkeys(e.get("type") for e in node.get("outputs", [])))
            report.left.append((p.id, kind, _left(fam, kind, why.get(p.id), (takes, gives))))
    for lid, encodes in sorted(p_.split.items()):
        report.added.append(_split_ui(fam, wf, nodes[lid], encodes))
    return wf, report


_THROUGH = "switches between SwiftDiT models: stays stock, its model ports retyped"


def _rename_inputs(role, node: dict, scope) -> None:
    """Our node's inputs by our names (role.renames; links and slots kept), and the unwired stock inputs ours lacks
    taken away, the slots of the links into the inputs after them moved up."""
    renames = dict(role.renames)
    for entry in node.get("inputs", []):
        if entry.get("name") in renames:
            entry["name"] = renames[entry["name"]]
            entry.pop("label", None)  # the stock node's label was the short name: now the name itself
    inputs = node.get("inputs", [])
    for i in reversed(range(len(inputs))):
        if inputs[i].get("link") is None and str(inputs[i].get("name")).startswith(role.lacks or ("\0",)):
            del inputs[i]
            for raw in scope.raw_links.values():
                link = link_view(raw)
                if link["target_id"] == node["id"] and link["target_slot"] > i:
                    _put(raw, "target_slot", link["target_slot"] - 1)


def _split_ui(fam: Family, wf: dict, loader: GNode, encodes: list) -> tuple:
    """Our text encoder loader beside the stock one (same widgets, same widget links), and the encodes' clip links
    moved onto it; (where, our type, why) for the report."""
    ed = UIEditor(wf)
    scope = ed.scope(loader.key[0])
    stock = scope.nodes[loader.key[1]]
    role = fam.roles[stock["type"]]
    x, y = (stock.get("pos") or [0, 0])[:2]
    height = (stock.get("size") or [0, 106])[1]
    ours = ed.add_node(scope, role.ours, (x, y + height + 60), [], [fam.wire_types[t] for t in role.outputs],
                       copy.deepcopy(stock.get("widgets_values") or []))
    ours["inputs"] = [{k: copy.deepcopy(v) for k, v in e.items() if k != "link"} | {"link": None}
                      for e in stock.get("inputs", [])]
    ours["size"] = list(stock.get("size") or ours["size"])
    ours["properties"].update({"cnr_id": PACK})
    if isinstance(stock.get("widgets_values_named"), dict):
        ours["widgets_values_named"] = copy.deepcopy(stock["widgets_values_named"])
    for i, entry in enumerate(stock.get("inputs", [])):
        origin = ed.origin(scope, stock, entry.get("name"))
        if origin is not None:
            ed.add_link(scope, *origin, ours["id"], i)
    for w in encodes:
        ed.reorigin(scope, link_view(w.refs[0][0])["id"], (ours["id"], 0))
    where = ":".join([*loader.id.split(":")[:-1], str(ours["id"])])
    return where, role.ours, f"beside stock {stock['type']} ({loader.id}), which stays for what needs ComfyUI's CLIP"


def _ui_wire(trace, dst: str | None, entry: dict) -> Wire:
    origin = trace.origin
    outs = origin.node.get("outputs", []) if origin else []
    kind = outs[trace.slot].get("type") if trace.slot < len(outs) else entry.get("type")
    return Wire(origin.id if origin else None, trace.slot, dst, entry.get("name"), kind, trace.refs)


def swap_api(prompt: dict, family: str = "z_image") -> tuple[dict, Report]:
    """A swapped copy of an API-format prompt ({id: {class_type, inputs}}) and its report."""
    return _swapped(prompt, family, "api", _swap_api)


def _swap_api(prompt: dict, family: str) -> tuple[dict, Report]:
    fam, out = FAMILIES[family], copy.deepcopy(prompt)
    nodes, wires = {}, []
    for nid, body in out.items():
        kind, inputs = body.get("class_type"), body.get("inputs", {})
        role = fam.roles.get(kind)
        named = {k: v for k, v in inputs.items() if not is_link(v)}
        blocked = _refused(role, named, set()) if role else None
        nodes[nid] = GNode(nid, (None, nid), kind, named, blocked)

    def given(nid, slot, depth=0):  # a known node's output type; a switch gives what it switches between
        kind = fam.output_type(out[nid].get("class_type"), slot)
        for name in fam.switches.get(out[nid].get("class_type"), ()) if kind is None and depth < 100 else ():
            value = out[nid].get("inputs", {}).get(name)
            kind = kind or (given(value[0], value[1], depth + 1) if is_link(value) and value[0] in out else None)
        return kind

    for nid, body in out.items():
        for name, value in body.get("inputs", {}).items():
            if is_link(value):
                src = value[0] if value[0] in out else None
                kind = (given(src, value[1]) if src else None) or fam.socket_type(body.get("class_type"), name)
                wires.append(Wire(src, value[1], nid, name, kind))
    p_ = plan(fam, nodes, wires)
    swap, why = p_.swap, p_.why
    report = Report(fam.title, not_yet=p_.not_yet)
    report.retyped = sum(1 for w in wires if (w.src in swap or w.src in p_.through) and fam.is_engine_wire(w.type))
    for nid, body in list(out.items()):
        kind = body.get("class_type")
        if nid in swap:
            role = fam.roles[kind]
            body["class_type"] = p_.ours.get(nid, role.ours)
            for name, value in role.extra_widgets:
                body.setdefault("inputs", {}).setdefault(name, value)
            renames = dict(role.renames)
            body["inputs"] = {renames.get(k, k): v for k, v in body.get("inputs", {}).items()}
            report.changed.append((nid, kind, body["class_type"]))
        else:
            report.left.append((nid, kind, _THROUGH if nid in p_.through else _left(fam, kind, why.get(nid), ((), ()))))
    for lid, encodes in sorted(p_.split.items()):
        prefix = lid.rsplit(":", 1)[0] + ":" if ":" in lid else ""
        last = [int(k.rsplit(":", 1)[-1]) for k in out if k.rsplit(":", 1)[-1].isdigit()]
        new = f"{prefix}{max(last, default=0) + 1}"
        role = fam.roles[out[lid]["class_type"]]
        out[new] = {"class_type": role.ours, "inputs": copy.deepcopy(out[lid].get("inputs", {}))}
        for w in encodes:
            out[w.dst]["inputs"][w.name] = [new, 0]
        report.added.append((new, role.ours, f"beside stock {out[lid]['class_type']} ({lid}), which stays for "
                                             f"what needs ComfyUI's CLIP"))
    return out, report


def detect_format(data) -> str:
    """'ui' for a graph-editor workflow, 'api' for a prompt; ValueError for anything else."""
    if isinstance(data, dict) and isinstance(data.get("nodes"), list):
        return "ui"
    if isinstance(data, dict) and data and all(isinstance(v, dict) and "class_type" in v
                                               for v in data.values()):
        return "api"
    raise ValueError("not a ComfyUI workflow: neither UI format (a 'nodes' list) nor API format "
                     "({id: {class_type, inputs}})")


def swap(data: dict, family: str = "z_image", fmt: str | None = None) -> tuple[dict, Report]:
    """Swap a workflow of either format; `fmt` ('ui' or 'api'), when given, must match what the data is.
    `family` 'auto' tries every family and keeps the one that swaps something (an error if several do)."""
    if family == "auto":
        results = {name: swap(data, name, fmt) for name in FAMILIES}
        hits = [name for name, (_, report) in results.items() if report.changed]
        if len(hits) > 1:
            raise ValueError(f"several families match ({', '.join(hits)}): pass --family")
        # nothing swapped: the family whose graph it is but cannot take yet says why, else the first family
        hits = hits or [name for name, (_, report) in results.items() if report.not_yet]
        return results[hits[0] if hits else next(iter(FAMILIES))]
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(sorted(FAMILIES))}")
    found = detect_format(data)
    if fmt not in (None, found):
        raise ValueError(f"this is a {found}-format workflow, not {fmt} format")
    return swap_ui(data, family) if found == "ui" else swap_api(data, family)
