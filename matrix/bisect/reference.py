"""The failing cell's rate the necessity rule-outs read, as a posterior over lambda.

The rule-out of "without flag k the hang is at most F x slower than the failing cell" reads the
failing cell's rate from a pool (the failing cell and the removals that look like it:
`modifiers.reference_pool`); `Reference` is lambda's posterior from that pool, Gamma(hangs,
exposure), and answers "how unlikely is no hang in this much load" and "how much load until that
reaches a level". (A mixture over which flag outside the set is a modifier was tried in place of
the chosen pool: docs/design/bisection.md.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .posterior import exposure_at_level


@dataclass(frozen=True)
class Reference:
    """lambda's posterior: a mixture of Gamma(hangs, exposures[i]) with weights[i] (summing to 1)."""

    hangs: float
    exposures: np.ndarray
    weights: np.ndarray

    def p_no_hang(self, exposure: float) -> float:
        """P(no hang in `exposure` at lambda): small when a config that did not hang in it is slower."""
        if exposure <= 0:
            return 1.0
        e = self.exposures
        return float(np.dot(self.weights, np.exp(self.hangs * (np.log(e) - np.log(e + exposure)))))

    def exposure_until(self, exposure: float, level: float) -> float:
        """The exposure (at least `exposure`) at which no hang would bring p_no_hang down to `level`."""
        return exposure_at_level(self.p_no_hang, exposure, self.mttf(), level)

    def mttf(self) -> float:
        """The failing cell's MTTF, the exposures' mean over the hangs."""
        return float(np.dot(self.weights, self.exposures)) / max(self.hangs, 1.0)

    def plus_cell_hang(self, exposure: float) -> Reference:
        """The reference once the failing cell (in every hypothesis's pool) hangs once more in `exposure`."""
        return Reference(self.hangs + 1, self.exposures + exposure, self.weights)
