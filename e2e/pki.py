"""Certificates for the local control plane: a CA, the apiserver's serving certificate, an
admin client certificate in ``system:masters``, and the service-account signing key.

Everything is generated fresh per cluster with ``cryptography`` (no openssl binary needed) and
lives under the cluster's state directory; none of it is a secret worth protecting, the whole
cluster listens on loopback only.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Long enough for a demo left running for days, short enough to be obviously a test CA.
_VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True)
class PKI:
    ca_cert: Path
    apiserver_cert: Path
    apiserver_key: Path
    admin_cert: Path
    admin_key: Path
    service_account_key: Path


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization is not None:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def generate(directory: Path, service_ip: str = "10.0.0.1") -> PKI:
    """Write a fresh CA and the certificates signed by it into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("kvtune-local-ca")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(
        name: x509.Name, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName] | None
    ) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)

    # The names by which a client inside or outside the (fake) cluster may address it.
    apiserver_sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address(service_ip)),
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
    ]
    server_pem, server_key = leaf(
        _name("kube-apiserver"), ExtendedKeyUsageOID.SERVER_AUTH, apiserver_sans
    )
    admin_pem, admin_key = leaf(
        _name("kvtune-admin", "system:masters"), ExtendedKeyUsageOID.CLIENT_AUTH, None
    )
    # Service-account tokens are signed with RSA: every Kubernetes release accepts it.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    return PKI(
        ca_cert=_write(directory / "ca.crt", ca.public_bytes(serialization.Encoding.PEM)),
        apiserver_cert=_write(directory / "apiserver.crt", server_pem),
        apiserver_key=_write(directory / "apiserver.key", server_key),
        admin_cert=_write(directory / "admin.crt", admin_pem),
        admin_key=_write(directory / "admin.key", admin_key),
        service_account_key=_write(directory / "sa.key", _key_pem(sa_key)),
    )


def load(directory: Path) -> PKI:
    return PKI(
        ca_cert=directory / "ca.crt",
        apiserver_cert=directory / "apiserver.crt",
        apiserver_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        service_account_key=directory / "sa.key",
    )
