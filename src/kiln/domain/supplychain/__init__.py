"""Supply chain documents: the SBOM read from an image (CycloneDX, SPDX), package URLs,
SLSA provenance, and the attestations a signed publish attaches. Never imports serving.
"""
