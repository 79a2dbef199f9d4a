"""The one place kiln talks to the Docker daemon (through the docker SDK).

Everything above this package speaks in kiln terms (build this context, does this tag
exist, run this container); the SDK's quirks and the daemon's stream formats stay here.
This module is the package's public surface; its parts:

- `daemon`: `DockerDaemon`, the facade every caller holds (images, pulls, networks)
- `faults`: `_daemon(doing)`, the one translation of the SDK's exceptions (`DockerError`)
- `building`: builds and pushes, the two long streams, with their failures typed
- `streams`: the build, push and pull streams read into results and events (a display
  from `kiln.basics.progress` shows them)
- `containers`: `Container` and `ExecResult`
- `throwaway_runs`: scripts and commands run in a throwaway container of an image
- `config`: registry names and the docker config's credentials, as the SDK resolves them
"""

from docker.models.images import Image

from kiln.infra.docker.building import TarContext
from kiln.infra.docker.config import AuthConfig, StoredAuth, config_auth, index_name, registry_of
from kiln.infra.docker.containers import Container, ExecResult, LogTail
from kiln.infra.docker.daemon import DockerDaemon
from kiln.infra.docker.faults import DockerError, daemon_fault, fault_text, id_of
from kiln.infra.docker.streams import BuildResult, BuildStep, PushResult

__all__ = [
    "AuthConfig",
    "BuildResult",
    "BuildStep",
    "Container",
    "DockerDaemon",
    "DockerError",
    "ExecResult",
    "Image",
    "LogTail",
    "PushResult",
    "StoredAuth",
    "TarContext",
    "config_auth",
    "daemon_fault",
    "fault_text",
    "id_of",
    "index_name",
    "registry_of",
]
