"""Serving: the launch command, the serving container, multi-node runs on one host,
Kubernetes manifests, and filling a model cache.

May use: recipes; infra (the daemon), basics, inimage (the HF cache check).
"""
