"""Planning: does a recipe fit its GPUs (model shape, memory, accelerators).

May use: recipes, serving's launch document; basics, inimage (the HF cache layout).
Never the Docker daemon, images or the serving container (an import contract): a baked
model's config.json is read by the caller and handed in (`plan_input(image_json=...)`).
"""
