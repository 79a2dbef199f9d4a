"""A Python distribution's licence as its metadata declares it, as SPDX ids or
expressions where kiln can tell them apart from free-text names."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kiln.domain.supplychain.inventory import PythonDistribution

# SPDX ids kiln recognises in a bare `License:` field (a test checks each against the
# SPDX list CycloneDX's schema carries). Anything else stays a free-text licence name.
_SPDX_IDS = frozenset(
    {
        "0BSD",
        "AFL-2.1",
        "AGPL-3.0-only",
        "AGPL-3.0-or-later",
        "Apache-1.1",
        "Apache-2.0",
        "Artistic-2.0",
        "BSD-1-Clause",
        "BSD-2-Clause",
        "BSD-3-Clause",
        "BSL-1.0",
        "CC-BY-4.0",
        "CC0-1.0",
        "CNRI-Python",
        "EPL-1.0",
        "EPL-2.0",
        "GPL-2.0-only",
        "GPL-2.0-or-later",
        "GPL-3.0-only",
        "GPL-3.0-or-later",
        "HPND",
        "ISC",
        "LGPL-2.1-only",
        "LGPL-2.1-or-later",
        "LGPL-3.0-only",
        "LGPL-3.0-or-later",
        "MIT",
        "MIT-0",
        "MIT-CMU",
        "MPL-1.1",
        "MPL-2.0",
        "NCSA",
        "OpenSSL",
        "PSF-2.0",
        "Python-2.0",
        "Unicode-3.0",
        "Unicode-DFS-2016",
        "Unlicense",
        "WTFPL",
        "X11",
        "Zlib",
        "ZPL-2.1",
    }
)
_SPDX_EXCEPTIONS = frozenset({"LLVM-exception", "Classpath-exception-2.0", "GCC-exception-3.1"})
# Trove classifiers that name exactly one licence version; "Apache Software License",
# "BSD License" and the like do not, so they stay names rather than guessed ids.
_CLASSIFIER_IDS = {
    "MIT License": "MIT",
    "MIT No Attribution License (MIT-0)": "MIT-0",
    "ISC License (ISCL)": "ISC",
    "Mozilla Public License 2.0 (MPL 2.0)": "MPL-2.0",
    "Python Software Foundation License": "PSF-2.0",
    "The Unlicense (Unlicense)": "Unlicense",
    "Zero-Clause BSD (0BSD)": "0BSD",
    "Boost Software License 1.0 (BSL-1.0)": "BSL-1.0",
    "GNU General Public License v2 or later (GPLv2+)": "GPL-2.0-or-later",
    "GNU General Public License v3 or later (GPLv3+)": "GPL-3.0-or-later",
    "GNU Lesser General Public License v3 or later (LGPLv3+)": "LGPL-3.0-or-later",
    "Universal Permissive License (UPL)": "UPL-1.0",
    "zlib/libpng License": "Zlib",
}
_EXPR_TOKEN = re.compile(r"\(|\)|[A-Za-z0-9.+-]+")
NAME_MAX = 120  # a longer licence field is the licence's text, not its name


def _spdx_expression(text: str) -> str | None:
    """`text` when it is an SPDX expression of ids kiln knows (e.g. "MIT OR Apache-2.0"),
    else None."""
    tokens = _EXPR_TOKEN.findall(text)
    if not tokens or "".join(tokens) != re.sub(r"\s+", "", text):
        return None
    expect_operand, after_with, depth = True, False, 0
    for tok in tokens:
        if tok == "(":
            if not expect_operand:
                return None
            depth += 1
        elif tok == ")":
            depth -= 1
            if expect_operand or depth < 0:
                return None
        elif tok in ("AND", "OR", "WITH"):
            if expect_operand:
                return None
            expect_operand, after_with = True, tok == "WITH"
        else:
            known = (tok in _SPDX_EXCEPTIONS) if after_with else (tok.removesuffix("+") in _SPDX_IDS)
            if not expect_operand or not known:
                return None
            expect_operand, after_with = False, False
    return text.strip() if not expect_operand and depth == 0 else None


@dataclass(frozen=True)
class DeclaredLicences:
    """The licence a distribution's metadata declares: an SPDX expression, SPDX ids, free-text names or the text
    itself."""

    expression: str | None  # one SPDX expression, when the metadata gives one
    ids: tuple[str, ...] = ()  # SPDX ids otherwise
    names: tuple[str, ...] = ()  # free-text names otherwise
    text: str = ""  # a License field that is the licence's text, not its name


def declared_licences(dist: PythonDistribution) -> DeclaredLicences:
    """A distribution's licence as its metadata declares it. Precedence: PEP 639's
    License-Expression, then a License field that is an SPDX expression, then classifiers
    (ids only where a classifier names one licence version) and the License field as a
    name; a multi-line License field is the licence text, kept beside the names."""
    expr = (dist.get("license_expression") or "").strip()
    if expr:
        return DeclaredLicences(expression=expr)
    field_text = (dist.get("license") or "").strip()
    if field_text.upper() == "UNKNOWN":
        field_text = ""
    as_expr = _spdx_expression(field_text) if field_text and "\n" not in field_text else None
    if as_expr:
        return DeclaredLicences(expression=as_expr)
    ids: list[str] = []
    names: list[str] = []
    text = ""
    if field_text and ("\n" in field_text or len(field_text) > NAME_MAX):
        text = field_text
    elif field_text:
        names.append(field_text)
    for classifier in dist.get("classifiers") or []:
        leaf = classifier.split("::")[-1].strip()
        if leaf in ("OSI Approved", "") or classifier.strip() == "License :: OSI Approved":
            continue
        if leaf in _CLASSIFIER_IDS:
            ids.append(_CLASSIFIER_IDS[leaf])
        else:
            names.append(leaf)
    if text and not ids and not names:
        names.append(text.splitlines()[0][:NAME_MAX])
    return DeclaredLicences(None, tuple(dict.fromkeys(ids)), tuple(dict.fromkeys(names)), text)
