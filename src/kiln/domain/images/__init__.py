"""Images: what goes into each image (definitions, labels), deterministic build contexts, CA
bundles, the wheelhouse, and JSON read back out of a built recipe image.

May use: recipes, patching, locks, reproducible, serving (launch.json); infra, basics,
inimage (the files shipped into contexts, through `kiln.inimage.source`).
"""
