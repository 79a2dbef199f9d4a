"""Code that runs inside an image, alone: standard library only, no kiln import.

Each module here is shipped into a build context (the patch applier, the HF cache
reader) or sent to a throwaway container (the launch-argument probe, the SBOM reader),
always through `source()` (or `script()`, which joins several into one). The host imports
some of them too (hf_cache's readers, the applier's series parser), which is why they are
modules and not data files.
"""

import re
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# Python takes a __future__ import only at the top of a script (a SyntaxError anywhere else)
_FUTURE = re.compile(r"^from __future__ import annotations\n", re.MULTILINE)


def source(module: str) -> Path:
    """The file of in-image module `module` (e.g. "hf_cache"), to copy or to send as text."""
    path = _HERE / f"{module}.py"
    if not path.is_file():
        raise FileNotFoundError(f"kiln.inimage has no module {module!r} ({path})")
    return path


def script(first: str, *rest: str) -> str:
    """The text of one `python -c` script made of in-image modules: their sources joined in
    the order given, a blank line between two.

    In the script they share one namespace: a module reads the names of those before it as
    globals (on the host it imports them, under `if TYPE_CHECKING or __package__:`, which
    `python -c` leaves unset), and no two bind the same top-level name. Each module has
    `from __future__ import annotations` once: the first one's line stays and covers the
    whole text, the others' is left out (the only change to the sources), so every module
    means in the script what it means on the host."""
    modules = (first, *rest)
    texts = [source(module).read_text(encoding="utf-8") for module in modules]
    for module, text in zip(modules, texts, strict=True):
        if len(_FUTURE.findall(text)) != 1:
            raise ValueError(f"kiln.inimage.{module}: needs `from __future__ import annotations` once, at its top")
    return "\n".join([texts[0], *(_FUTURE.sub("", text, count=1) for text in texts[1:])])
