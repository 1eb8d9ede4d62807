"""Throwaway TLS certificates and SuperNode keys for loopback federations. TESTING ONLY.

``make_tls`` writes a self-signed certificate authority and a server certificate for
the given host names and addresses (``localhost`` and ``127.0.0.1`` by default) signed
by it; ``make_node_key`` writes one SuperNode's authentication key pair (elliptic curve
P-384 in OpenSSH format, what ``flower-supernode --auth-supernode-private-key`` and
``flwr supernode register`` read). The CA's private key is written beside its
certificate and never protected by a passphrase: anyone who reads the directory can
issue certificates the federation trusts. A real deployment gets its certificates from
its own PKI and generates each SuperNode's key on that SuperNode (docs/deploy.md).
"""
from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import os
from typing import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.oid import NameOID

LOOPBACK_HOSTS = ("localhost", "127.0.0.1")


@dataclasses.dataclass(frozen=True)
class TlsFiles:
  """Paths of a TLS setup: the CA certificate and the server's certificate and key."""
  ca_cert: str
  server_cert: str
  server_key: str


@dataclasses.dataclass(frozen=True)
class NodeKey:
  """Paths of one SuperNode's key pair (OpenSSH format)."""
  private_key: str
  public_key: str


def _write(path: str, data: bytes, *, private: bool = False) -> str:
  """Writes ``data`` to ``path`` (mode 0600 for a private key); returns the path."""
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
  with os.fdopen(fd, "wb") as f:
    f.write(data)
  return path


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
  return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                           serialization.NoEncryption())


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
  """Subject alternative names: IP addresses as IPs, anything else as DNS names."""
  names = []
  for host in hosts:
    try:
      names.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
      names.append(x509.DNSName(host))
  return x509.SubjectAlternativeName(names)


def _certificate(subject: str, public_key, issuer: str, signer, *, days: int,
                 ca: bool, hosts: Sequence[str] = ()) -> x509.Certificate:
  """An X.509 certificate of ``public_key`` for ``subject``, signed by ``signer``."""
  now = datetime.datetime.now(datetime.timezone.utc)
  name = lambda cn: x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
  builder = (x509.CertificateBuilder()
             .subject_name(name(subject)).issuer_name(name(issuer))
             .public_key(public_key).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=days))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
  if ca:
    builder = builder.add_extension(x509.KeyUsage(
        digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
        key_encipherment=False, data_encipherment=False, key_agreement=False,
        encipher_only=False, decipher_only=False), critical=True)
  else:
    builder = (builder.add_extension(_san(hosts), critical=False)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                              critical=False))
  return builder.sign(signer, hashes.SHA256())


def make_tls(directory: str, hosts: Sequence[str] = LOOPBACK_HOSTS, *,
             days: int = 7) -> TlsFiles:
  """Writes a throwaway CA and a server certificate for ``hosts`` (TESTING ONLY).

  Args:
    directory: created if missing; receives ``ca.crt``, ``ca.key``, ``server.crt``,
      ``server.key`` (keys unencrypted, mode 0600).
    hosts: the names and addresses clients connect to (the certificate's subject
      alternative names); TLS clients check the address they dial against them.
    days: validity.

  Returns:
    the paths the SuperLink (``--ssl-ca-certfile``, ``--ssl-certfile``,
    ``--ssl-keyfile``) and its clients (``--root-certificates``) take.
  """
  if not hosts:
    raise ValueError("make_tls needs at least one host name or address")
  os.makedirs(directory, exist_ok=True)
  ca_key = ec.generate_private_key(ec.SECP384R1())
  ca_name = "fedjax-het throwaway test CA"
  ca = _certificate(ca_name, ca_key.public_key(), ca_name, ca_key, days=days, ca=True)
  key = ec.generate_private_key(ec.SECP384R1())
  cert = _certificate(hosts[0], key.public_key(), ca_name, ca_key, days=days, ca=False,
                      hosts=hosts)
  path = lambda name: os.path.join(directory, name)
  _write(path("ca.key"), _pem_key(ca_key), private=True)
  return TlsFiles(
      ca_cert=_write(path("ca.crt"), ca.public_bytes(serialization.Encoding.PEM)),
      server_cert=_write(path("server.crt"), cert.public_bytes(serialization.Encoding.PEM)),
      server_key=_write(path("server.key"), _pem_key(key), private=True))


def make_node_key(directory: str, name: str) -> NodeKey:
  """Writes SuperNode ``name``'s authentication key pair (TESTING ONLY).

  Returns:
    ``<directory>/<name>`` (the private key, OpenSSH format, mode 0600, for
    ``flower-supernode --auth-supernode-private-key``) and ``<name>.pub`` (the public
    key, for ``flwr supernode register``).
  """
  os.makedirs(directory, exist_ok=True)
  key = ec.generate_private_key(ec.SECP384R1())
  private = key.private_bytes(serialization.Encoding.PEM,
                              serialization.PrivateFormat.OpenSSH,
                              serialization.NoEncryption())
  public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                         serialization.PublicFormat.OpenSSH)
  base = os.path.join(directory, name)
  return NodeKey(_write(base, private, private=True),
                 _write(base + ".pub", public + f" {name}\n".encode()))
