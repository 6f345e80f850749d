"""The webhook's certificates: generated, read back from a Secret, checked. Pure: no I/O.

A `Material` is a CA and a serving certificate it signed, generated together, plus the CA
they replaced (`previous_ca`): the caBundle lists both until the old CA expires, so an API
server that still holds the old bundle, or a replica that still serves the old certificate,
keeps working while a renewal spreads.
"""

from __future__ import annotations

import base64
import datetime
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from elasticgpu import certificate_authority as authority

# Keys of the Secret's data; tls.crt and tls.key make it a valid `kubernetes.io/tls` Secret.
CA_CERT = "ca.crt"
CA_KEY = "ca.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
PREVIOUS_CA_CERT = "ca-previous.crt"
SECRET_TYPE = "kubernetes.io/tls"
_BACKDATE = datetime.timedelta(minutes=5)  # tolerate clocks of the API server a little behind ours


@dataclass(frozen=True)
class Material:
    """PEM bytes of a CA, a serving certificate and key it signed, and the CA it replaced."""

    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes
    previous_ca: bytes = b""

    def to_secret_data(self) -> dict[str, str]:
        """The Secret's `data` (base64 values)."""
        data = {CA_CERT: self.ca_cert, CA_KEY: self.ca_key, TLS_CERT: self.cert, TLS_KEY: self.key}
        if self.previous_ca:
            data[PREVIOUS_CA_CERT] = self.previous_ca
        return {key: base64.b64encode(value).decode() for key, value in data.items()}

    @classmethod
    def from_secret_data(cls, data: dict[str, str] | None) -> Material | None:
        """Read a Secret's `data`; None when a part is missing or not base64."""
        data = data or {}
        try:
            parts = {key: base64.b64decode(data[key], validate=True) for key in (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY)}
            previous = base64.b64decode(data.get(PREVIOUS_CA_CERT, ""), validate=True)
        except (KeyError, ValueError):
            return None
        return cls(parts[CA_CERT], parts[CA_KEY], parts[TLS_CERT], parts[TLS_KEY], previous)

    def ca_bundle(self, *, now: datetime.datetime) -> bytes:
        """PEM CAs the API server should trust: the current CA, and the previous one while it is valid."""
        bundle = self.ca_cert
        if self.previous_ca:
            try:
                previous = x509.load_pem_x509_certificate(self.previous_ca)
            except ValueError:
                return bundle
            if previous.not_valid_after_utc > now:
                bundle += self.previous_ca
        return bundle

    def not_after(self) -> datetime.datetime:
        """When the serving certificate expires (UTC)."""
        return x509.load_pem_x509_certificate(self.cert).not_valid_after_utc

    def serial(self) -> int:
        """Serial number of the serving certificate (tells one generation from the next)."""
        return int(x509.load_pem_x509_certificate(self.cert).serial_number)


def renewal_reason(
    material: Material | None, *, hosts: list[str], now: datetime.datetime, renew_before_s: float
) -> str | None:
    """Why `material` must be replaced (missing, unreadable, wrong names, expiring), or None if
    it can be served as it is."""
    if material is None:
        return "no certificate stored yet"
    try:
        ca = x509.load_pem_x509_certificate(material.ca_cert)
        cert = x509.load_pem_x509_certificate(material.cert)
        key = serialization.load_pem_private_key(material.key, password=None)
        ca_key = serialization.load_pem_private_key(material.ca_key, password=None)
    except ValueError as error:
        return f"stored certificate unreadable ({error})"
    if key.public_key() != cert.public_key() or ca_key.public_key() != ca.public_key():
        return "stored key does not belong to its certificate"
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "stored certificate was not signed by the stored CA"
    missing = sorted(set(hosts) - set(_names_of(cert)))
    if missing:
        return f"stored certificate lacks the names {', '.join(missing)}"
    remaining = min(cert.not_valid_after_utc, ca.not_valid_after_utc) - now
    if remaining.total_seconds() < renew_before_s:
        return f"stored certificate expires at {cert.not_valid_after_utc.isoformat()}"
    if cert.not_valid_before_utc > now:
        return "stored certificate is not valid yet"
    return None


def generate(
    *, hosts: list[str], now: datetime.datetime, validity_s: float, previous: Material | None = None
) -> Material:
    """A new CA and a serving certificate for `hosts` (DNS names or IP addresses), EC P-256.

    The CA of `previous`, if it is still valid, becomes the new material's `previous_ca`.
    """
    validity = authority.Validity(now - _BACKDATE, now + datetime.timedelta(seconds=validity_s))
    ca = authority.new_ca(f"elasticgpu-webhook-ca-{int(now.timestamp())}", validity)
    # The subject names the first host; the SANs hold every name.
    serving = authority.issue(ca, authority.subject(hosts[0]), usage=authority.SERVER_AUTH, hosts=hosts,
                              validity=validity)
    previous_ca = b""
    if previous is not None:
        try:
            if x509.load_pem_x509_certificate(previous.ca_cert).not_valid_after_utc > now:
                previous_ca = previous.ca_cert
        except ValueError:
            pass  # an unreadable old CA is nothing to keep trusting
    return Material(ca_cert=ca.cert_pem(), ca_key=ca.key_pem(), cert=serving.cert_pem(), key=serving.key_pem(),
                    previous_ca=previous_ca)


def _names_of(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [*san.get_values_for_type(x509.DNSName), *(str(ip) for ip in san.get_values_for_type(x509.IPAddress))]

