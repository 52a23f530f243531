"""SamplerCustomAdvanced groups spelled as one KSampler, for families whose templates sample that way (MiniMax H3's):
RandomNoise's seed, BasicScheduler's steps, BasicGuider's model and conditioning (the positive, and the negative too:
our sampler runs cfg 1, which never reads it), the latent, KSamplerSelect's sampler and BasicScheduler's scheduler;
and the MODEL -> MODEL nodes a family's row drops (H3's ModelAttentionBackend) taken off the model path first. The
swap then swaps the KSampler like any other (its row says which samplers and schedulers ours runs); when it does
not, the graph is left as it was."""
from __future__ import annotations

from .ui_edit import UIEditor
from .workflow_api import is_link

GROUP = {"noise": "RandomNoise", "guider": "BasicGuider", "sampler": "KSamplerSelect", "sigmas": "BasicScheduler"}
KSAMPLER_INPUTS = (("model", "MODEL"), ("positive", "CONDITIONING"), ("negative", "CONDITIONING"),
                   ("latent_image", "LATENT"))


def _group_ui(ed: UIEditor, scope, sca: dict) -> dict | None:
    """The group's nodes by input name, when they are the plain group: each feeds only this sampler, the scheduler
    runs the guider's model at denoise 1 and denoised_output is unused."""
    group = {}
    for name, kind in GROUP.items():
        origin = ed.origin(scope, sca, name)
        node = scope.nodes.get(origin[0]) if origin else None
        if node is None or node.get("type") != kind or node.get("mode") not in (0, None):
            return None
        if any(len(out.get("links") or []) != (1 if i == 0 else 0) for i, out in enumerate(node["outputs"])):
            return None
        group[name] = node
    outs = sca.get("outputs", [])
    if len(outs) > 1 and outs[1].get("links"):
        return None
    sched = group["sigmas"]
    values = dict(zip(("scheduler", "steps", "denoise"), sched.get("widgets_values") or []))
    if values.get("denoise") != 1 or ed.origin(scope, sched, "denoise"):
        return None
    if ed.origin(scope, sched, "model") != ed.origin(scope, group["guider"], "model"):
        return None
    return group


def fold_ui(workflow: dict) -> list[tuple]:
    """Fold every plain group of `workflow` (edited in place) into a KSampler; returns (scope key, KSampler id,
    sampler_name, scheduler) for each."""
    ed = UIEditor(workflow)
    done = []
    for scope in ed.graph.scopes():
        for sca in [n for n in scope.body.get("nodes", []) if n.get("type") == "SamplerCustomAdvanced"]:
            group = _group_ui(ed, scope, sca)
            if group is None:
                continue
            noise, guider, select, sched = (group[k] for k in GROUP)
            seed = (noise.get("widgets_values") or [0, "randomize"])
            scheduler, steps = sched["widgets_values"][:2]
            sampler = select["widgets_values"][0]
            widgets = [seed[0], seed[1] if len(seed) > 1 else "randomize", steps, 1.0, sampler, scheduler, 1.0]
            ks = ed.add_node(scope, "KSampler", sca.get("pos") or (0, 0), list(KSAMPLER_INPUTS), ["LATENT"], widgets)
            # the widgets the group's nodes take from elsewhere (a subgraph's promoted values) stay wired
            ks["inputs"] += [{"name": "seed", "type": "INT", "widget": {"name": "seed"}, "link": None},
                             {"name": "steps", "type": "INT", "widget": {"name": "steps"}, "link": None},
                             {"name": "sampler_name", "type": "COMBO", "widget": {"name": "sampler_name"},
                              "link": None},
                             {"name": "scheduler", "type": "COMBO", "widget": {"name": "scheduler"}, "link": None}]
            ks["size"] = [270, 262]
            feeds = [(guider, "model", 0), (guider, "conditioning", 1), (guider, "conditioning", 2),
                     (sca, "latent_image", 3), (noise, "noise_seed", 4), (sched, "steps", 5),
                     (select, "sampler_name", 6), (sched, "scheduler", 7)]
            for node, name, slot in feeds:
                origin = ed.origin(scope, node, name)
                if origin is not None:
                    ed.add_link(scope, origin[0], origin[1], ks["id"], slot)
            for lid in ed.consumers(scope, sca["id"], 0):
                ed.reorigin(scope, lid, (ks["id"], 0))
            for node in (sca, noise, guider, select, sched):
                ed.remove_node(scope, node)
            done.append((scope.key, ks["id"], sampler, scheduler))
    return done


def fold_api(prompt: dict) -> list[tuple]:
    """fold_ui for an API prompt (edited in place): the KSampler takes the SamplerCustomAdvanced's id."""
    done = []
    for sid, body in list(prompt.items()):
        if body.get("class_type") != "SamplerCustomAdvanced":
            continue
        ins = body.get("inputs", {})
        group = {}
        for name, kind in GROUP.items():
            ref = ins.get(name)
            node = prompt.get(ref[0]) if is_link(ref) else None
            if node is None or node.get("class_type") != kind:
                break
            group[name] = ref[0]
        else:
            used = [(k, v) for b in prompt.values() for k, v in b.get("inputs", {}).items() if is_link(v)]
            if any(v[0] == sid and v[1] != 0 for _, v in used) or \
                    any(sum(v[0] == g for _, v in used) != 1 for g in group.values()):
                continue
            noise, guider, select, sched = (prompt[group[k]]["inputs"] for k in GROUP)
            if sched.get("denoise") != 1 or sched.get("model") != guider.get("model") or \
                    is_link(select.get("sampler_name")) or is_link(sched.get("scheduler")):
                continue
            sampler, scheduler = select.get("sampler_name"), sched.get("scheduler")
            for g in group.values():
                del prompt[g]
            prompt[sid] = {"class_type": "KSampler", "inputs": {
                "seed": noise.get("noise_seed"), "steps": sched.get("steps"), "cfg": 1.0, "sampler_name": sampler,
                "scheduler": scheduler, "denoise": 1.0, "model": guider.get("model"),
                "positive": guider.get("conditioning"), "negative": guider.get("conditioning"),
                "latent_image": ins.get("latent_image")}}
            done.append((None, sid, sampler, scheduler))
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
