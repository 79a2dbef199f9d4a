"""Kubernetes manifests from the same recipe that builds the image (`kiln render k8s`).

Several nodes: a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1), one group per replica,
group size = topology.nodes. The leader pod runs the API server and rank 0; worker pods
run headless ranks. Every pod gets LWS_LEADER_ADDRESS and LWS_WORKER_INDEX from the
LeaderWorkerSet controller, and the container args reference them (`$(VAR)`, expanded by
the kubelet), exactly the flags `kiln run --print` shows per node. One node: a Deployment.
Both come with a Service on the leader, probes derived from the smoke spec, the recipe's
accelerators as nvidia.com/gpu, a memory-backed /dev/shm, the model volumes, the image
by digest and a non-root, read-only security context. A recipe built for one platform
(engine.platforms) pins its pods to that `kubernetes.io/arch`; one built for several is
published as an image index, and each node pulls its own architecture from it.

A recipe reading weights from a Hugging Face cache (`model.*.source: hf`) mounts a
PersistentVolumeClaim (`--hf-cache-pvc`, default `hf-cache`) read-only at /hf-cache in
every serving pod, whose init container waits until the pinned snapshots are complete
there; a Job (`NAME-fetch`) fills it once with the image's own hub client, the only pod
that mounts it writable and is allowed to reach the hub.
"""

from __future__ import annotations

import math
from typing import NotRequired, TypedDict

import yaml

from kiln.domain.recipes.recipe import LoadedRecipe
from kiln.domain.recipes.topology import Topology, effective, node_args
from kiln.domain.serving.launch_command import (
    CPU_CAPS,
    CPU_SHM,
    CUDA_SHM,
    CUDA_TMPFS,
    TMPFS,
    hf_models,
)
from kiln.domain.serving.serving_container import _explicit_env
from kiln.inimage.hf_cache import CONTAINER_CACHE

_LWS_API = "leaderworkerset.x-k8s.io/v1"
_LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
_WORKER_INDEX = "$(LWS_WORKER_INDEX)"
_UID = 1000  # the `kiln` user of every engine image
_PROBE_PERIOD_S = 10
_ARCH_LABEL = "kubernetes.io/arch"  # the well-known node label: amd64, arm64
HF_CACHE_PVC = "hf-cache"  # default claim of the shared Hugging Face cache
_HF_TOKEN_SECRET = "hf-token"  # optional Secret (key HF_TOKEN) the fetch Job passes on, for gated repos  # noqa: S105

# A Kubernetes object, or a piece of one, as kiln renders it: the API's schema is far too
# large to restate, kiln only writes these out as YAML (never reads them back), and the
# lists kiln filters (env, mounts) have their own types below.
_Manifest = dict[str, object]


class _KubeObject(TypedDict):
    """A top-level object kiln renders (Deployment, LeaderWorkerSet, Service, Job)."""

    apiVersion: str
    kind: str
    metadata: _Manifest
    spec: _Manifest


class _EnvVar(TypedDict):
    name: str
    value: NotRequired[str]
    valueFrom: NotRequired[_Manifest]


class _VolumeMount(TypedDict):
    name: str
    mountPath: str
    readOnly: NotRequired[bool]


# -- pod pieces -------------------------------------------------------------------------
def _quantity(docker_size: str) -> str:
    """docker's `4g` as a Kubernetes quantity `4Gi`."""
    return docker_size[:-1] + "Gi" if docker_size.endswith("g") else docker_size


def _volume_name(path: str) -> str:
    return "v" + "".join(ch if ch.isalnum() else "-" for ch in path.lower()).strip("-")[:60]


def _volumes(loaded: LoadedRecipe, hf_pvc: str = HF_CACHE_PVC) -> tuple[list[_Manifest], list[_VolumeMount]]:
    recipe = loaded.recipe
    cuda = recipe.engine.flavour == "cuda"
    volumes: list[_Manifest] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": _quantity(CUDA_SHM if cuda else CPU_SHM)}}
    ]
    mounts: list[_VolumeMount] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    # the root filesystem is read-only, as with `kiln run`: the same writable scratch dirs
    for path in {**TMPFS, **(CUDA_TMPFS if cuda else {})}:
        name = _volume_name(path)
        volumes.append({"name": name, "emptyDir": {}})
        mounts.append({"name": name, "mountPath": path})
    for role, src in (("model-target", recipe.model.target), ("model-draft", recipe.model.draft)):
        if src is None or src.source != "host_path" or src.path is None:  # the schema requires a path
            continue
        if src.pvc:
            volumes.append({"name": role, "persistentVolumeClaim": {"claimName": src.pvc, "readOnly": True}})
        else:
            volumes.append({"name": role, "hostPath": {"path": src.host_path, "type": "Directory"}})
        mounts.append({"name": role, "mountPath": src.path, "readOnly": True})
    if hf_models(recipe):
        volumes.append({"name": "hf-cache", "persistentVolumeClaim": {"claimName": hf_pvc, "readOnly": True}})
        mounts.append({"name": "hf-cache", "mountPath": CONTAINER_CACHE, "readOnly": True})
    return volumes, mounts


