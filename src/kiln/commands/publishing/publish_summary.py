"""The summary `kiln publish` ends with: what was published where, under which tags, on
what smoke evidence and signature, and its record."""

from __future__ import annotations

from kiln.basics import image_ref, log
from kiln.basics.paths import shown_home
from kiln.domain.publishing.publish_records import PublishResult
from kiln.domain.publishing.smoke_gate import SMOKE_LABEL


def report(r: PublishResult) -> None:
    log.summary(
        f"published {r.recipe}" if r.pushed else f"{r.recipe} already published (push skipped)",
        {
            "manifest digest": r.manifest_digest,
            "image id": r.image_id,
            "input digest": r.input_digest,
            "tags": ", ".join(str(image_ref.parse(t).tag) for t in r.tags),
            **(
                {"platforms": ", ".join(f"{p} ({d['manifest_digest'][:19]})" for p, d in r.platforms.items())}
                if r.platforms
                else {}
            ),
            "channel": r.channel or "none (not smoke-tested)",
            "smoke check": _smoke_said(r),
            **(
                {
                    "signature": f"{r.signature['signature_tag']} + {r.signature['attestation_tag']} verified "
                    f"(key {r.signature['key_fingerprint']})"
                }
                if r.signature
                else {}
            ),
            "record": shown_home(r.record),
        },
    )


def _smoke_said(r: PublishResult) -> str:
    """The summary's smoke line: a pass proved only inside the image says so, per platform."""
    if r.smoke["status"] == "skipped":
        return f"SKIPPED (--skip-smoke-check; labelled {SMOKE_LABEL}=skipped, no channel or input-digest tag)"
    levels = (
        {p: d.get("smoke_level", "served") for p, d in r.platforms.items()}
        if r.platforms
        else {"": r.smoke.get("level", "served")}
    )
    in_image = [p for p, level in levels.items() if level == "in-image"]
    if not in_image:
        return "passed"
    where = f" on {', '.join(in_image)}" if any(in_image) else ""
    return f"passed in-image{where} (proved inside the image, not served)"
