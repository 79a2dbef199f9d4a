"""Signing keys in cosign's file formats, written and read by kiln's own code.

A key pair is what `cosign generate-key-pair` writes (sigstore/cosign pkg/cosign/keys.go,
`marshalKeyPair`, read at commit d6d86c22):

- the private key: PKCS#8 DER of an ECDSA P-256 key, encrypted with go-securesystemslib's
  "encrypted" format (encrypted/encrypted.go, commit 8b6ec9cb): a JSON document
  `{"kdf": {"name": "scrypt", "params": {"N", "r", "p"}, "salt"}, "cipher": {"name":
  "nacl/secretbox", "nonce"}, "ciphertext"}` (byte fields in standard base64, as Go's
  encoding/json writes []byte), the key being scrypt(password, salt, N, r, p, 32) and the
  ciphertext NaCl secretbox (XSalsa20-Poly1305) under a random 24-byte nonce; that JSON
  is the body of a PEM block `ENCRYPTED SIGSTORE PRIVATE KEY` (older cosign wrote
  `ENCRYPTED COSIGN PRIVATE KEY`; both are read);
- the public key: PKIX `PUBLIC KEY` PEM.

Only the three scrypt parameter sets go-securesystemslib accepts are read (its
`CheckParams`: N = 2^15, 2^16, 2^17 with r = 8, p = 1), so a tampered key file cannot make
kiln spend unbounded memory; kiln writes 2^16, the "Standard" level cosign writes.

Secrets stay inside this module's objects: a PrivateKey never prints its bytes (repr,
str, errors), and no function here logs, records or returns the password.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

import nacl.exceptions
import nacl.secret
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from kiln.basics.errors import SigningKeyInvalid, SigningPasswordInvalid, one_line

_PRIVATE_PEM_TYPES = ("ENCRYPTED SIGSTORE PRIVATE KEY", "ENCRYPTED COSIGN PRIVATE KEY")
_PRIVATE_PEM_TYPE = _PRIVATE_PEM_TYPES[0]  # what cosign writes since it renamed COSIGN -> SIGSTORE
_PUBLIC_PEM_TYPE = "PUBLIC KEY"
# go-securesystemslib encrypted.go: legacyParams, standardParams, owaspParams (N, r, p)
_SCRYPT_PARAMS = ((32768, 8, 1), (65536, 8, 1), (131072, 8, 1))
_WRITE_SCRYPT = _SCRYPT_PARAMS[1]  # `Standard`, encrypted.Encrypt's default
_SALT_BYTES = 32  # encrypted.go saltSize
_KEY_BYTES = nacl.secret.SecretBox.KEY_SIZE  # 32: boxKeySize
_NONCE_BYTES = nacl.secret.SecretBox.NONCE_SIZE  # 24: boxNonceSize
_SCRYPT_MAXMEM = 256 * 1024 * 1024  # 2^17 * 8 * 128 bytes = 128 MiB, OpenSSL needs headroom above it
_MAX_KEY_FILE = 64 * 1024  # a key file is a few hundred bytes; refuse to read a huge one
_PEM = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n(.*?)\r?\n-----END \1-----", re.DOTALL)


@dataclass(frozen=True)
class PublicKey:
    """An ECDSA P-256 public key and where it came from (for messages)."""

    key: ec.EllipticCurvePublicKey
    source: str

    @property
    def pem(self) -> bytes:
        """The key as a PEM SubjectPublicKeyInfo."""
        return self.key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    @property
    def fingerprint(self) -> str:
        """sha256 of the DER SubjectPublicKeyInfo: what records keep instead of any key
        material (`openssl pkey -pubin -outform DER < KEY.pub | sha256sum` gives the same)."""
        der = self.key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        return "sha256:" + hashlib.sha256(der).hexdigest()

    def verifies(self, signature: bytes, data: bytes) -> bool:
        """ECDSA over SHA-256 with an ASN.1 DER signature: cosign's scheme for P-256 keys
        (sigstore signature.LoadVerifier with crypto.SHA256, ecdsa.VerifyASN1)."""
        try:
            self.key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, ValueError):
            return False
        return True


class PrivateKey:
    """An ECDSA P-256 private key. Deliberately not a dataclass: its repr names the public
    fingerprint only, so a traceback or a debug print cannot show the secret."""

    __slots__ = ("_key", "source")

    def __init__(self, key: ec.EllipticCurvePrivateKey, source: str) -> None:
        self._key = key
        self.source = source

    def __repr__(self) -> str:
        return f"PrivateKey({self.source}, public {self.public.fingerprint})"

    __str__ = __repr__

    @property
    def public(self) -> PublicKey:
        """The key's public half."""
        return PublicKey(self._key.public_key(), self.source)

    def sign(self, data: bytes) -> bytes:
        """ECDSA P-256 / SHA-256, DER-encoded: what cosign verifies."""
        return self._key.sign(data, ec.ECDSA(hashes.SHA256()))

    def pkcs8(self) -> bytes:
        """The key as unencrypted PKCS#8 DER."""
        return self._key.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )


