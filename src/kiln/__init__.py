"""kiln: per-model serving-image recipes on a patched vLLM engine."""

__version__ = "0.1.0"
