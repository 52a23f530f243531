"""Sampling: ComfyUI's KSampler loop and samplers (ksampler.py), its sigma schedules (schedules.py), the step cache
(step_cache.py), and a family's own loop in its own file (klein.py; minimax_h3.py: H3's two streams)."""
