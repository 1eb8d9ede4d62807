"""Throwaway TLS certificates and SuperNode keys for loopback federations. TESTING ONLY.

``make_tls`` writes a self-signed certificate authority and a server certificate for
the given host names and addresses (``localhost`` and ``127.0.0.1`` by default) signed
by it; ``make_node_key`` writes one SuperNode's authentication key pair (elliptic curve
P-384 in OpenSSH format, what ``flower-supernode --auth-supernode-private-key`` and
``flwr supernode register`` read). The CA's private key is written beside its
certificate and never protected by a passphrase: anyone who reads the directory can
issue certificates the federation trusts. A real deployment gets its certificates from
its own PKI and generates each SuperNode's key on that SuperNode (docs/deploy.md).
``make_supernode_tls`` gives one SuperNode a certificate and key of its own for its local
Runtime API (signed by the same CA), so no SuperNode holds the SuperLink's key.

Every file is written by ``private.write_private`` (a new file opened with ``O_EXCL |
O_NOFOLLOW``, mode 0600, renamed over the name: an existing file of another mode or a
symlink is replaced, never written through) into a folder ``private.ensure_private``
accepts (owned by this user, writable by nobody else).
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

from fedjax_het.deploy import private

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


def _write(path: str, data: bytes) -> str:
  """Writes ``data`` to ``path`` (mode 0600, ``private.write_private``); returns it."""
  return private.write_private(path, data)


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
    directory: created if missing (mode 0700; refused unless private); receives
      ``ca.crt``, ``ca.key``, ``server.crt``, ``server.key`` (keys unencrypted; every
      file mode 0600).
    hosts: the names and addresses clients connect to (the certificate's subject
      alternative names); TLS clients check the address they dial against them.
    days: validity.

  Returns:
    the paths the SuperLink (``--ssl-ca-certfile``, ``--ssl-certfile``,
    ``--ssl-keyfile``) and its clients (``--root-certificates``) take.
  """
  if not hosts:
    raise ValueError("make_tls needs at least one host name or address")
  private.ensure_private(directory)
  ca_key = ec.generate_private_key(ec.SECP384R1())
  ca_name = "fedjax-het throwaway test CA"
  ca = _certificate(ca_name, ca_key.public_key(), ca_name, ca_key, days=days, ca=True)
  key = ec.generate_private_key(ec.SECP384R1())
  cert = _certificate(hosts[0], key.public_key(), ca_name, ca_key, days=days, ca=False,
                      hosts=hosts)
  path = lambda name: os.path.join(directory, name)
  _write(path("ca.key"), _pem_key(ca_key))
  return TlsFiles(
      ca_cert=_write(path("ca.crt"), ca.public_bytes(serialization.Encoding.PEM)),
      server_cert=_write(path("server.crt"), cert.public_bytes(serialization.Encoding.PEM)),
      server_key=_write(path("server.key"), _pem_key(key)))


def make_node_key(directory: str, name: str) -> NodeKey:
  """Writes SuperNode ``name``'s authentication key pair (TESTING ONLY).

  Returns:
    ``<directory>/<name>`` (the private key, OpenSSH format, mode 0600, for
    ``flower-supernode --auth-supernode-private-key``) and ``<name>.pub`` (the public
    key, for ``flwr supernode register``).
  """
  private.ensure_private(directory)
  key = ec.generate_private_key(ec.SECP384R1())
  secret = key.private_bytes(serialization.Encoding.PEM,
                              serialization.PrivateFormat.OpenSSH,
                              serialization.NoEncryption())
  public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                         serialization.PublicFormat.OpenSSH)
  base = os.path.join(directory, name)
  return NodeKey(_write(base, secret), _write(base + ".pub", public + f" {name}\n".encode()))


def make_supernode_tls(tls: TlsFiles, directory: str, name: str,
                       hosts: Sequence[str] = LOOPBACK_HOSTS, *, days: int = 7
                       ) -> TlsFiles:
  """A certificate and key of SuperNode ``name``'s own for its local Runtime API (what
  its ClientApps dial), signed by ``tls``'s CA (its key ``ca.key`` beside
  ``tls.ca_cert``). TESTING ONLY.

  Returns:
    ``TlsFiles(ca_cert, <directory>/<name>.crt, <directory>/<name>.key)``: the
    SuperNode's ``--ssl-ca-certfile``, ``--ssl-certfile`` and ``--ssl-keyfile``.
  """
  private.ensure_private(directory)
  ca_dir = os.path.dirname(os.path.abspath(tls.ca_cert))
  # the CA's folder (and its ancestors) checked before its key or certificate is read:
  # a folder another user controls could hand us their CA
  ca_key = serialization.load_pem_private_key(
      private.read_private(os.path.join(ca_dir, "ca.key")), None)
  ca = x509.load_pem_x509_certificate(private.read_private(tls.ca_cert))
  issuer = ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
  key = ec.generate_private_key(ec.SECP384R1())
  cert = _certificate(hosts[0], key.public_key(), issuer, ca_key, days=days, ca=False,
                      hosts=hosts)
  base = os.path.join(directory, name)
  return TlsFiles(tls.ca_cert, _write(base + ".crt",
                                      cert.public_bytes(serialization.Encoding.PEM)),
                  _write(base + ".key", _pem_key(key)))
