"""SamplerCustomAdvanced groups spelled as one KSampler, for families whose templates sample that way (MiniMax H3's,
LTX-2.5's, Krea 2's style reference): RandomNoise's seed, the guider's model and conditioning (BasicGuider's for
positive and negative, which cfg 1 never reads; CFGGuider's positive, negative and cfg; LTXVDualCFGGuider's positive
and negative, its video_cfg as cfg), the latent, KSamplerSelect's sampler (or SamplerEulerAncestral's: its eta and
s_noise go with the fold), and BasicScheduler's steps and scheduler
or ManualSigmas' list (steps = its sigmas - 1, scheduler 'manual'); what our sampler takes beyond KSampler's widgets
(ManualSigmas' text, the guider's audio_cfg) goes with the fold as its extra widgets. Also the MODEL -> MODEL nodes a
family's row drops (H3's ModelAttentionBackend) taken off the model path first. The swap then swaps the KSampler like
any other (its row says which samplers and schedulers ours runs); when it does not, the graph is left as it was."""
from __future__ import annotations

from dataclasses import dataclass, field

from dit_core.sampling.ltx25 import manual_sigmas

from .ui_edit import UIEditor
from .workflow_api import is_link

# the group's node kinds by SamplerCustomAdvanced input, with their widgets in UI order (None: the frontend's own)
GROUP = {"noise": {"RandomNoise": ("noise_seed", None)},
         "guider": {"BasicGuider": (), "CFGGuider": ("cfg",), "LTXVDualCFGGuider": ("video_cfg", "audio_cfg")},
         "sampler": {"KSamplerSelect": ("sampler_name",), "SamplerEulerAncestral": ("eta", "s_noise")},
         "sigmas": {"BasicScheduler": ("scheduler", "steps", "denoise"), "ManualSigmas": ("sigmas",)}}
# the guider's inputs that give KSampler's positive and negative
CONDITIONING = {"BasicGuider": ("conditioning", "conditioning"), "CFGGuider": ("positive", "negative"),
                "LTXVDualCFGGuider": ("positive", "negative")}
CFG = {"CFGGuider": "cfg", "LTXVDualCFGGuider": "video_cfg"}  # the guider's widget that is KSampler's cfg
CFG_SHOWN = {"CFGGuider": "CFGGuider's cfg"}
KSAMPLER_INPUTS = (("model", "MODEL"), ("positive", "CONDITIONING"), ("negative", "CONDITIONING"),
                   ("latent_image", "LATENT"))
GROUP_WIDGETS = {kind: names for kinds in GROUP.values() for kind, names in kinds.items()}
# widgets whose value must be known to spell the group (a wired one leaves the group as it is)
FIXED = ("denoise", "cfg", "video_cfg", "audio_cfg", "sigmas", "eta", "s_noise")
# sampler nodes with widgets of their own: KSampler's sampler_name, and those widgets as our sampler's extra widgets
# (a family whose sampler lacks them keeps the group as it is)
SAMPLER_NODES = {"SamplerEulerAncestral": "euler_ancestral"}


@dataclass
class Folded:
    """One group spelled as a KSampler: where (scope key, KSampler id), the group's node types, its sampler and
    scheduler, and the values of our sampler's own widgets it sets (`extra`)."""
    scope: object
    id: object
    kinds: tuple                 # the group's node types, in GROUP's order
    sampler: str
    scheduler: str
    extra: dict = field(default_factory=dict)

    def what(self) -> str:
        """The swap report's line."""
        noise, guider, select, sigmas = self.kinds
        told = "".join(f", {k} {v!r}" for k, v in self.extra.items() if k != "sigmas")
        return (f"{noise}, {guider}, {select} ({self.sampler}), {sigmas} ({self.scheduler}) and SamplerCustomAdvanced "
                f"-> one KSampler (seed, steps, sampler, scheduler, the guider's model and conditioning, cfg"
                f"{' = ' + CFG_SHOWN.get(guider, CFG[guider]) if guider in CFG else ' 1'}{told})")


def spelled(kinds: dict, values: dict) -> tuple[dict, dict] | None:
    """KSampler's values (seed, steps, cfg, sampler_name, scheduler) and our sampler's extra widgets for a group:
    kinds and values (widget name -> value) by SamplerCustomAdvanced input; None when the scheduler does not
    sample a whole schedule (denoise other than 1, fewer than two sigmas)."""
    noise, guider, select, sigmas = (values[k] for k in GROUP)
    extra = {"audio_cfg": guider["audio_cfg"]} if "audio_cfg" in guider else {}
    sampler_name = select.get("sampler_name")
    if kinds["sampler"] in SAMPLER_NODES:
        sampler_name = SAMPLER_NODES[kinds["sampler"]]
        extra |= {name: select.get(name) for name in GROUP["sampler"][kinds["sampler"]]}
    if kinds["sigmas"] == "ManualSigmas":
        steps, scheduler = len(manual_sigmas(str(sigmas.get("sigmas", "")))) - 1, "manual"
        extra["sigmas"] = sigmas.get("sigmas")
        if steps < 1:
            return None
    else:
        if sigmas.get("denoise") != 1:
            return None
        steps, scheduler = sigmas.get("steps"), sigmas.get("scheduler")
    cfg = guider.get(CFG[kinds["guider"]], 1.0) if kinds["guider"] in CFG else 1.0
    return {"seed": noise.get("noise_seed"), "steps": steps, "cfg": cfg,
            "sampler_name": sampler_name, "scheduler": scheduler}, extra


