r"""Writes the claims ledger (docs/claims.md) from the runs under results/claims/.

  python experiments/claims_page.py --results=results --out=docs/claims.md

The command line of ``fedjax_het.sweeps.claims_page``; ``fedjax_het.sweeps.claims`` says
how claims are read, ``fedjax_het.sweeps.verdicts`` how they are judged; the rows are
``experiments/claims/ledger.py``.
"""
import os
import shlex
import sys

from absl import flags

from fedjax_het import cli as cli_lib
from fedjax_het import config_files
from fedjax_het.sweeps import claim_runs
from fedjax_het.sweeps import claims_page
from fedjax_het.sweeps import gates
from fedjax_het.sweeps import tables

RESULTS = flags.DEFINE_string("results", "results",
                              "The directory the ledger's sweep directories are under.")
OUT = flags.DEFINE_string("out", "docs/claims.md", "The Markdown page to write.")
LEDGER = flags.DEFINE_string("ledger", os.path.join(os.path.dirname(__file__), "claims",
                                                    "ledger.py"),
                             "The ledger file (ABOUT, CLAIMS and NOT_TESTED; "
                             "optionally OPENING, BUDGETS, READINGS with "
                             "READING_NAMES and PAPERS_READING, and NOTE).")
FIGURES = flags.DEFINE_string("figures", "",
                              "Where the figures go (default <results>/claims/figures).")
GATES = flags.DEFINE_bool("gates", True, "Write gates.json beside each finished run of a "
                          "'gates' claim that has its checkpoints and no gates.json yet "
                          "(restores the final checkpoint; commit the file).")


def main(argv):
  del argv
  try:
    ledger = config_files.load_module(LEDGER.value)
    runs = claim_runs.load_sweeps(RESULTS.value, ledger.CLAIMS)
    if GATES.value:
      for claim in (c for c in ledger.CLAIMS if c.test == "gates"):
        for run in claim_runs.group_runs(runs, claim.a):
          if (gates.read_gates(run) is None
              and os.path.isdir(os.path.join(run.workdir, "checkpoints"))):
            print(f"wrote {gates.write_gates(run)}", flush=True)
    text = claims_page.render(
        ledger.CLAIMS, runs, page_path=OUT.value,
        figures_dir=FIGURES.value or os.path.join(RESULTS.value, "claims", "figures"),
        results=RESULTS.value, notes=ledger.NOT_TESTED, about=ledger.ABOUT,
        command=" ".join(shlex.quote(a) for a in ["python", *sys.argv]),
        failures=claim_runs.load_failures(RESULTS.value, ledger.CLAIMS),
        opening=getattr(ledger, "OPENING", ()), budgets=getattr(ledger, "BUDGETS", None),
        readings=getattr(ledger, "READINGS", ()),
        reading_names=getattr(ledger, "READING_NAMES", ()),
        papers_reading=getattr(ledger, "PAPERS_READING", ""),
        note=getattr(ledger, "NOTE", ""))
  except (ValueError, FileNotFoundError) as err:
    cli_lib.fail(err)
  tables.write_text(OUT.value, text)
  print(f"wrote {OUT.value}: {len(ledger.CLAIMS)} rows", flush=True)


if __name__ == "__main__":
  cli_lib.run(main, flag=None)
