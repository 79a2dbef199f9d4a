"""Reproducible images: source dates, `docker save` archive normalisation, the step that
normalises a fresh build before it is tagged, and where two images differ.

May use: infra (git, the daemon), basics; nothing else of the domain.
"""