def denoised_is_output(kinds: dict, values: dict) -> bool:
    """Whether SamplerCustomAdvanced's denoised_output equals its output, so that what reads it may read our
    sampler's (the flf2v template reads it): the schedule ends at sigma 0, where the last step returns its x0 (the
    denoised value the callback keeps) and the inverse noise scaling is the identity."""
    if kinds["sigmas"] == "ManualSigmas":
        return manual_sigmas(str(values["sigmas"].get("sigmas", "")))[-1:].tolist() == [0.0]
    return True  # BasicScheduler at denoise 1: every scheduler's list ends at 0


# MODEL -> MODEL nodes that leave the model's sampling as it is: a scheduler may read the model above them (H3's r2v
# template: BasicScheduler on the loader, the guider after the LoRA switch), with the inputs that pass the model
SAME_SAMPLING = {"LoraLoaderModelOnly": ("model",), "ComfySwitchNode": ("on_false", "on_true")}


def _same_sampling_ui(ed: UIEditor, scope, guider_model, sched_model) -> bool:
    """Whether the scheduler's model origin is the guider's, or above it through SAME_SAMPLING nodes only."""
    todo, seen = [guider_model], set()
    while todo:
        origin = todo.pop()
        if origin == sched_model:
            return True
        node = scope.nodes.get(origin[0]) if origin else None
        if node is None or origin in seen or node.get("type") not in SAME_SAMPLING:
            continue
        seen.add(origin)
        todo += [o for name in SAME_SAMPLING[node["type"]] if (o := ed.origin(scope, node, name)) is not None]
    return False


def _same_sampling_api(prompt: dict, guider_model, sched_model) -> bool:
    todo, seen = [guider_model], set()
    while todo:
        ref = todo.pop()
        if ref == sched_model:
            return True
        node = prompt.get(ref[0]) if is_link(ref) else None
        if node is None or tuple(ref) in seen or node.get("class_type") not in SAME_SAMPLING:
            continue
        seen.add(tuple(ref))
        todo += [v for name in SAME_SAMPLING[node["class_type"]] if is_link(v := node.get("inputs", {}).get(name))]
    return False


def _group_ui(ed: UIEditor, scope, sca: dict) -> dict | None:
    """The group's nodes by input name, when they are the plain group: each feeds only this sampler, a
    BasicScheduler runs the guider's model (or one above it with the same sampling)."""
    group = {}
    for name, kinds in GROUP.items():
        origin = ed.origin(scope, sca, name)
        node = scope.nodes.get(origin[0]) if origin else None
        if node is None or node.get("type") not in kinds or node.get("mode") not in (0, None):
            return None
        if any(len(out.get("links") or []) != (1 if i == 0 else 0) for i, out in enumerate(node["outputs"])):
            return None
        group[name] = node
    sched = group["sigmas"]
    guider_model = ed.origin(scope, group["guider"], "model")
    if sched["type"] == "BasicScheduler" and not _same_sampling_ui(ed, scope, guider_model,
                                                                   ed.origin(scope, sched, "model")):
        return None
    return group


