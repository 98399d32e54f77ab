"""Profiles: the format (types), where they come from (Sailor import, roofline estimate,
files on disk) and the per-layer memory model derived from a model's shape.

types.py is the shared contract; store.py is the only module here that touches files
besides the Sailor importer (sailor.py).
"""
