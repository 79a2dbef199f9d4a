"""Key files in cosign's formats: kiln reads keys the real cosign wrote, and what kiln
writes is what cosign's reader (go-securesystemslib's encrypted format) expects."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat

import nacl.secret
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from kilntest import run_kiln
from signtest import PASSWORD, fixture

from kiln.basics.errors import SigningKeyInvalid, SigningPasswordInvalid
from kiln.domain.signing import keys


def _body(pem: bytes) -> dict:
    lines = [ln for ln in pem.decode().splitlines() if ln and not ln.startswith("-----")]
    return json.loads(base64.b64decode("".join(lines)))


@pytest.mark.parametrize("name", ["sigstore-labelled.key", "cosign-labelled.key"])
def test_decrypts_private_keys_written_by_cosign(name):
    path = fixture("cosign-keys", name)
    key = keys.load_private_key(path, PASSWORD)
    # the decrypted key really is the private half: a signature by it verifies
    signature = key.sign(b"kiln")
    assert key.public.verifies(signature, b"kiln")
    assert not key.public.verifies(signature, b"kiln!")
    assert repr(key).startswith(f"PrivateKey({path}, public sha256:")


def test_a_wrong_password_is_one_line_naming_the_file():
    path = fixture("cosign-keys", "sigstore-labelled.key")
    with pytest.raises(SigningPasswordInvalid) as exc:
        keys.load_private_key(path, b"not hello")
    assert str(path) in exc.value.message and "\n" not in exc.value.message
    assert "not hello" not in exc.value.message


def test_a_sec1_key_inside_is_refused_as_cosign_refuses_it():
    # cosign's own test expects "use ParseECPrivateKey instead for this key format" here
    with pytest.raises(SigningKeyInvalid, match="not PKCS#8"):
        keys.load_private_key(fixture("cosign-keys", "cosign-labelled-sec1.key"), PASSWORD)


def test_written_keys_follow_go_securesystemslib_field_by_field(tmp_path):
    files = keys.write_key_pair(tmp_path / "cosign", b"pw")
    pem = files.private.read_bytes()
    real = fixture("cosign-keys", "sigstore-labelled.key").read_bytes()
    assert pem.splitlines()[0] == real.splitlines()[0] == b"-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----"
    assert all(len(line) <= 64 for line in pem.splitlines())
    ours, theirs = _body(pem), _body(real)
    # same keys at every level, same names, same sizes
    assert list(ours) == list(theirs) == ["kdf", "cipher", "ciphertext"]
    assert list(ours["kdf"]) == list(theirs["kdf"]) and list(ours["kdf"]["params"]) == ["N", "r", "p"]
    assert ours["kdf"]["name"] == "scrypt" and ours["cipher"]["name"] == "nacl/secretbox"
    assert ours["kdf"]["params"] == {"N": 65536, "r": 8, "p": 1}  # encrypted.go standardParams
    for field in ("salt",):
        assert len(base64.b64decode(ours["kdf"][field])) == len(base64.b64decode(theirs["kdf"][field])) == 32
    assert len(base64.b64decode(ours["cipher"]["nonce"])) == 24
    # decrypt by hand, with nothing of kiln's: scrypt, secretbox, PKCS#8
    p = ours["kdf"]["params"]
    box_key = hashlib.scrypt(
        b"pw",
        salt=base64.b64decode(ours["kdf"]["salt"]),
        n=p["N"],
        r=p["r"],
        p=p["p"],
        dklen=32,
        maxmem=256 * 1024 * 1024,
    )
    der = nacl.secret.SecretBox(box_key).decrypt(
        base64.b64decode(ours["ciphertext"]), base64.b64decode(ours["cipher"]["nonce"])
    )
    private = serialization.load_der_private_key(der, None)
    assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp256r1"
    public = serialization.load_pem_public_key(files.public.read_bytes())
    assert public.public_numbers() == private.public_key().public_numbers()
    assert files.fingerprint == keys.load_public_key(files.public).fingerprint


def test_written_public_key_is_read_by_securesystemslib(tmp_path):
    from securesystemslib.signer import CryptoSigner, SSlibKey

    files = keys.write_key_pair(tmp_path / "k", b"pw")
    # securesystemslib (Python) has no reader for the encrypted private key format (only
    # Go's go-securesystemslib has, which cosign uses: test_written_keys_follow_... checks
    # that format by hand); its keys come from cryptography objects, here read from the PEM
    sslib_key = SSlibKey.from_crypto(serialization.load_pem_public_key(files.public.read_bytes()))
    assert sslib_key.keytype == "ecdsa" and sslib_key.scheme == "ecdsa-sha2-nistp256"
    private = keys.load_private_key(files.private, b"pw")
    signer = CryptoSigner(serialization.load_der_private_key(private.pkcs8(), None))
    sig = signer.sign(b"payload")
    sslib_key.verify_signature(sig, b"payload")  # raises if the keys do not match
    assert private.public.verifies(bytes.fromhex(sig.signature), b"payload")


def test_key_pair_files_are_private_and_never_overwritten(tmp_path):
    files = keys.write_key_pair(tmp_path / "cosign", b"pw")
    assert stat.S_IMODE(os.stat(files.private).st_mode) == 0o600
    before = files.private.read_bytes()
    with pytest.raises(SigningKeyInvalid, match="exists"):
        keys.write_key_pair(tmp_path / "cosign", b"other")
    assert files.private.read_bytes() == before


@pytest.mark.parametrize(
    "mutate, error",
    [
        (lambda d: d.update(kdf={**d["kdf"], "params": {"N": 1 << 30, "r": 8, "p": 1}}), "unsupported scrypt"),
        (lambda d: d.update(cipher={**d["cipher"], "name": "aes"}), "unknown cipher"),
        (lambda d: d.update(cipher={**d["cipher"], "nonce": "AAAA"}), "nonce"),
        (lambda d: d.pop("ciphertext"), "no field ciphertext"),
    ],
)
def test_damaged_key_files_fail_in_one_line(tmp_path, mutate, error):
    pem = fixture("cosign-keys", "sigstore-labelled.key").read_bytes()
    doc = _body(pem)
    mutate(doc)
    body = base64.b64encode(json.dumps(doc).encode()).decode()
    damaged = tmp_path / "damaged.key"
    damaged.write_text(
        f"-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n{body}\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n"
    )
    with pytest.raises(SigningKeyInvalid, match=error) as exc:
        keys.load_private_key(damaged, PASSWORD)
    assert "\n" not in exc.value.message


def test_a_flipped_ciphertext_byte_is_caught_by_the_mac():
    pem = fixture("cosign-keys", "sigstore-labelled.key").read_bytes()
    doc = _body(pem)
    raw = bytearray(base64.b64decode(doc["ciphertext"]))
    raw[10] ^= 1
    doc["ciphertext"] = base64.b64encode(bytes(raw)).decode()
    body = base64.b64encode(json.dumps(doc).encode())
    with pytest.raises(SigningPasswordInvalid):
        keys._decrypt(
            b"-----BEGIN ENCRYPTED COSIGN PRIVATE KEY-----\n"
            + body
            + b"\n-----END ENCRYPTED COSIGN PRIVATE KEY-----\n",
            PASSWORD,
            "x.key",
        )


def test_public_keys_other_than_p256_are_refused(tmp_path):
    other = ec.generate_private_key(ec.SECP384R1()).public_key()
    path = tmp_path / "p384.pub"
    path.write_bytes(other.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(SigningKeyInvalid, match="secp384r1"):
        keys.load_public_key(path)
    (tmp_path / "junk.pub").write_text("hello")
    with pytest.raises(SigningKeyInvalid, match="not a PEM"):
        keys.load_public_key(tmp_path / "junk.pub")


def test_fingerprint_is_sha256_of_the_der_public_key():
    pub = keys.load_public_key(fixture("cosign-v3", "cosign.pub"))
    # the value the source of this fixture records for the same key (see README)
    assert pub.fingerprint == "sha256:dc2bcfdb0402cd0845f59232655c3ab2a53d55849d4665579efe45c6cc753478"
    der = serialization.load_pem_public_key(fixture("cosign-v3", "cosign.pub").read_bytes()).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert pub.fingerprint == "sha256:" + hashlib.sha256(der).hexdigest()
    assert hashes.SHA256  # the scheme the signatures use (see test_cosign_fixtures)


def test_cli_generate_reads_the_password_from_the_environment_or_stdin(tmp_path, monkeypatch):
    for name in ("KILN_SIGNING_PASSWORD", "COSIGN_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    env = {"KILN_SIGNING_PASSWORD": "s3cret-pw"}
    done = run_kiln("keys", "generate", "--output-key-prefix", str(tmp_path / "team"), env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    fingerprint = done.stdout.strip()
    assert fingerprint == keys.load_public_key(tmp_path / "team.pub").fingerprint
    assert "s3cret-pw" not in done.stdout + done.stderr
    keys.load_private_key(tmp_path / "team.key", b"s3cret-pw")
    again = run_kiln("keys", "generate", "--output-key-prefix", str(tmp_path / "team"), env=env, cwd=tmp_path)
    assert again.returncode == 80 and "exists" in again.stderr
    # cosign's variable works too
    cosign = run_kiln(
        "keys", "generate", "--output-key-prefix", str(tmp_path / "c"), cwd=tmp_path, env={"COSIGN_PASSWORD": "pw2"}
    )
    assert cosign.returncode == 0, cosign.stderr
    keys.load_private_key(tmp_path / "c.key", b"pw2")
    # a password on stdin (a pipe)
    piped = run_kiln(
        "keys", "generate", "--output-key-prefix", str(tmp_path / "piped"), cwd=tmp_path, input="from-stdin\n"
    )
    assert piped.returncode == 0, piped.stderr
    keys.load_private_key(tmp_path / "piped.key", b"from-stdin")
    empty = run_kiln(
        "keys",
        "generate",
        "--output-key-prefix",
        str(tmp_path / "empty"),
        cwd=tmp_path,
        env={"KILN_SIGNING_PASSWORD": ""},
    )
    assert empty.returncode == 81 and not (tmp_path / "empty.key").exists()
    nothing = run_kiln("keys", "generate", "--output-key-prefix", str(tmp_path / "none"), cwd=tmp_path, input="")
    assert nothing.returncode == 81 and "stdin is empty" in nothing.stderr


def test_there_is_no_password_flag():
    done = run_kiln("keys", "generate", "--password", "x")
    assert done.returncode == 64
