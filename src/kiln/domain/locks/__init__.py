"""Locks: what an engine image installs (engine locks), the base image's spec and package
lock, how a lock is made and checked against the index, and the failures the in-image
half reports.

May use: recipes; infra (the index, uv, the wheel cache, the daemon for the Debian
closure), basics.
"""
