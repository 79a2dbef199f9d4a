"""Planning: does a recipe fit its GPUs (model shape, memory, accelerators). Never
imports the Docker daemon.
"""
