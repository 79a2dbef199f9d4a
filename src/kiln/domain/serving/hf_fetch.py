"""`kiln fetch`: fill a Hugging Face cache with a recipe's pinned snapshots, where the hub
is reachable, so that serving never downloads (it runs with HF_HUB_OFFLINE=1)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kiln.basics.errors import FetchFailed, HfSnapshotMissing
from kiln.inimage.hf_cache import HfModel, check

# download(repo, revision, cache) fills `cache` the way huggingface_hub.snapshot_download does
_Downloader = Callable[[str, str, Path], None]


@dataclass(frozen=True)
class _Fetched:
    model: HfModel
    downloaded: bool  # False: the snapshot was complete already


def _hub_download(repo: str, revision: str, cache: Path) -> None:
    """The hub client's own download (resumes partial files, verifies sizes and hashes)."""
    try:
        # late: optional, only `kiln fetch` needs the hub client
        import huggingface_hub  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise FetchFailed(
            "kiln fetch needs the huggingface_hub package on this host",
            hint="pip install huggingface_hub (or fill the cache with `hf download` elsewhere)",
        ) from None
    huggingface_hub.snapshot_download(repo_id=repo, revision=revision, cache_dir=str(cache))


def fetch(
    models: list[HfModel],
    cache: Path,
    *,
    download: _Downloader = _hub_download,
    say: Callable[[str], None] = lambda _: None,
) -> list[_Fetched]:
    """Download each snapshot not yet complete in `cache`, then check it; FetchFailed
    when a download fails (one line: repo, revision, the hub's reason), HfSnapshotMissing
    when the download left it incomplete."""
    done = []
    cache.mkdir(parents=True, exist_ok=True)
    for model in models:
        if check(cache, model) is None:
            say(f"{model.repo}@{model.revision[:12]}: complete in {cache}")
            done.append(_Fetched(model, downloaded=False))
            continue
        say(f"{model.repo}@{model.revision[:12]}: downloading into {cache}")
        try:
            download(model.repo, model.revision, cache)
        except FetchFailed:
            raise
        except Exception as exc:  # the hub client raises many kinds; each becomes one line  # noqa: BLE001
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise FetchFailed(
                f"{model.role} model {model.repo} at revision {model.revision}: download failed: "
                f"{type(exc).__name__}: {reason}"
            ) from None
        missing = check(cache, model)
        if missing is not None:
            raise HfSnapshotMissing([f"after the download: {missing.line}"])
        done.append(_Fetched(model, downloaded=True))
    return done
