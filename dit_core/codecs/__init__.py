"""Decoders and encoders of pixels (and, later, of sound): the layers they share (conv.py), then a file per codec."""
