"""Text encoders: one loading path (loading.py), then a file per encoder (qwen3.py, qwen3_vl.py, gemma4.py);
Qwen3-VL's pictures (vision tower, picture rows and their layout) in qwen3_vl_vision.py."""
