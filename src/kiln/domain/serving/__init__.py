"""Serving: the launch command, the serving container, multi-node runs on one host,
Kubernetes manifests, and filling a model cache.
"""
