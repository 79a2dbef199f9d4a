"""Layer and config normalisation (domain/reproducible/save_archive.py): the same content in gives the
same bytes out whatever the build's times, owners' names and entry order; a changed byte
of content gives another digest."""

from __future__ import annotations

import hashlib
import io
import json
import random
import tarfile

from kiln.domain.reproducible import save_archive as normalise

EPOCH = 1_700_000_000

FILES = {
    "usr": None,
    "usr/bin": None,
    "usr/bin/tool": b"#!/bin/sh\necho hi\n",
    "usr/lib": None,
    "usr/lib/a.so": b"\x7fELF" + bytes(range(200)),
    "etc": None,
    "etc/conf": b"x=1\n",
    "etc/.wh.old": b"",
    "models": None,
    "models/w.safetensors": bytes(5000),
}


def _layer(
    order: list[str], *, mtimes: dict[str, float], uname: str = "root", content=None, link: bool = True
) -> bytes:
    content = content or {}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in order:
            body = content.get(name, FILES[name])
            info = tarfile.TarInfo(name)
            info.mtime = mtimes.get(name, 0)
            info.uname = info.gname = uname
            info.pax_headers = {"atime": str(mtimes.get(name, 0) + 7.5), "ctime": "1234.5"}
            if body is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(body), 0o644
                tar.addfile(info, io.BytesIO(body))
        if link:
            info = tarfile.TarInfo("usr/bin/tool2")
            info.type, info.linkname = tarfile.LNKTYPE, "usr/bin/tool"
            tar.addfile(info)
            sym = tarfile.TarInfo("usr/bin/sh-link")
            sym.type, sym.linkname, sym.mtime = tarfile.SYMTYPE, "tool", mtimes.get("usr/bin/tool", 0)
            tar.addfile(sym)
    return buf.getvalue()


def _normalised(raw: bytes) -> tuple[bytes, str]:
    out = io.BytesIO()
    digest = normalise._normalise_layer(io.BytesIO(raw), out, EPOCH)
    return out.getvalue(), digest


def test_shuffled_order_times_and_owner_names_give_the_same_bytes():
    rng = random.Random(7)
    names = list(FILES)
    results = set()
    for i in range(5):
        order = names[:]
        rng.shuffle(order)
        # build times: all after the source date (times before it are content, e.g. a wheel's)
        mtimes = {n: rng.uniform(EPOCH, 2 * EPOCH) for n in names}
        raw = _layer(order, mtimes=mtimes, uname=f"builder{i}")
        data, digest = _normalised(raw)
        assert digest == "sha256:" + hashlib.sha256(data).hexdigest()
        results.add(data)
    assert len(results) == 1


def test_output_is_ordered_parents_first_clamped_and_has_no_names_or_atimes():
    raw = _layer(list(reversed(FILES)), mtimes=dict.fromkeys(FILES, 2 * EPOCH) | {"etc/conf": 5})
    data, _ = _normalised(raw)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        for m in members:
            assert m.uname == m.gname == ""
            assert "atime" not in m.pax_headers and "ctime" not in m.pax_headers
            assert m.mtime <= EPOCH
        assert tar.getmember("etc/conf").mtime == 5  # older than the source date: kept
        assert tar.extractfile("usr/lib/a.so").read() == FILES["usr/lib/a.so"]
        assert tar.getmember("usr/bin/tool2").linkname == "usr/bin/tool"
        assert tar.getmember("usr/bin/sh-link").linkname == "tool"
    for i, name in enumerate(names):
        parent = name.rsplit("/", 1)[0] if "/" in name else None
        if parent is not None:
            assert parent in names[:i], f"{name} before its folder"
    assert names.index("usr/bin/tool") < names.index("usr/bin/tool2")  # link after its target


def test_a_changed_content_byte_gives_another_digest():
    order = list(FILES)
    _, one = _normalised(_layer(order, mtimes={}))
    w = bytearray(FILES["models/w.safetensors"])
    w[1234] ^= 1
    _, other = _normalised(_layer(order, mtimes={}, content={"models/w.safetensors": bytes(w)}))
    assert one != other


def test_a_changed_mode_gives_another_digest():
    order = list(FILES)
    raw = _layer(order, mtimes={})
    buf = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tin, tarfile.open(fileobj=buf, mode="w") as tout:
        for m in tin.getmembers():
            if m.name == "etc/conf":
                m.mode = 0o600
            tout.addfile(m, tin.extractfile(m) if m.isreg() else None)
    assert _normalised(raw)[1] != _normalised(buf.getvalue())[1]


CONFIG = {
    "architecture": "amd64",
    "os": "linux",
    "created": "2026-12-02T01:02:03.123456789Z",
    "docker_version": "20.10.24+dfsg1",
    "container": "f00dfeed" * 8,
    "container_config": {"Hostname": "f00dfeed", "Cmd": ["/bin/sh", "-c", "#(nop) LABEL a=b"]},
    "config": {"Hostname": "", "Image": "sha256:" + "ab" * 32, "Labels": {"a": "b"}, "Env": ["X=1"]},
    "history": [
        {"created": "2026-12-02T01:00:00Z", "created_by": "RUN x"},
        {"created": "2026-12-02T01:02:03Z", "created_by": "LABEL a=b", "empty_layer": True},
    ],
    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + "00" * 32]},
}


