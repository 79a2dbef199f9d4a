"""Signing: cosign-format keys, cosign's registry formats (signatures, attestations), and
signing and verifying a pushed image. Never imports serving.
"""
