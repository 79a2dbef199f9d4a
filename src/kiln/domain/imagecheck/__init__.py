"""Checks of a built engine image: its engine versions and the launch command, checked by
the engine's own parser inside the image.
"""
