"""Checks of a built engine image: its engine versions and the launch command, checked by
the engine's own parser inside the image.

May use: recipes, images, serving (the launch document); infra (the daemon), basics,
inimage (the launch probe it sends into the image).
"""
