"""Publishing: the rules of publishing (`rules`: registry and repository, channels,
tags, the smoke evidence, a multi-platform set's input digest). Uses recipes and images.
"""
