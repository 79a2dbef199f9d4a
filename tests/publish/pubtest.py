"""What the publish tests share: the recipe they publish and a handle on its build."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from kilntest import passing_smoke_record, run_kiln
from localregistry import LocalRegistry

# its own name (the recipe is kiln-test-mini, renamed): other build tests clear
# kiln/kiln-test-mini images, which must not pull the image from under these tests
NAME = "kiln-test-publish"
REPOSITORY = "kiln-test/mini"
PUBLISH_SECTION = f"""
publish:
  repository: {REPOSITORY}
  channels: [experimental, stable]
"""


@dataclass
class Mini:
    """The built kiln-test-mini and everything a test needs to drive `kiln` at it."""

    root: Path
    results: Path
    docker_config: Path
    image_id: str
    short: str  # input digest, 12 hex: the digest tag
    input_digest: str
    engine_tag: str
    outputs: list  # every CompletedProcess, for the credential scan

    def env(self, registry: LocalRegistry | None = None, **extra) -> dict[str, str]:
        env = {
            "KILN_ROOT": str(self.root),
            "KILN_RESULTS_DIR": str(self.results),
            # an empty docker config: the tests never see the developer's logins
            "DOCKER_CONFIG": str(self.docker_config),
            "KILN_REGISTRY_USER": "",
            "KILN_REGISTRY_PASSWORD": "",
        }
        if registry is not None:
            env.update(registry.env())
        env.update(extra)
        return env

    def kiln(
        self,
        *args: str,
        registry: LocalRegistry | None = None,
        # as subprocess.run names it
        input: str | None = None,  # noqa: A002
        **extra,
    ):
        result = run_kiln(*args, env=self.env(registry, **extra), cwd=self.root, input=input)
        self.outputs.append(result)
        return result

    def pass_smoke(self, image_id: str | None = None) -> Path:
        from kiln.infra.records import write_smoke_record

        return write_smoke_record(
            passing_smoke_record(
                image_id or self.image_id,
                NAME,
                time=dt.datetime.now(dt.UTC).isoformat(),
                note="written by the publish tests",
            )
        )

    def forget_smoke(self, image_id: str | None = None) -> None:
        from kiln.infra.records import record_path

        record_path(image_id or self.image_id).unlink(missing_ok=True)