def generate() -> PrivateKey:
    """A fresh ECDSA P-256 key: cosign's default algorithm (GeneratePrivateKey)."""
    return PrivateKey(ec.generate_private_key(ec.SECP256R1()), "generated")


# -- the encrypted private key ------------------------------------------------------------
def _pem(kind: str, body: bytes) -> bytes:
    """PEM as Go's pem.EncodeToMemory writes it: base64 in 64-character lines."""
    text = base64.b64encode(body).decode()
    lines = [text[i : i + 64] for i in range(0, len(text), 64)]
    return ("\n".join([f"-----BEGIN {kind}-----", *lines, f"-----END {kind}-----"]) + "\n").encode()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _scrypt(password: bytes, salt: bytes, params: tuple[int, int, int]) -> bytes:
    n, r, p = params
    return hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, dklen=_KEY_BYTES, maxmem=_SCRYPT_MAXMEM)


def _encrypt(key: PrivateKey, password: bytes) -> bytes:
    """The private key as cosign writes it (encrypted.Encrypt, then pem.EncodeToMemory).
    Field order follows Go's struct order (kdf, cipher, ciphertext) so the file reads the
    same as cosign's; any order is read back."""
    salt, nonce = secrets.token_bytes(_SALT_BYTES), secrets.token_bytes(_NONCE_BYTES)
    box = nacl.secret.SecretBox(_scrypt(password, salt, _WRITE_SCRYPT))
    ciphertext = box.encrypt(key.pkcs8(), nonce).ciphertext  # tag + message, as secretbox.Seal
    n, r, p = _WRITE_SCRYPT
    doc = {
        "kdf": {"name": "scrypt", "params": {"N": n, "r": r, "p": p}, "salt": _b64(salt)},
        "cipher": {"name": "nacl/secretbox", "nonce": _b64(nonce)},
        "ciphertext": _b64(ciphertext),
    }
    return _pem(_PRIVATE_PEM_TYPE, json.dumps(doc, separators=(",", ":")).encode())


def _pem_block(data: bytes, source: str, kinds: tuple[str, ...]) -> tuple[str, bytes]:
    m = _PEM.search(data)
    if m is None:
        raise SigningKeyInvalid(f"{source}: not a PEM file (no -----BEGIN ...----- block)")
    kind = m.group(1).decode()
    if kind not in kinds:
        raise SigningKeyInvalid(f"{source}: a {kind!r} PEM block; expected {' or '.join(repr(k) for k in kinds)}")
    try:
        return kind, base64.b64decode(b"".join(m.group(2).split()), validate=True)
    except (binascii.Error, ValueError):
        raise SigningKeyInvalid(f"{source}: the {kind} block is not valid base64") from None


def _field(doc: object, path: str, source: str) -> object:
    value = doc
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise SigningKeyInvalid(f"{source}: encrypted key has no field {path}")
        value = value[part]
    return value


def _bytes_field(doc: object, path: str, source: str, size: int | None = None) -> bytes:
    value = _field(doc, path, source)
    try:
        raw = base64.b64decode(value, validate=True) if isinstance(value, str) else None
    except (binascii.Error, ValueError):
        raw = None
    if raw is None or (size is not None and len(raw) != size):
        want = f"{size} bytes of " if size is not None else ""
        raise SigningKeyInvalid(f"{source}: encrypted key field {path} is not {want}base64")
    return raw


def _decrypt(data: bytes, password: bytes, source: str) -> PrivateKey:
    """A private key from cosign's encrypted PEM (either PEM type), as cosign's
    LoadPrivateKey reads it: decrypt, then PKCS#8."""
    _, body = _pem_block(data, source, _PRIVATE_PEM_TYPES)
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise SigningKeyInvalid(f"{source}: the encrypted key is not JSON (not a cosign key file?)") from None
    kdf, cipher = _field(doc, "kdf.name", source), _field(doc, "cipher.name", source)
    if kdf != "scrypt":
        raise SigningKeyInvalid(f"{source}: unknown key derivation {one_line(str(kdf))!r} (cosign writes scrypt)")
    if cipher != "nacl/secretbox":
        raise SigningKeyInvalid(f"{source}: unknown cipher {one_line(str(cipher))!r} (cosign writes nacl/secretbox)")
    params = tuple(_field(doc, f"kdf.params.{k}", source) for k in ("N", "r", "p"))
    if params not in _SCRYPT_PARAMS:
        # go-securesystemslib refuses other parameters too: a tampered N would cost unbounded memory
        raise SigningKeyInvalid(
            f"{source}: unsupported scrypt parameters N={params[0]}, r={params[1]}, "
            f"p={params[2]} (cosign writes N=32768 or 65536 with r=8, p=1)"
        )
    salt = _bytes_field(doc, "kdf.salt", source)
    nonce = _bytes_field(doc, "cipher.nonce", source, _NONCE_BYTES)
    ciphertext = _bytes_field(doc, "ciphertext", source)
    box = nacl.secret.SecretBox(_scrypt(password, salt, params))
    try:
        der = box.decrypt(ciphertext, nonce)
    except nacl.exceptions.CryptoError:
        # secretbox authenticates: a wrong password and a damaged file look the same here
        raise SigningPasswordInvalid(f"{source}: wrong password (or the encrypted key was altered)") from None
    return PrivateKey(_ec_private(der, source), source)


