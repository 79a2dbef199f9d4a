"""Images: what goes into each image (specs, labels), deterministic build contexts, CA
bundles, the wheelhouse.
"""
