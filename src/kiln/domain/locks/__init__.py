"""Locks: what an engine image installs (engine locks), how one is made and checked against
the index, and the failures the in-image half reports.
"""
