"""A small certificate authority: an EC P-256 CA and the certificates it signs. Pure: no I/O.

The webhook's serving certificate (controller/admission/certificates.py) and the demo's local
API server (demo/local_cluster.py: serving and admin client certificates) are both made here.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVER_AUTH = ExtendedKeyUsageOID.SERVER_AUTH
CLIENT_AUTH = ExtendedKeyUsageOID.CLIENT_AUTH


@dataclass(frozen=True)
class Validity:
    """When the certificates are valid (UTC)."""

    not_before: datetime.datetime
    not_after: datetime.datetime


@dataclass(frozen=True)
class Issued:
    """A private key and its certificate."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    def cert_pem(self) -> bytes:
        """The certificate, PEM."""
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        """The private key, PEM PKCS#8, unencrypted."""
        return pem_key(self.key)


def subject(common_name: str, organisation: str | None = None) -> x509.Name:
    """A subject name; `organisation` is what Kubernetes reads as the client's group."""
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])]
    if organisation:
        attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organisation))
    return x509.Name(attributes)


def new_ca(common_name: str, validity: Validity) -> Issued:
    """A self-signed CA that signs leaf certificates only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = subject(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity.not_before)
        .not_valid_after(validity.not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(key, cert)


def issue(ca: Issued, name: x509.Name, *, usage: x509.ObjectIdentifier, hosts: list[str] | None,
          validity: Validity) -> Issued:  # fmt: skip
    """A leaf certificate signed by `ca`, for `usage` (SERVER_AUTH or CLIENT_AUTH); `hosts` (DNS
    names or IP addresses) become its subject alternative names."""
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity.not_before)
        .not_valid_after(validity.not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False)
    )
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName([general_name(h) for h in hosts]), critical=False)
    return Issued(key, builder.sign(ca.key, hashes.SHA256()))


def general_name(host: str) -> x509.GeneralName:
    """An IP address entry for an address, a DNS name entry for anything else."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    """A private key as PEM PKCS#8, unencrypted."""
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())  # fmt: skip


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=ca,
        crl_sign=ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )
