"""Text encoders: one loading path (loading.py), then a file per encoder (qwen3.py, qwen3_vl.py)."""