def fold_ui(workflow: dict) -> list[Folded]:
    """Fold every plain group of `workflow` (edited in place) into a KSampler."""
    ed = UIEditor(workflow)
    done = []
    for scope in ed.graph.scopes():
        for sca in [n for n in scope.body.get("nodes", []) if n.get("type") == "SamplerCustomAdvanced"]:
            group = _group_ui(ed, scope, sca)
            if group is None:
                continue
            noise, guider, select, sched = (group[k] for k in GROUP)
            if any(ed.origin(scope, n, k) for n in group.values() for k in FIXED):
                continue
            # the seed, steps, sampler and scheduler a subgraph promotes stay wired (below)
            values = {k: dict(zip(GROUP_WIDGETS[n["type"]], n.get("widgets_values") or [])) for k, n in group.items()}
            kinds = {k: n["type"] for k, n in group.items()}
            got = spelled(kinds, values)
            if got is None:
                continue
            ks_values, extra = got
            outs = sca.get("outputs", [])
            denoised = len(outs) > 1 and bool(outs[1].get("links"))
            if denoised and not denoised_is_output(kinds, values):
                continue
            control = (noise.get("widgets_values") or [0, "randomize"])[1:2] or ["randomize"]
            widgets = [ks_values["seed"], control[0], ks_values["steps"], ks_values["cfg"], ks_values["sampler_name"],
                       ks_values["scheduler"], 1.0]
            ks = ed.add_node(scope, "KSampler", sca.get("pos") or (0, 0), list(KSAMPLER_INPUTS), ["LATENT"], widgets)
            ks["inputs"] += [{"name": "seed", "type": "INT", "widget": {"name": "seed"}, "link": None},
                             {"name": "steps", "type": "INT", "widget": {"name": "steps"}, "link": None},
                             {"name": "sampler_name", "type": "COMBO", "widget": {"name": "sampler_name"},
                              "link": None},
                             {"name": "scheduler", "type": "COMBO", "widget": {"name": "scheduler"}, "link": None}]
            ks["size"] = [270, 262]
            positive, negative = CONDITIONING[guider["type"]]
            feeds = [(guider, "model", 0), (guider, positive, 1), (guider, negative, 2), (sca, "latent_image", 3),
                     (noise, "noise_seed", 4), (sched, "steps", 5), (select, "sampler_name", 6),
                     (sched, "scheduler", 7)]
            for node, name, slot in feeds:
                origin = ed.origin(scope, node, name)
                if origin is not None:
                    ed.add_link(scope, origin[0], origin[1], ks["id"], slot)
            for lid in ed.consumers(scope, sca["id"], 0) + (ed.consumers(scope, sca["id"], 1) if denoised else []):
                ed.reorigin(scope, lid, (ks["id"], 0))
            for node in (sca, noise, guider, select, sched):
                ed.remove_node(scope, node)
            done.append(Folded(scope.key, ks["id"], tuple(kinds.values()), ks_values["sampler_name"],
                               ks_values["scheduler"], extra))
    return done


def fold_api(prompt: dict) -> list[Folded]:
    """fold_ui for an API prompt (edited in place): the KSampler takes the SamplerCustomAdvanced's id."""
    done = []
    for sid, body in list(prompt.items()):
        if body.get("class_type") != "SamplerCustomAdvanced":
            continue
        ins = body.get("inputs", {})
        group = {}
        for name, kinds in GROUP.items():
            ref = ins.get(name)
            node = prompt.get(ref[0]) if is_link(ref) else None
            if node is None or node.get("class_type") not in kinds:
                break
            group[name] = ref[0]
        else:
            used = [(k, v) for b in prompt.values() for k, v in b.get("inputs", {}).items() if is_link(v)]
            if any(v[0] == sid and v[1] not in (0, 1) for _, v in used) or \
                    any(sum(v[0] == g for _, v in used) != 1 for g in group.values()):
                continue
            kinds = {k: prompt[g]["class_type"] for k, g in group.items()}
            values = {k: dict(prompt[g].get("inputs", {})) for k, g in group.items()}
            guider, select, sched = values["guider"], values["sampler"], values["sigmas"]
            if is_link(select.get("sampler_name")) or is_link(sched.get("scheduler")) or \
                    any(is_link(v.get(k)) for v in values.values() for k in FIXED) or \
                    (kinds["sigmas"] == "BasicScheduler" and
                     not _same_sampling_api(prompt, guider.get("model"), sched.get("model"))):
                continue
            got = spelled(kinds, values)
            denoised = [v for _, v in used if v[0] == sid and v[1] == 1]
            if got is None or (denoised and not denoised_is_output(kinds, values)):
                continue
            ks_values, extra = got
            for v in denoised:  # what read denoised_output reads the KSampler's output
                v[1] = 0
            for g in group.values():
                del prompt[g]
            positive, negative = CONDITIONING[kinds["guider"]]
            prompt[sid] = {"class_type": "KSampler", "inputs": {
                **ks_values, "denoise": 1.0, "model": guider.get("model"), "positive": guider.get(positive),
                "negative": guider.get(negative), "latent_image": ins.get("latent_image")}}
            done.append(Folded(None, sid, tuple(kinds.values()), ks_values["sampler_name"], ks_values["scheduler"],
                               extra))
    return done


def drop_ui(workflow: dict, kinds) -> list[tuple]:
    """Each node of `kinds` (edited in place) removed, what read its MODEL now reading its model input; returns
    (scope key, node id, type) for each."""
    ed = UIEditor(workflow)
    dropped = []
    for scope in ed.graph.scopes():
        for node in [n for n in scope.body.get("nodes", []) if n.get("type") in kinds and n.get("mode") in (0, None)]:
            ed.pass_through(scope, node, 0, "model")
            ed.remove_node(scope, node)
            dropped.append((scope.key, node["id"], node["type"]))
    return dropped


def drop_api(prompt: dict, kinds) -> list[tuple]:
    """drop_ui for an API prompt (edited in place)."""
    dropped = []
    for nid, body in list(prompt.items()):
        if body.get("class_type") not in kinds or not is_link(body.get("inputs", {}).get("model")):
            continue
        for other in prompt.values():
            for name, value in other.get("inputs", {}).items():
                if is_link(value) and value[0] == nid:
                    other["inputs"][name] = list(body["inputs"]["model"])
        del prompt[nid]
        dropped.append((None, nid, body["class_type"]))
    return dropped
