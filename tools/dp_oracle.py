#!/usr/bin/env python3
"""Google's dp-accounting as the oracle of Starling's RDP accountant (privacy/accountant.h).

Prints, for a grid of Poisson sampling rates q, noise multipliers sigma, rounds T and deltas, the
epsilon of T rounds of the Poisson-subsampled Gaussian under dp-accounting's RdpAccountant (its
default orders), one line each: q sigma T delta epsilon. tests/privacy/accountant_test.cc checks
Starling's within 1%. With --pld, the same under its PLDAccountant (privacy/pld.h's oracle,
tests/privacy/pld_test.cc).

  scripts/privacy-venv.sh                       # the venv with dp-accounting (outside the tree)
  ~/.cache/starling/privacy-venv/bin/python tools/dp_oracle.py > tests/privacy/dp_accounting_oracle.tsv
  ~/.cache/starling/privacy-venv/bin/python tools/dp_oracle.py --pld > tests/privacy/dp_accounting_pld_oracle.tsv

The file is committed, so that `make test` checks the accountant without the venv; the test
tools_dp_oracle (label oracle, `make test-privacy`) runs this script again and checks the
accountant against its fresh output.
"""
import importlib.metadata
import sys

import dp_accounting
from absl import logging

# dp-accounting warns for each fractional order whose series does not converge and leaves it out;
# Starling's accountant does the same (an infinite RDP at that order).
logging.set_verbosity(logging.ERROR)


def main_pld():
    """The PLD accountant's oracle (privacy/pld.h): dp-accounting's PLDAccountant, its default grid
    step 1e-4, add-or-remove neighbours."""
    from dp_accounting.pld import pld_privacy_accountant

    out = sys.stdout
    out.write("# q sigma rounds delta epsilon  (dp-accounting %s, PLDAccountant, Poisson sampling;"
              " tools/dp_oracle.py --pld)\n" % importlib.metadata.version("dp-accounting"))
    for q in [0.001, 0.01, 0.1, 1.0]:
        for sigma in [0.8, 1.0, 2.0, 5.0]:
            for t in [1, 100, 1000]:
                for delta in [1e-5, 1e-8]:
                    acc = pld_privacy_accountant.PLDAccountant()
                    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
                    acc.compose(event, t)
                    eps = acc.get_epsilon(delta)
                    out.write(f"{q!r} {sigma!r} {t} {delta!r} {eps!r}\n")


def main():
    if "--pld" in sys.argv[1:]:
        return main_pld()
    qs = [0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.3]
    sigmas = [0.5, 0.8, 1.0, 1.5, 3.0, 8.0]
    rounds = [1, 100, 1000, 20000]
    deltas = [1e-5, 1e-8]
    out = sys.stdout
    out.write("# q sigma rounds delta epsilon  (dp-accounting %s, RdpAccountant, Poisson sampling;"
              " tools/dp_oracle.py)\n" % importlib.metadata.version("dp-accounting"))
    for q in qs:
        for sigma in sigmas:
            for t in rounds:
                for delta in deltas:
                    acc = dp_accounting.rdp.RdpAccountant()
                    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
                    acc.compose(event, t)
                    eps = acc.get_epsilon(delta)
                    out.write(f"{q!r} {sigma!r} {t} {delta!r} {eps!r}\n")


if __name__ == "__main__":
    main()