def _probes(loaded: LoadedRecipe) -> _Manifest:
    """vLLM answers /health once the engine (all ranks) is up; the startup probe allows the
    smoke spec's startup timeout, after which readiness and liveness take over."""
    smoke = loaded.recipe.smoke
    get = {"path": "/health", "port": "http"}
    return {
        "startupProbe": {
            "httpGet": get,
            "periodSeconds": _PROBE_PERIOD_S,
            "timeoutSeconds": 5,
            "failureThreshold": max(1, math.ceil(smoke.startup_timeout_s / _PROBE_PERIOD_S)),
        },
        "readinessProbe": {
            "httpGet": get,
            "periodSeconds": _PROBE_PERIOD_S,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": get,
            "periodSeconds": _PROBE_PERIOD_S,
            "timeoutSeconds": min(60, smoke.request_timeout_s),
            "failureThreshold": 3,
        },
    }


def _env(loaded: LoadedRecipe) -> list[_EnvVar]:

    return [{"name": k, "value": v} for k, v in sorted(_explicit_env(loaded).items())]


def _container(
    loaded: LoadedRecipe, image: str, args: list[str], mounts: list[_VolumeMount], topo: Topology, *, serves: bool
) -> _Manifest:
    recipe = loaded.recipe
    cuda = recipe.engine.flavour == "cuda"
    caps = {"drop": ["ALL"]}
    if not cuda:
        caps["add"] = list(CPU_CAPS)
    container: _Manifest = {
        "name": "vllm",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "env": _env(loaded),
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": _UID,
            "capabilities": caps,
        },
    }
    if args:
        container["args"] = args
    if cuda:
        gpus = str(topo.accelerators_per_node)
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}
    if serves:
        container["ports"] = [{"name": "http", "containerPort": recipe.launch.port, "protocol": "TCP"}]
        container.update(_probes(loaded))
    return container


def _security(loaded: LoadedRecipe) -> _Manifest:
    caps = {"drop": ["ALL"]}
    if loaded.recipe.engine.flavour != "cuda":
        caps["add"] = list(CPU_CAPS)
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": _UID,
        "capabilities": caps,
    }


def _pod_security() -> _Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": _UID,
        "runAsGroup": _UID,
        "fsGroup": _UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _wait_for_weights(loaded: LoadedRecipe, image: str, mounts: list[_VolumeMount]) -> _Manifest:
    """Init container: the entrypoint's own snapshot check, repeated until the fetch Job
    has filled the cache (it prints the one line naming what is missing meanwhile)."""
    return {
        "name": "wait-for-weights",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["--check-models", "--wait-models"],
        "env": _env(loaded),
        "volumeMounts": [m for m in mounts if m["name"] in ("hf-cache", _volume_name("/tmp"))],
        "securityContext": _security(loaded),
    }


def _pod_spec(
    loaded: LoadedRecipe, image: str, args: list[str], topo: Topology, *, serves: bool, hf_pvc: str = HF_CACHE_PVC
) -> _Manifest:
    volumes, mounts = _volumes(loaded, hf_pvc)
    spec: _Manifest = {
        "securityContext": _pod_security(),
        "terminationGracePeriodSeconds": 60,
        "containers": [_container(loaded, image, args, mounts, topo, serves=serves)],
        "volumes": volumes,
    }
    if hf_models(loaded.recipe):
        spec["initContainers"] = [_wait_for_weights(loaded, image, mounts)]
    spec.update(_node_selector(loaded))
    return spec


def _node_selector(loaded: LoadedRecipe) -> _Manifest:
    """A single-platform recipe's pods only go to nodes of that architecture (an amd64
    image on a Grace node fails with `exec format error`); a multi-platform recipe's
    image is an index, and each node's runtime pulls its own architecture from it."""
    platforms = loaded.recipe.engine.platforms
    if len(platforms) != 1:
        return {}
    return {"nodeSelector": {_ARCH_LABEL: platforms[0].split("/", 1)[1]}}


def _labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "kiln", "ai.kiln.recipe": name}


