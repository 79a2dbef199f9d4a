"""The mapping of the Docker SDK's exceptions to kiln's errors, at unit level: fakes of the
SDK's objects raise what the SDK raises. The proof against the real daemon is
tests/test_daemon_faults.py; here are the paths it does not reach (a pull, an import,
networks), the cleanup decisions, and the CLI's last line of defence."""

from __future__ import annotations

import http.client
from typing import TypedDict

import docker.errors
import pytest
import requests
import urllib3

from kiln import cli
from kiln.basics.documents import Shape
from kiln.basics.errors import BaseImageMissing, BuildFailed, DockerDaemonError
from kiln.infra import docker as kdocker
from kiln.infra.docker import Container, DockerDaemon, DockerError, fault_text


def api_error(
    status: int, message: str, url: str = "http+docker://localhost/v1.41/containers/x/stop?t=30", method: str = "POST"
):
    """What the SDK raises for an error status: the daemon's JSON `message` is the explanation."""
    response = requests.Response()
    response.status_code = status
    response.request = requests.Request(method, url).prepare()
    cls = docker.errors.NotFound if status == 404 else docker.errors.APIError
    return cls(f"{status} Server Error for {url}", response=response, explanation=message)


def broken() -> requests.exceptions.ChunkedEncodingError:
    """What requests raises when the daemon's chunked answer stops midway."""
    inner = http.client.IncompleteRead(b"abc", 20)
    return requests.exceptions.ChunkedEncodingError(
        urllib3.exceptions.ProtocolError(f"Connection broken: {inner!r}", inner)
    )


class Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def raising(exc):
    def fn(*args, **kwargs):
        raise exc

    return fn


class FakeContainer:
    """The SDK's Container, as far as kiln's Container uses it."""

    def __init__(self, name="kiln-tiny-moe-abc123", stop=None, remove=None, logs=None):
        self.name, self.id, self.short_id, self.status = name, "f" * 64, "ffffffffffff", "running"
        self.removed = False
        self._stop, self._remove, self._logs = stop, remove, logs

    def stop(self, timeout):
        if self._stop:
            raise self._stop

    def remove(self, force=False):
        if self._remove:
            raise self._remove
        self.removed = True

    def logs(self, **kw):
        if self._logs:
            raise self._logs
        return b"line\n"


# -- the words ---------------------------------------------------------------------------
def test_fault_text_quotes_the_daemon_or_names_what_broke():
    assert (
        fault_text(api_error(500, "cannot stop container: did not receive an exit event"))
        == "the Docker daemon answered 500: cannot stop container: did not receive an exit event"
    )
    assert (
        fault_text(broken()) == "the connection to the Docker daemon broke (Connection broken: "
        "IncompleteRead(3 bytes read, 20 more expected))"
    )
    assert fault_text(requests.exceptions.ReadTimeout("read timed out")) == "the Docker daemon did not answer in time"
    cut = fault_text(docker.errors.StreamParseError(ValueError("Expecting ',' delimiter")))
    assert cut.startswith("the Docker daemon's answer was cut short (")
    assert "http+docker" not in fault_text(api_error(500, "x"))  # no URL: it can hold a registry path


# -- stop, and what is left after it -----------------------------------------------------
def test_a_failed_stop_removes_the_container_with_force_and_says_so():
    sdk = FakeContainer(
        stop=api_error(500, "cannot stop container: tried to kill container, but did not receive an exit event")
    )
    with pytest.raises(DockerError) as err:
        Container(sdk).stop(timeout=30)
    assert sdk.removed
    assert err.value.exit_code == 34 and isinstance(err.value, DockerDaemonError)
    assert err.value.message == (
        "stopping container kiln-tiny-moe-abc123: the Docker daemon answered 500: cannot stop "
        "container: tried to kill container, but did not receive an exit event; kiln removed "
        "the container with force instead"
    )
    assert "\n" not in err.value.message


def test_a_stop_and_a_removal_that_both_fail_tell_the_user_the_command():
    sdk = FakeContainer(stop=api_error(500, "cannot stop container"), remove=api_error(500, "cannot remove"))
    with pytest.raises(DockerError) as err:
        Container(sdk).stop(timeout=30)
    assert "removing it with force: the Docker daemon answered 500: cannot remove" in err.value.message
    assert err.value.hint.startswith("`docker rm -f kiln-tiny-moe-abc123`")


def test_a_stop_of_a_container_already_gone_is_no_error():
    Container(FakeContainer(stop=api_error(404, "No such container"))).stop(timeout=30)


def test_logs_of_a_container_being_removed_are_none_and_a_daemon_fault_is_an_error():
    assert (
        Container(
            FakeContainer(logs=api_error(409, "can not get logs from container which is dead or marked for removal"))
        ).logs()
        is None
    )
    with pytest.raises(
        DockerError, match="reading the log of container kiln-tiny-moe-abc123: the Docker daemon answered 500"
    ):
        Container(FakeContainer(logs=api_error(500, "boom"))).logs()
    with pytest.raises(DockerError, match="the connection to the Docker daemon broke"):
        Container(FakeContainer(logs=broken())).logs()


