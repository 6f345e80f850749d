"""The webhook's certificates (elasticgpu.controller.admission.certificates): pure, no server."""

from __future__ import annotations

import datetime
import ssl

import pytest
from cryptography import x509

from elasticgpu.controller.admission import certificates, serving

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
DAY = 86400.0
HOSTS = ["elasticgpu-webhook.elasticgpu-system.svc", "127.0.0.1"]


def _fresh(**options: object) -> certificates.Material:
    return certificates.generate(hosts=HOSTS, now=NOW, validity_s=365 * DAY, **options)  # type: ignore[arg-type]


def test_fresh_material_needs_nothing_and_survives_the_secret() -> None:
    material = _fresh()
    assert certificates.renewal_reason(material, hosts=HOSTS, now=NOW, renew_before_s=30 * DAY) is None
    assert certificates.Material.from_secret_data(material.to_secret_data()) == material
    cert = x509.load_pem_x509_certificate(material.cert)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [HOSTS[0]]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == [HOSTS[1]]
    serving.tls_context(material)  # loads as a server certificate with its key


def _with_other_ca(material: certificates.Material) -> certificates.Material:
    other = _fresh()
    return certificates.Material(other.ca_cert, other.ca_key, material.cert, material.key)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda m: None, "no certificate stored yet"),
        (lambda m: certificates.Material(m.ca_cert, m.ca_key, m.cert, _fresh().key), "does not belong"),
        (lambda m: _with_other_ca(m), "not signed by"),
        (lambda m: certificates.Material(m.ca_cert, m.ca_key, b"garbage", m.key), "unreadable"),
    ],
)
def test_unusable_material_is_replaced(change, reason: str) -> None:  # type: ignore[no-untyped-def]
    found = certificates.renewal_reason(change(_fresh()), hosts=HOSTS, now=NOW, renew_before_s=30 * DAY)
    assert found is not None and reason in found


def test_other_names_or_little_time_left_mean_renewal() -> None:
    material = _fresh()
    other = certificates.renewal_reason(material, hosts=["other.svc"], now=NOW, renew_before_s=DAY)
    assert other == "stored certificate lacks the names other.svc"
    late = NOW + datetime.timedelta(days=340)
    assert "expires at" in str(certificates.renewal_reason(material, hosts=HOSTS, now=late, renew_before_s=30 * DAY))
    assert certificates.renewal_reason(material, hosts=HOSTS, now=late, renew_before_s=20 * DAY) is None


def test_the_previous_ca_stays_trusted_until_it_expires() -> None:
    old = _fresh()
    new = _fresh(previous=old)
    assert new.previous_ca == old.ca_cert
    assert new.ca_bundle(now=NOW) == new.ca_cert + old.ca_cert
    assert new.ca_bundle(now=NOW + datetime.timedelta(days=366)) == new.ca_cert
    # A bundle with both verifies both certificates (what the API server does during a renewal).
    for material in (old, new):
        context = ssl.create_default_context(cadata=new.ca_bundle(now=NOW).decode())
        assert context.cert_store_stats()["x509_ca"] == 2
        assert material.serial() > 0
    expired = certificates.generate(hosts=HOSTS, now=NOW - datetime.timedelta(days=2), validity_s=DAY)
    assert _fresh(previous=expired).previous_ca == b""
