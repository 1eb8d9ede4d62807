"""``environment``: the versions, backend and host CPU a run's summary.json records."""
import platform

from fedjax_het.training import environment

X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9654 96-Core Processor
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw avx512_bf16
processor\t: 1
model name\t: another model (a second socket)
flags\t\t: fpu
"""
ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes sve
CPU implementer\t: 0x41
"""


def test_host_cpu_reads_the_first_processors_model_and_vector_extensions():
  assert environment.host_cpu(X86) == {
      "model": "AMD EPYC 9654 96-Core Processor",
      "vector_extensions": ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw",
                            "avx512_bf16"]}
  arm = environment.host_cpu(ARM)  # no 'model name' line: the platform's name
  assert arm["vector_extensions"] == ["asimd", "sve"]
  assert arm["model"] == (platform.processor() or platform.machine())


def test_package_versions_name_a_missing_package_none():
  versions = environment.package_versions(("numpy", "no-such-package-fedjax-het"))
  assert versions["numpy"] and versions["no-such-package-fedjax-het"] is None
