"""Code that runs inside an image, alone: standard library only, no kiln import.

Each module here is shipped into a build context (the patch applier, the HF cache
reader) or sent to a throwaway container (the launch-argument probe, the SBOM reader),
always through `source()`. The host imports some of them too (hf_cache's readers, the
applier's series parser), which is why they are modules and not data files.
"""

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def source(module: str) -> Path:
    """The file of in-image module `module` (e.g. "hf_cache"), to copy or to send as text."""
    path = _HERE / f"{module}.py"
    if not path.is_file():
        raise FileNotFoundError(f"kiln.inimage has no module {module!r} ({path})")
    return path