class RemovingApi:
    """`api` of a client whose DELETE /containers fails; inspect answers `attrs` (None: 404)."""

    def __init__(self, attrs):
        self.attrs = attrs

    def remove_container(self, name, force):
        raise api_error(500, "injected")

    def inspect_container(self, name):
        if self.attrs is None:
            raise api_error(404, "No such container")
        attrs, self.attrs = self.attrs, None  # the next inspect: AutoRemove finished
        return attrs


def test_a_failed_removal_of_a_container_that_removes_itself_is_no_error():
    auto = {"HostConfig": {"AutoRemove": True}, "State": {"Running": False}}
    DockerDaemon(Obj(api=RemovingApi(auto))).remove_container("kiln-x-1", timeout_s=5)


def test_a_failed_removal_names_the_container_and_the_command():
    kept = {"HostConfig": {"AutoRemove": False}, "State": {"Running": True}}
    with pytest.raises(DockerError) as err:
        DockerDaemon(Obj(api=RemovingApi(kept))).remove_container("kiln-x-1", timeout_s=5)
    assert err.value.message == "removing container kiln-x-1: the Docker daemon answered 500: injected"
    assert err.value.hint.startswith("`docker rm -f kiln-x-1`")


# -- the endpoints the real-daemon test does not reach -----------------------------------
def _pulling(pull) -> DockerDaemon:
    images = Obj(get=raising(docker.errors.ImageNotFound("no such image")))
    return DockerDaemon(Obj(images=images, api=Obj(pull=pull)))


REF = "registry.example/base/debian@sha256:" + "a" * 64


def test_a_pull_the_registry_refuses_is_a_missing_base_image():
    with pytest.raises(BaseImageMissing, match="the Docker daemon answered 500: unauthorized"):
        _pulling(raising(api_error(500, "unauthorized: authentication required"))).ensure_base(REF, pull=True)

    def refused(*args, **kwargs):
        yield {"status": "Pulling from base/debian", "id": "latest"}
        yield {"errorDetail": {"message": "manifest unknown"}, "error": "manifest unknown"}

    with pytest.raises(BaseImageMissing, match="could not be pulled: manifest unknown"):
        _pulling(refused).ensure_base(REF, pull=True)


def test_a_pull_whose_stream_breaks_is_the_daemons_fault():
    def breaks(*args, **kwargs):
        yield {"status": "Downloading", "id": "abc", "progressDetail": {"current": 1, "total": 10}}
        raise broken()

    with pytest.raises(DockerError) as err:
        _pulling(breaks).ensure_base(REF, pull=True)
    assert err.value.message.startswith(f"pulling {REF}: the connection to the Docker daemon broke (")


def test_an_import_the_daemon_fails_names_the_tarball(tmp_path):
    tarball = tmp_path / "rootfs.tar"
    tarball.write_bytes(b"")
    daemon = DockerDaemon(Obj(api=Obj(import_image=raising(api_error(500, "no space left on device")))))
    with pytest.raises(
        DockerError,
        match=r"^importing rootfs.tar as kiln/base:bookworm: the Docker daemon answered 500: no space left on device$",
    ):
        daemon.import_rootfs(tarball, "kiln/base:bookworm", [])


def test_network_faults_name_the_network():
    daemon = DockerDaemon(
        Obj(
            networks=Obj(create=raising(api_error(500, "pool overlaps"))),
            api=Obj(remove_network=raising(api_error(500, "has active endpoints"))),
        )
    )
    with pytest.raises(DockerError, match=r"^creating network kiln-net-1: the Docker daemon answered 500: pool "):
        daemon.create_network("kiln-net-1", labels={})
    with pytest.raises(DockerError) as err:
        daemon.remove_network("kiln-net-1", timeout_s=0)
    assert err.value.message == "removing network kiln-net-1: the Docker daemon answered 500: has active endpoints"
    assert "docker network rm kiln-net-1" in err.value.hint


class _Ok(TypedDict):
    ok: bool


OK = Shape(_Ok)


def test_a_throwaway_container_the_daemon_cannot_create_fails_the_job_and_one_it_cannot_remove_is_a_warning(capsys):
    failing = DockerDaemon(Obj(containers=Obj(create=raising(api_error(500, "no such image")))))
    with pytest.raises(BuildFailed, match=r"^engine probe: creating its container: the Docker daemon answered 500"):
        failing.run_script("sha256:" + "b" * 64, "print(1)", marker="M", answer=OK, what="engine probe", timeout_s=5)

    box = Obj(
        name="probe-1",
        short_id="abc",
        start=lambda: None,
        wait=lambda timeout: {"StatusCode": 0},
        logs=lambda: b'M {"ok": true}\n',
        remove=raising(api_error(500, "cannot remove")),
    )
    daemon = DockerDaemon(Obj(containers=Obj(create=lambda **kw: box)))
    assert daemon.run_script(
        "sha256:" + "b" * 64, "print(1)", marker="M", answer=OK, what="engine probe", timeout_s=5
    ) == {"ok": True}
    assert (
        "removing container probe-1: the Docker daemon answered 500: cannot remove; it is left behind: "
        "`docker rm -f probe-1`" in " ".join(capsys.readouterr().err.split())
    )


