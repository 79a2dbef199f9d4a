"""Recipes: the schema and its loader, overrides, topology, the engine's features, env and
speculative-decoding rules, the catalogue. Uses basics, infra (none of the daemon) and inimage.
"""
