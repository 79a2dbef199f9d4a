"""`kiln publish` and `kiln promote`: arguments and what they print (the use-cases, and
the tags and their order: kiln.usecases.publish)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kiln.basics import image_ref, log
from kiln.basics.paths import shown_home
from kiln.commands.options import Subparsers
from kiln.domain.publishing.publish_records import PublishResult, promote_document, publish_document
from kiln.domain.publishing.smoke_gate import SMOKE_LABEL, UNSMOKED_SUFFIX
from kiln.domain.recipes.resolved import resolve_recipe
from kiln.infra import credentials
from kiln.usecases.publish import promote, publish


def _report(result: PublishResult) -> None:
    """The summary `kiln publish` ends with: what was published where, under which tags,
    on what smoke evidence and signature, and its record."""
    log.summary(
        f"published {result.recipe}" if result.pushed else f"{result.recipe} already published (push skipped)",
        {
            "manifest digest": result.manifest_digest,
            "image id": result.image_id,
            "input digest": result.input_digest,
            "tags": ", ".join(str(image_ref.parse(t).tag) for t in result.tags),
            **(
                {"platforms": ", ".join(f"{p} ({d['manifest_digest'][:19]})" for p, d in result.platforms.items())}
                if result.platforms
                else {}
            ),
            "channel": result.channel or "none (not smoke-tested)",
            "smoke check": _smoke_said(result),
            **(
                {
                    "signature": f"{result.signature['signature_tag']} + {result.signature['attestation_tag']} "
                    f"verified (key {result.signature['key_fingerprint']})"
                }
                if result.signature
                else {}
            ),
            "record": shown_home(result.record),
        },
    )


def _smoke_said(result: PublishResult) -> str:
    """The summary's smoke line: a pass proved only inside the image says so, per platform."""
    if result.smoke["status"] == "skipped":
        return f"SKIPPED (--skip-smoke-check; labelled {SMOKE_LABEL}=skipped, no channel or input-digest tag)"
    levels = (
        {p: d.get("smoke_level", "served") for p, d in result.platforms.items()}
        if result.platforms
        else {"": result.smoke.get("level", "served")}
    )
    in_image = [p for p, level in levels.items() if level == "in-image"]
    if not in_image:
        return "passed"
    where = f" on {', '.join(in_image)}" if any(in_image) else ""
    return f"passed in-image{where} (proved inside the image, not served)"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("name")
    p.add_argument(
        "--registry",
        help="[http://|https://]HOST[:PORT][/NAMESPACE] (default: the recipe's "
        "publish.registry); without a scheme: HTTP for loopback, else HTTPS",
    )
    p.add_argument("--plain-http", action="store_true", help="talk HTTP, not HTTPS (same as writing http://HOST)")
    p.add_argument(
        "--password-stdin",
        action="store_true",
        help=f"read the password from stdin (user from ${credentials.USER_ENV})",
    )


def _cmd_publish(args: argparse.Namespace) -> int:
    result = publish(
        resolve_recipe(args.name),
        registry=args.registry,
        channel=args.channel,
        skip_smoke_check=args.skip_smoke_check,
        plain_http=args.plain_http,
        password_stdin=args.password_stdin,
        sign_key=Path(args.sign) if args.sign else None,
    )
    _report(result)
    if args.json:
        log.emit_json(publish_document(result))
    else:
        log.out.print(result.pinned, markup=False)  # stdout: the one machine-readable line
    return 0


def _cmd_promote(args: argparse.Namespace) -> int:
    result = promote(
        resolve_recipe(args.name),
        from_channel=args.from_channel,
        to_channel=args.to_channel,
        registry=args.registry,
        plain_http=args.plain_http,
        password_stdin=args.password_stdin,
        key=Path(args.key) if args.key else None,
    )
    source, dest = result.from_channel, result.to_channel
    log.summary(
        f"promoted {result.recipe}: {source} -> {dest}"
        if result.moved
        else f"{dest} already points at {source}'s image",
        {
            "manifest digest": result.manifest_digest,
            "image id": result.image_id,
            "tag": f"{result.registry}/{result.repository}:{dest}",
            "record": shown_home(result.record),
        },
    )
    if args.json:
        log.emit_json(promote_document(result))
    else:
        log.out.print(result.pinned, markup=False)
    return 0


def register(sub: Subparsers) -> None:
    """Add `kiln publish` and `kiln promote` to the `kiln` subparsers."""
    p = sub.add_parser("publish", help="push a built, smoke-tested image to a registry")
    _common(p)
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout (docs/cli-json.md)")
    p.add_argument("--channel", default=None, help="channel tag to move (default: experimental)")
    p.add_argument(
        "--skip-smoke-check",
        action="store_true",
        help=f"publish without a passing smoke record: only as <digest12>{UNSMOKED_SUFFIX}, "
        f"labelled {SMOKE_LABEL}=skipped, no channel",
    )
    p.add_argument(
        "--sign",
        metavar="KEY",
        help="sign the pushed digest with this cosign private key and attach "
        "SBOM and provenance attestations, verified before any consumer tag "
        "(password from KILN_SIGNING_PASSWORD or typed)",
    )
    p.set_defaults(func=_cmd_publish)
    p = sub.add_parser("promote", help="point one channel at another's image (no rebuild, no re-push)")
    _common(p)
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout (docs/cli-json.md)")
    p.add_argument("--from", dest="from_channel", required=True)
    p.add_argument("--to", dest="to_channel", required=True)
    p.add_argument(
        "--key",
        metavar="PUB",
        help="verify the image's signature and attestations with this public key "
        "before the channel moves (default: the recipe's publish.public_key)",
    )
    p.set_defaults(func=_cmd_promote)
