"""Test-host tooling: ComfyUI launcher, server client, random checkpoint set (ComfyUI never imports it)."""
