"""`kiln render k8s`: manifests validated strictly (unknown fields fail) against the
LeaderWorkerSet CRD's openAPIV3Schema (tests/fixtures/k8s, see its README) and the
Kubernetes core types (kubernetes-validate's strict schemas, offline)."""

from __future__ import annotations

import functools

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kilntest import FIXTURES, REPO, run_kiln

# daemon-optional commands run with no daemon, on purpose (conftest no_docker): unit tests
pytestmark = pytest.mark.usefixtures("no_docker")

K8S_VERSION = "1.34.0"
DIGEST = "sha256:" + "ab" * 32
IMAGE = f"registry.example.com/kiln/glm53-kindling-2node@{DIGEST}"
CRD = FIXTURES / "k8s" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml"


def _strict(schema):
    """The CRD schema with additionalProperties: false on every object schema that lists
    its properties (an API server prunes unknown fields; these tests refuse them)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if (
        schema.get("type") == "object"
        and "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def _lws_validator():
    crd = yaml.safe_load(CRD.read_text())
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _strict(version["schema"]["openAPIV3Schema"])
    return jsonschema.Draft7Validator(schema)


def validate(obj: dict) -> None:
    """Raise if `obj` is not a valid object of its kind, unknown fields included."""
    if obj["kind"] == "LeaderWorkerSet":
        assert obj["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
        errors = sorted(_lws_validator().iter_errors(obj), key=str)
        if errors:
            raise jsonschema.ValidationError(
                f"{len(errors)} error(s), first: {errors[0].message} at {list(errors[0].absolute_path)}"
            )
        # the pod templates once more against the core PodTemplate type
        lwt = obj["spec"]["leaderWorkerTemplate"]
        for key in ("leaderTemplate", "workerTemplate"):
            validate(
                {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": key.lower()}, "template": lwt[key]}
            )
        return
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def _render(*args, **kw):
    return run_kiln("render", "k8s", *args, **kw)


def _objects(folder) -> dict:
    out = {}
    for path in sorted(folder.glob("*.yaml")):
        obj = yaml.safe_load(path.read_text())
        out[obj["kind"]] = obj
    return out


@pytest.fixture(scope="module")
def two_node(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("render")
    result = _render("glm53-kindling-2node", "--image", IMAGE, "-o", str(out), "--replicas", "3")
    assert result.returncode == 0, result.stderr
    objects = _objects(out)
    assert set(objects) == {"LeaderWorkerSet", "Service"}
    return objects


def test_two_node_recipe_renders_a_valid_leader_worker_set(two_node):
    for obj in two_node.values():
        validate(obj)


def test_validation_is_strict_unknown_fields_fail(two_node):
    import copy

    for mutate in (
        lambda o: o["spec"]["leaderWorkerTemplate"].update(groupSize=2),
        lambda o: o["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0].update(gpus=8),
        lambda o: o["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["startupProbe"].update(
            httpGett={}
        ),
    ):
        bad = copy.deepcopy(two_node["LeaderWorkerSet"])
        mutate(bad)
        with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
            validate(bad)
    bad = copy.deepcopy(two_node["Service"])
    bad["spec"]["targetPort"] = 8000
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(bad)


def test_group_wiring_follows_lws_and_the_per_node_flags(two_node):
    lws = two_node["LeaderWorkerSet"]["spec"]
    assert lws["replicas"] == 3
    lwt = lws["leaderWorkerTemplate"]
    assert lwt["size"] == 2
    assert lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
    [leader] = lwt["leaderTemplate"]["spec"]["containers"]
    [worker] = lwt["workerTemplate"]["spec"]["containers"]
    assert leader["args"] == [
        "--nnodes",
        "2",
        "--node-rank",
        "0",
        "--master-addr",
        "$(LWS_LEADER_ADDRESS)",
        "--master-port",
        "29501",
    ]
    assert worker["args"] == [
        "--nnodes",
        "2",
        "--node-rank",
        "$(LWS_WORKER_INDEX)",
        "--master-addr",
        "$(LWS_LEADER_ADDRESS)",
        "--master-port",
        "29501",
        "--headless",
    ]
    assert leader["image"] == worker["image"] == IMAGE


def test_pods_get_gpus_shm_models_probes_and_run_as_non_root(two_node):
    lwt = two_node["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]
    for key in ("leaderTemplate", "workerTemplate"):
        pod = lwt[key]["spec"]
        [c] = pod["containers"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
        assert volumes["model-target"]["persistentVolumeClaim"] == {"claimName": "glm53-bf16-weights", "readOnly": True}
        assert volumes["model-draft"]["persistentVolumeClaim"]["claimName"] == "glm53-kindling-weights"
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        assert mounts["/models/glm-5.3"]["readOnly"] is True and "/dev/shm" in mounts
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 1000
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    [leader] = lwt["leaderTemplate"]["spec"]["containers"]
    [worker] = lwt["workerTemplate"]["spec"]["containers"]
    # the smoke spec allows 3600 s to start: 360 probes 10 s apart
    assert leader["startupProbe"]["failureThreshold"] * leader["startupProbe"]["periodSeconds"] == 3600
    assert leader["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert "livenessProbe" in leader and "ports" in leader
    assert "startupProbe" not in worker and "ports" not in worker  # headless ranks serve no HTTP


def test_service_selects_the_leaders(two_node):
    svc = two_node["Service"]["spec"]
    leader_labels = two_node["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["labels"]
    worker_labels = two_node["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"]
    assert svc["selector"].items() <= leader_labels.items()
    assert not svc["selector"].items() <= worker_labels.items()
    assert svc["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]


def test_one_node_recipe_renders_a_deployment(tmp_path):
    result = _render("tiny-moe", "--image", f"kiln/tiny-moe@{DIGEST}", "-o", str(tmp_path))
    assert result.returncode == 0, result.stderr
    objects = _objects(tmp_path)
    assert set(objects) == {"Deployment", "Service"}
    for obj in objects.values():
        validate(obj)
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert "args" not in c  # the image's baked command, nothing per node
    assert "resources" not in c  # a CPU recipe asks for no GPU
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_NICE"]}
    assert (
        objects["Deployment"]["spec"]["selector"]["matchLabels"].items()
        <= objects["Deployment"]["spec"]["template"]["metadata"]["labels"].items()
    )
    # tiny-moe is built for linux/amd64 only: its pods must not land on a Grace (arm64) node
    assert pod["nodeSelector"] == {"kubernetes.io/arch": "amd64"}


def _publish_record(input_digest: str, manifest_digest: str):
    """A publish record's document as `kiln publish` writes it (kiln reads it back through
    that TypedDict, PublishDocument)."""
    from kiln.domain.publishing.publish_records import PublishResult, publish_document

    return publish_document(
        PublishResult(
            recipe="tiny-moe",
            image_id="sha256:" + "2" * 64,
            input_digest=input_digest,
            manifest_digest=manifest_digest,
            registry="registry.example.com:5000",
            repository="team/kiln/tiny-moe",
            channel="experimental",
            tags=["experimental"],
            pushed=True,
        )
    )


def test_image_comes_from_the_publish_record_of_the_current_inputs(tmp_path):
    from kiln.domain.images.definitions import resolve
    from kiln.domain.publishing.publish_records import write_record

    env = {"KILN_RESULTS_DIR": str(tmp_path / "state")}
    never = _render("tiny-moe", env=env)
    assert never.returncode == 71, never.stderr
    assert never.stderr.count("kiln: error:") == 1 and "tiny-moe was never published" in never.stderr

    recipe_image = resolve("tiny-moe").recipe_image
    record = _publish_record(recipe_image.digest, DIGEST)
    import os
    from unittest import mock

    with mock.patch.dict(os.environ, env):
        write_record("publish", "tiny-moe", _publish_record("sha256:" + "0" * 64, "sha256:" + "1" * 64))
        stale = _render("tiny-moe", env=env)
        assert stale.returncode == 71 and "other inputs" in stale.stderr, stale.stderr
        write_record("publish", "tiny-moe", record)
    result = _render("tiny-moe", env=env)
    assert result.returncode == 0, result.stderr
    docs = list(yaml.safe_load_all(result.stdout))
    [c] = docs[0]["spec"]["template"]["spec"]["containers"]
    assert c["image"] == f"registry.example.com:5000/team/kiln/tiny-moe@{DIGEST}"
    for doc in docs:
        validate(doc)


def test_render_refuses_a_recipe_check_refuses(kiln_tree):
    path = kiln_tree / "recipes" / "kiln-test-mini" / "recipe.yaml"
    path.write_text(path.read_text() + "topology:\n  nodes: 2\n  accelerators_per_node: 4\n  tensor_parallel: 2\n")
    result = run_kiln(
        "render", "k8s", "kiln-test-mini", "--image", f"x/y@{DIGEST}", env={"KILN_ROOT": str(kiln_tree)}, cwd=kiln_tree
    )
    assert result.returncode == 2, result.stderr
    assert "topology.accelerators_per_node" in result.stderr


def test_crd_fixture_is_the_shared_one():
    readme = (FIXTURES / "k8s" / "README.md").read_text()
    assert "060ab4da17eea1f0865fcbd3236bb1075e2cea32" in readme
    assert yaml.safe_load(CRD.read_text())["spec"]["group"] == "leaderworkerset.x-k8s.io"
    assert (REPO / "tests" / "fixtures" / "k8s").is_dir()


def test_single_node_gpu_recipe_gets_its_gpus_and_host_paths(tmp_path):
    """glm53-kindling has no topology: its launch.args layout (tensor parallel 8) decides."""
    result = _render("glm53-kindling", "--image", f"r.example.com/kiln/glm53-kindling@{DIGEST}", "-o", str(tmp_path))
    assert result.returncode == 0, result.stderr
    objects = _objects(tmp_path)
    for obj in objects.values():
        validate(obj)
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-target"]["hostPath"] == {"path": "/data/models/GLM-5.3", "type": "Directory"}
    assert {e["name"]: e["value"] for e in c["env"]}["KILN_DRAFT_TRUNC"] == "1"
    # declared for linux/amd64 and linux/arm64: one index tag, any node's architecture
    assert "nodeSelector" not in pod


@pytest.mark.parametrize(
    "name, kinds",
    [
        ("qwen3-30b-a3b", {"Deployment", "Service", "Job"}),
        ("gpt-oss-120b", {"Deployment", "Service", "Job"}),
        ("deepseek-v32-mtp", {"Deployment", "Service", "Job"}),
        ("deepseek-v32-mtp-2node", {"LeaderWorkerSet", "Service", "Job"}),
    ],
)
def test_catalogue_recipes_render_valid_manifests(tmp_path, name, kinds):
    """The recipes reading a Hugging Face cache: workload, Service and the fetch Job, all
    valid; every pod waits for the weights and mounts the claim read-only."""
    image = f"registry.example.com/kiln/{name}@{DIGEST}"
    result = _render(name, "--image", image, "-o", str(tmp_path))
    assert result.returncode == 0, result.stderr
    objects = _objects(tmp_path)
    assert set(objects) == kinds
    for obj in objects.values():
        validate(obj)
    workload = objects.get("Deployment") or objects["LeaderWorkerSet"]
    if workload["kind"] == "Deployment":
        pods = [workload["spec"]["template"]["spec"]]
    else:
        lwt = workload["spec"]["leaderWorkerTemplate"]
        pods = [lwt["leaderTemplate"]["spec"], lwt["workerTemplate"]["spec"]]
        assert lwt["size"] == 2
    gpus = {"qwen3-30b-a3b": "1", "gpt-oss-120b": "1"}.get(name, "8")
    for pod in [*pods, objects["Job"]["spec"]["template"]["spec"]]:
        assert pod["nodeSelector"] == {"kubernetes.io/arch": "amd64"}  # single-platform recipes
    for pod in pods:
        assert [c["name"] for c in pod["initContainers"]] == ["wait-for-weights"]
        [c] = pod["containers"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == gpus
        assert {v["name"]: v for v in pod["volumes"]}["hf-cache"]["persistentVolumeClaim"]["readOnly"] is True
