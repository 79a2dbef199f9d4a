"""Options several commands share, so each spells the same flag with the same help."""

from __future__ import annotations

import argparse


def reports(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A command that reports something: --json prints one document on stdout
    (schema: src/kiln/schemas/<command>.json, docs/cli-json.md)."""
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout (docs/cli-json.md)")
    return parser