# -- objects ----------------------------------------------------------------------------
def _leader_worker_set(
    loaded: LoadedRecipe, image: str, topo: Topology, replicas: int, hf_pvc: str = HF_CACHE_PVC
) -> _KubeObject:
    name = loaded.name
    leader = {**_labels(name), "ai.kiln.role": "leader"}
    worker = {**_labels(name), "ai.kiln.role": "worker"}
    return {
        "apiVersion": _LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "labels": _labels(name)},
        "spec": {
            "replicas": replicas,
            # workers must start with the leader: its rank 0 waits for them before /health answers
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": topo.nodes,
                # a vLLM world cannot take back a restarted rank: restart the whole group
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {
                    "metadata": {"labels": leader},
                    "spec": _pod_spec(
                        loaded, image, node_args(topo, 0, _LEADER_ADDRESS), topo, serves=True, hf_pvc=hf_pvc
                    ),
                },
                "workerTemplate": {
                    "metadata": {"labels": worker},
                    "spec": _pod_spec(loaded, image, _worker_args(topo), topo, serves=False, hf_pvc=hf_pvc),
                },
            },
        },
    }


def _worker_args(topo: Topology) -> list[str]:
    """Rank 1's flags with the rank taken from the pod's LWS_WORKER_INDEX."""
    args = node_args(topo, 1, _LEADER_ADDRESS)
    args[args.index("--node-rank") + 1] = _WORKER_INDEX
    return args


def _deployment(
    loaded: LoadedRecipe, image: str, topo: Topology, replicas: int, hf_pvc: str = HF_CACHE_PVC
) -> _KubeObject:
    name = loaded.name
    labels = {**_labels(name), "ai.kiln.role": "leader"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": _labels(name)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"ai.kiln.recipe": name, "ai.kiln.role": "leader"}},
            "template": {
                "metadata": {"labels": labels},
                "spec": _pod_spec(loaded, image, [], topo, serves=True, hf_pvc=hf_pvc),
            },
        },
    }


def _service(loaded: LoadedRecipe) -> _KubeObject:
    """The OpenAI API of every replica's leader, behind one ClusterIP."""
    name = loaded.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": _labels(name)},
        "spec": {
            "type": "ClusterIP",
            "selector": {"ai.kiln.recipe": name, "ai.kiln.role": "leader"},
            "ports": [{"name": "http", "port": loaded.recipe.launch.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def _fetch_job(loaded: LoadedRecipe, image: str, hf_pvc: str = HF_CACHE_PVC) -> _KubeObject:
    """The Job that fills the shared cache with the recipe's pinned snapshots, once: the
    recipe image's entrypoint with --fetch-models (its own hub client, online), the claim
    mounted writable. Rerunning it resumes and re-checks; a complete cache is left as is."""
    name = loaded.name
    env: list[_EnvVar] = [e for e in _env(loaded) if e["name"] not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")]
    env += [
        {"name": "HF_HUB_OFFLINE", "value": "0"},
        {"name": "HF_HOME", "value": "/tmp/hf-home"},
        {
            "name": "HF_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": _HF_TOKEN_SECRET, "key": "HF_TOKEN", "optional": True}},
        },
    ]
    tmp = _volume_name("/tmp")
    labels = {**_labels(name), "ai.kiln.role": "fetch"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"{name}-fetch", "labels": labels},
        "spec": {
            "backoffLimit": 3,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "OnFailure",
                    **_node_selector(loaded),
                    "securityContext": _pod_security(),
                    "containers": [
                        {
                            "name": "fetch",
                            "image": image,
                            "imagePullPolicy": "IfNotPresent",
                            "args": ["--fetch-models"],
                            "env": env,
                            "volumeMounts": [
                                {"name": "hf-cache", "mountPath": CONTAINER_CACHE},
                                {"name": tmp, "mountPath": "/tmp"},
                            ],
                            "securityContext": _security(loaded),
                        }
                    ],
                    "volumes": [
                        {"name": "hf-cache", "persistentVolumeClaim": {"claimName": hf_pvc}},
                        {"name": tmp, "emptyDir": {}},
                    ],
                },
            },
        },
    }


def manifests(loaded: LoadedRecipe, image: str, *, replicas: int = 1, hf_pvc: str = HF_CACHE_PVC) -> list[_KubeObject]:
    """The Kubernetes objects that serve a recipe's image: its workload (a Deployment or LeaderWorkerSet), its
    Service, and a Job that fetches its Hugging Face models when it has any."""
    topo = effective(loaded.recipe)
    workload = (
        _leader_worker_set(loaded, image, topo, replicas, hf_pvc)
        if topo.multi_node
        else _deployment(loaded, image, topo, replicas, hf_pvc)
    )
    objects = [workload, _service(loaded)]
    if hf_models(loaded.recipe):
        objects.append(_fetch_job(loaded, image, hf_pvc))
    return objects


def dump(objects: list[_KubeObject]) -> str:
    """Kubernetes objects as one multi-document YAML text."""
    return "---\n".join(yaml.safe_dump(o, sort_keys=False, default_flow_style=False) for o in objects)