def test_config_gets_the_source_date_and_loses_build_machine_facts():
    raw = normalise._normalise_config(CONFIG, EPOCH, ["sha256:" + "11" * 32])
    cfg = json.loads(raw)
    assert cfg["created"] == "2023-11-14T22:13:20Z"
    assert {h["created"] for h in cfg["history"]} == {"2023-11-14T22:13:20Z"}
    assert [h["created_by"] for h in cfg["history"]] == ["RUN x", "LABEL a=b"]
    for key in ("container", "container_config", "docker_version"):
        assert key not in cfg
    assert cfg["config"]["Image"] == "" and cfg["config"]["Labels"] == {"a": "b"}
    assert cfg["rootfs"]["diff_ids"] == ["sha256:" + "11" * 32]
    assert normalise._image_id(raw) == "sha256:" + hashlib.sha256(raw).hexdigest()


def test_configs_from_two_builds_of_the_same_content_are_equal_bytes():
    other = json.loads(json.dumps(CONFIG))
    other.update(created="2027-01-01T00:00:00Z", container="be" * 32, docker_version="24.0.7")
    other["config"]["Image"] = "sha256:" + "cd" * 32
    other["container_config"]["Hostname"] = "beefbeef"
    other["history"][0]["created"] = "2027-01-01T00:00:00Z"
    diff = ["sha256:" + "11" * 32]
    assert normalise._normalise_config(CONFIG, EPOCH, diff) == normalise._normalise_config(other, EPOCH, diff)
    changed = json.loads(json.dumps(other))
    changed["config"]["Env"] = ["X=2"]
    assert normalise._normalise_config(changed, EPOCH, diff) != normalise._normalise_config(CONFIG, EPOCH, diff)


def test_a_saved_image_round_trips_through_files(tmp_path):
    """extract_saved + normalise_saved on a docker-save-shaped archive: one config, two
    layers, the manifest; the written archive names the config by its sha256."""
    layer = _layer(list(FILES), mtimes=dict.fromkeys(FILES, 2 * EPOCH))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (
            ("aaa/layer.tar", layer),
            ("bbb/layer.tar", layer),
            ("cfg.json", json.dumps(CONFIG).encode()),
            (
                "manifest.json",
                json.dumps(
                    [{"Config": "cfg.json", "RepoTags": None, "Layers": ["aaa/layer.tar", "bbb/layer.tar"]}]
                ).encode(),
            ),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    chunks = [raw[i : i + 777] for i in range(0, len(raw), 777)]
    normalise.extract_saved(chunks, tmp_path / "s")
    result = normalise.normalise_saved(tmp_path / "s", EPOCH)
    assert result.diff_ids[0] == result.diff_ids[1] == _normalised(layer)[1]
    with tarfile.open(fileobj=io.BytesIO(b"".join(result.archive()))) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())
        cfg_bytes = tar.extractfile(manifest[0]["Config"]).read()
        assert normalise._image_id(cfg_bytes) == result.image_id
        assert manifest[0]["Config"] == result.image_id.split(":")[1] + ".json"
        assert len({m.name for m in tar.getmembers() if m.name.endswith(".tar")}) == 1
    assert not list((tmp_path / "s" / "out").iterdir())  # each layer file went once it was sent


def _saved(tmp_path, layers: list[bytes]):
    """A docker-save-shaped folder of one image with `layers` (the config names their sha256)."""
    cfg = json.loads(json.dumps(CONFIG))
    cfg["rootfs"] = {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(x).hexdigest() for x in layers]}
    buf = io.BytesIO()
    rels = [f"l{i}/layer.tar" for i in range(len(layers))]
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (
            *zip(rels, layers, strict=True),
            ("cfg.json", json.dumps(cfg).encode()),
            ("manifest.json", json.dumps([{"Config": "cfg.json", "RepoTags": None, "Layers": rels}]).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    normalise.extract_saved([buf.getvalue()], tmp_path)
    return cfg["rootfs"]["diff_ids"]


def test_the_parents_layers_stay_byte_for_byte_and_out_of_the_archive(tmp_path):
    """A layer of the FROM image (`keep`) keeps its digest even though it is not in normal
    form (a pulled base's layer); only the added layer is rewritten and written out."""
    parent_layer = _layer(list(reversed(FILES)), mtimes=dict.fromkeys(FILES, 2 * EPOCH), uname="builder")
    added = _layer(list(FILES), mtimes=dict.fromkeys(FILES, 3 * EPOCH), content={"etc/conf": b"x=2\n"})
    diff_ids = _saved(tmp_path / "s", [parent_layer, added])
    result = normalise.normalise_saved(tmp_path / "s", EPOCH, keep=diff_ids[:1])
    assert result.diff_ids == [diff_ids[0], _normalised(added)[1]]
    assert result.kept == normalise._kept_prefix(result.diff_ids, diff_ids[:1]) == 1
    with tarfile.open(fileobj=io.BytesIO(b"".join(result.archive()))) as tar:
        names = {m.name for m in tar.getmembers()}
        manifest = json.loads(tar.extractfile("manifest.json").read())
    assert names == {"manifest.json", manifest[0]["Config"], _normalised(added)[1].split(":")[1] + ".tar"}
    assert len(manifest[0]["Layers"]) == 2  # the kept one is named (docker load finds it by its chain)
    # without the parent, both layers are rewritten: another first diff id, another image id
    diff_ids2 = _saved(tmp_path / "t", [parent_layer, added])
    whole = normalise.normalise_saved(tmp_path / "t", EPOCH)
    assert whole.diff_ids[0] == _normalised(parent_layer)[1] != diff_ids2[0]
    assert whole.image_id != result.image_id


def test_keep_counts_only_a_prefix_in_order():
    a, b, c = ("sha256:" + x * 64 for x in "abc")
    assert normalise._kept_prefix([a, b, c], [a, b]) == 2
    assert normalise._kept_prefix([a, b, c], [b]) == 0  # not the FROM image's layers
    assert normalise._kept_prefix([a, c], [a, b, c]) == 1
    assert normalise._kept_prefix([a], []) == 0
