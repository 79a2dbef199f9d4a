"""kiln-engine: kiln's own engine features, installed into every kiln engine image.

Loaded by vLLM as a general plugin (entry point group ``vllm.general_plugins``) in
every vLLM process; see ``plugin.py``. Importing this package is cheap and never
imports vLLM, torch or triton.
"""

__version__ = "0.1.0"
