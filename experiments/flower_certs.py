r"""Throwaway TLS certificates and SuperNode keys for a test federation. TESTING ONLY.

  python experiments/flower_certs.py --dir=$HOME/flower/tls --hosts=localhost,127.0.0.1
  python experiments/flower_certs.py --dir=$HOME/flower/keys --node_keys=client-0,client-1
  python experiments/flower_certs.py --dir=$HOME/flower/tls/nodes --ca=$HOME/flower/tls \
      --supernode_certs=client-0,client-1

Writes a self-signed CA (``ca.crt``, ``ca.key``) and a server certificate for ``--hosts``
signed by it (``server.crt``, ``server.key``): what ``flower-superlink --ssl-*`` and
``--root-certificates`` of SuperNodes and of the ``flwr`` CLI take. With
``--node_keys``, one SuperNode key pair per name (``<name>``, ``<name>.pub``: P-384,
OpenSSH format) for ``flower-supernode --auth-supernode-private-key`` and
``flwr supernode register``. With ``--supernode_certs``, one certificate and key per name
(``<name>.crt``, ``<name>.key``) signed by the CA in ``--ca``: each SuperNode's own for
its local Runtime API (``--ssl-certfile``/``--ssl-keyfile``), so no SuperNode holds the
SuperLink's key. Every file is written mode 0600 into a folder that must be private to
this user (created 0700; an existing one that another user could write is refused). Keys are written unencrypted: a real deployment takes its
certificates from its own PKI and makes each SuperNode's key on that SuperNode
(docs/deploy.md). ``experiments/flower_federation.py`` calls the same functions
(``fedjax_het/deploy/certs.py``).
"""
from absl import flags

from fedjax_het import cli
from fedjax_het.deploy import certs

_DIR = flags.DEFINE_string("dir", None, "Output directory (created).")
_HOSTS = flags.DEFINE_list("hosts", list(certs.LOOPBACK_HOSTS), "Names and addresses "
                           "the SuperLink is reached at (the certificate's SANs).")
_DAYS = flags.DEFINE_integer("days", 7, "Validity of the certificates.")
_NODE_KEYS = flags.DEFINE_list("node_keys", [], "Write SuperNode key pairs of these names "
                               "instead of certificates.")
_CA = flags.DEFINE_string("ca", None, "With --supernode_certs: the folder holding the "
                          "CA (ca.crt, ca.key) that signs them.")
_SUPERNODE_CERTS = flags.DEFINE_list("supernode_certs", [], "Write a SuperNode "
                                     "certificate and key of these names instead.")
flags.mark_flag_as_required("dir")


def main(argv):
  del argv
  try:
    write()
  except (ValueError, OSError) as err:  # a folder refused (private.InsecurePath): one line
    cli.fail(err)


def write():
  if _SUPERNODE_CERTS.value:
    if not _CA.value:
      raise ValueError("--supernode_certs needs --ca (the folder of ca.crt and ca.key)")
    import os  # pylint: disable=import-outside-toplevel
    ca = certs.TlsFiles(os.path.join(_CA.value, "ca.crt"), "", "")
    for name in _SUPERNODE_CERTS.value:
      own = certs.make_supernode_tls(ca, _DIR.value, name, _HOSTS.value, days=_DAYS.value)
      print(f"{name}: certificate {own.server_cert} (key {own.server_key}) signed by "
            f"{own.ca_cert}")
    return
  if _NODE_KEYS.value:
    for name in _NODE_KEYS.value:
      key = certs.make_node_key(_DIR.value, name)
      print(f"{name}: private {key.private_key}, public {key.public_key}")
    return
  tls = certs.make_tls(_DIR.value, _HOSTS.value, days=_DAYS.value)
  print(f"CA {tls.ca_cert}; server certificate {tls.server_cert} (key {tls.server_key}) "
        f"for {','.join(_HOSTS.value)}, valid {_DAYS.value} days. TESTING ONLY.")


if __name__ == "__main__":
  cli.run(main, flag=None)