# -- who reports a fault that happens during cleanup -------------------------------------
def test_a_cleanup_fault_while_another_error_is_on_its_way_out_is_a_warning(capsys):
    from kiln.domain.serving.launch_command import RunSpec
    from kiln.domain.serving.serving_container import ServingContainer

    class Daemon:
        def remove_container(self, name):
            raise DockerError(
                f"removing container {name}: the Docker daemon answered 500: boom", hint="`docker rm -f x`"
            )

    box = ServingContainer(
        Daemon(), RunSpec(image="img", name="kiln-x-1", host_port=None, container_port=8000, host_ip="", flavour="cpu")
    )
    box.close(failing=True)
    assert "warning: removing container kiln-x-1: the Docker daemon answered 500: boom" in " ".join(
        capsys.readouterr().err.split()
    )
    with pytest.raises(DockerError):
        box.close()


def test_a_daemon_fault_during_a_smoke_check_stops_the_smoke_instead_of_failing_the_image():
    from kiln.usecases.smoke_checks import SmokeRun

    run = SmokeRun()
    run.check("models", raising(AssertionError("served model 'x' not in []")))
    assert [c.ok for c in run.checks] == [False]
    with pytest.raises(DockerDaemonError):
        run.check("engine_info", raising(DockerError("running `python` in container x: boom")))
    assert len(run.checks) == 1  # no verdict recorded for it


# -- exec: the daemon cutting the stream, or the container stopping under it --------------
class ExecContainer(FakeContainer):
    """An SDK Container whose exec answers `output` and whose state reads `states` in turn."""

    def __init__(self, output, states):
        super().__init__()
        self._output, self._states = output, iter(states)

    def exec_run(self, cmd, **kw):
        return Obj(exit_code=0, output=self._output)

    def reload(self):
        self.status = next(self._states, self.status)


def test_an_exec_cut_short_in_a_running_container_is_the_daemons_fault(monkeypatch):
    from kiln.infra.docker import containers

    monkeypatch.setattr(containers, "_EXEC_GRACE_S", 0.3)
    with pytest.raises(DockerError, match="ended its output before the command's end"):
        Container(ExecContainer(b"half of the out", ["running"])).exec(["python", "-c", "1"])
    res = Container(ExecContainer(b"all of it\nKILN-EXEC-END 0\n", [])).exec(["true"])
    assert res == (0, "all of it")


def test_an_exec_cut_short_because_its_container_stopped_is_the_containers_exit_not_the_daemons():
    from kiln.basics.errors import ServerExited

    with pytest.raises(ServerExited) as err:
        Container(ExecContainer(b"half of the out", ["exited"])).exec(["python", "-c", "1"])
    assert not isinstance(err.value, DockerDaemonError) and err.value.exit_code == 51
    assert err.value.message == (
        "running `python -c 1` in container kiln-tiny-moe-abc123: the container stopped "
        "before the command's end (now exited)"
    )
    refused = FakeContainer()
    refused.exec_run = raising(api_error(409, "container f is not running"))
    refused.reload = lambda: setattr(refused, "status", "exited")
    with pytest.raises(ServerExited):
        Container(refused).exec(["true"])


# -- the CLI's last line of defence ------------------------------------------------------
def test_an_unnamed_daemon_fault_is_still_a_daemon_error_and_a_registry_fault_stays_a_bug(monkeypatch, capsys):
    from kiln.commands.serving import serve

    monkeypatch.setattr(
        serve, "ps", raising(api_error(500, "boom", "http+docker://localhost/v1.41/containers/json?all=0", "GET"))
    )
    assert cli.main(["ps"]) == 34
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "kiln: error: a Docker daemon request (GET /v1.41/containers/json): the Docker daemon answered 500: boom" in err
    )
    assert "internal error" not in err

    request = requests.Request("GET", "http://127.0.0.1:5000/v2/").prepare()
    monkeypatch.setattr(serve, "ps", raising(requests.exceptions.ConnectionError("refused", request=request)))
    assert cli.main(["ps"]) == 1
    assert "internal error" in capsys.readouterr().err
    assert kdocker.daemon_fault(ValueError("x")) is None
    assert kdocker.daemon_fault(docker.errors.InvalidArgument("bad port spec")) is None  # kiln's own mistake
    assert kdocker.daemon_fault(docker.errors.StreamParseError(ValueError("x"))).message.startswith(
        "a Docker daemon request: the Docker daemon's answer was cut short"
    )
