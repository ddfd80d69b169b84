"""A throwaway certificate authority and one server certificate for the local lab.

Owns generating keys and certificates (the ``cryptography`` package) and writing them as PEM files
into a directory the caller chose. The CA's PEM is what the sidecar gets through ``-ca-file``, so a
test or the demo verifies TLS for real instead of turning verification off. Must not touch the
system trust store, reuse keys between calls or write outside the given directory.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Backdating covers a clock that is a little behind the one that signed; a day of validity is
# plenty for a certificate that lives as long as one test session or one demo run.
_BACKDATE = datetime.timedelta(minutes=5)
_VALIDITY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class CertPaths:
    """Where :func:`make_ca_and_cert` wrote its files (all PEM)."""

    ca_pem: Path
    cert_pem: Path
    key_pem: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "sidecar-fsm lab"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _subject_alt_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _write_private(path: Path, data: bytes) -> None:
    # The key is created 0600 from the start (not chmod-ed afterwards), so no other user can
    # open it in the window between create and chmod.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """Digital signatures always (ECDSA handshakes); certificate and CRL signing for the CA only."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    """A certificate for ``key``, valid from a few minutes ago (clock skew) to a day from now."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + _VALIDITY)
    )


def _make_ca() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA that may sign server certificates but no further CA (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name("sidecar-fsm lab CA")
    cert = (
        _builder(name, name, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _make_leaf(
    ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, hosts: Sequence[str]
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A server certificate for ``hosts`` (names and IPs as SANs), signed by the CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(_name(hosts[0]), ca_cert.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(_subject_alt_names(hosts)), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def make_ca_and_cert(directory: Path, hosts: Sequence[str] = ("localhost", "127.0.0.1")) -> CertPaths:
    """Create a fresh CA and a server certificate for ``hosts`` signed by it, as PEM files.

    Writes ``ca.pem`` (the CA certificate only; its key is never written), ``cert.pem`` (the
    server certificate followed by the CA, a full chain) and ``key.pem`` (the server key, mode
    0600) into ``directory``, creating it if needed and overwriting earlier files. Every call
    makes new keys, so two labs never trust each other. Raises ``ValueError`` for an empty
    ``hosts``: a certificate that names no host would fail every handshake.
    """
    if not hosts:
        raise ValueError("make_ca_and_cert: hosts is empty; name at least one host or ip")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _make_ca()
    leaf_key, leaf_cert = _make_leaf(ca_key, ca_cert, hosts)
    paths = CertPaths(
        ca_pem=directory / "ca.pem", cert_pem=directory / "cert.pem", key_pem=directory / "key.pem"
    )
    ca_bytes = ca_cert.public_bytes(serialization.Encoding.PEM)
    paths.ca_pem.write_bytes(ca_bytes)
    paths.cert_pem.write_bytes(leaf_cert.public_bytes(serialization.Encoding.PEM) + ca_bytes)
    _write_private(
        paths.key_pem,
        leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    return paths