def _ec_private(der: bytes, source: str) -> ec.EllipticCurvePrivateKey:
    # PKCS#8 only, as cosign (x509.ParsePKCS8PrivateKey): its PrivateKeyInfo opens with
    # SEQUENCE { INTEGER 0, SEQUENCE algorithm, ... }; a SEC1 "EC PRIVATE KEY" has an
    # OCTET STRING second, and cryptography would accept that silently
    if not _is_pkcs8(der):
        raise SigningKeyInvalid(
            f"{source}: the decrypted key is not PKCS#8 (cosign rejects it too: "
            '"use ParseECPrivateKey instead for this key format")'
        )
    try:
        key = serialization.load_der_private_key(der, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise SigningKeyInvalid(f"{source}: the decrypted key is not a valid PKCS#8 private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise SigningKeyInvalid(
            f"{source}: a {_describe(key)} key; kiln signs with ECDSA P-256 "
            "(cosign's default, what every admission controller accepts)"
        )
    return key


def _is_pkcs8(der: bytes) -> bool:
    """SEQUENCE (short or long length form), then INTEGER 0, then SEQUENCE."""
    if len(der) < 2 or der[0] != 0x30:
        return False
    start = 2 if der[1] < 0x80 else 2 + (der[1] & 0x7F)
    return der[start : start + 4] == b"\x02\x01\x00\x30"


def _describe(key: object) -> str:
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey):
        return f"ECDSA {key.curve.name}"
    return type(key).__name__.removeprefix("_").replace("PrivateKey", "").replace("PublicKey", "") or "non-ECDSA"


def _public_key_from_pem(data: bytes, source: str) -> PublicKey:
    _, der = _pem_block(data, source, (_PUBLIC_PEM_TYPE,))
    try:
        key = serialization.load_der_public_key(der)
    except (ValueError, UnsupportedAlgorithm):
        raise SigningKeyInvalid(
            f"{source}: not a valid public key (damaged PEM, or a point not on its curve)"
        ) from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise SigningKeyInvalid(f"{source}: a {_describe(key)} public key; kiln verifies ECDSA P-256 signatures")
    return PublicKey(key, source)


# -- files --------------------------------------------------------------------------------
def _read(path: Path) -> bytes:
    try:
        with path.open("rb") as fh:
            data = fh.read(_MAX_KEY_FILE + 1)
    except FileNotFoundError:
        raise SigningKeyInvalid(f"{path}: no such key file") from None
    except OSError as exc:
        raise SigningKeyInvalid(f"{path}: cannot read ({exc.strerror})") from None
    if len(data) > _MAX_KEY_FILE:
        raise SigningKeyInvalid(f"{path}: {len(data)}+ bytes is not a key file")
    return data


def load_public_key(path: Path) -> PublicKey:
    """Read a PEM public key file."""
    return _public_key_from_pem(_read(path), str(path))


def load_private_key(path: Path, password: bytes) -> PrivateKey:
    """Read and decrypt an encrypted private key file."""
    return _decrypt(_read(path), password, str(path))


@dataclass(frozen=True)
class KeyPairFiles:
    """A generated key pair's files and the public key's fingerprint."""

    private: Path
    public: Path
    fingerprint: str


def write_key_pair(prefix: Path, password: bytes) -> KeyPairFiles:
    """PREFIX.key (0600, encrypted) and PREFIX.pub, as `cosign generate-key-pair
    --output-key-prefix PREFIX` names them. Never overwrites: a replaced key would orphan
    every signature made with the old one."""
    private, public = prefix.with_name(prefix.name + ".key"), prefix.with_name(prefix.name + ".pub")
    for path in (private, public):
        if path.exists():
            raise SigningKeyInvalid(
                f"{path} exists; kiln does not overwrite keys",
                hint="move it away, or choose another --output-key-prefix",
            )
    key = generate()
    pem = _encrypt(key, password)
    try:
        _write_new(private, pem, 0o600)
        try:
            _write_new(public, key.public.pem, 0o644)
        except BaseException:
            private.unlink(missing_ok=True)  # no half pair left behind
            raise
    except FileExistsError as exc:
        raise SigningKeyInvalid(f"{exc.filename} appeared while writing; kiln does not overwrite keys") from None
    except OSError as exc:
        raise SigningKeyInvalid(f"{exc.filename or prefix}: cannot write ({exc.strerror})") from None
    return KeyPairFiles(private, public, key.public.fingerprint)


def _write_new(path: Path, data: bytes, mode: int) -> None:
    # O_EXCL: never follows or replaces an existing file; the mode is set at creation, so
    # the private key is never readable by others, not even for a moment
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
