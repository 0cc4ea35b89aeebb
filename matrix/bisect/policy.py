"""The flag bisection's policy: every constant that changes an answer or a cost, in one place.

`Settings.policy` carries one of these (frozen: a bisection never changes it), so a benchmark or a
test asks for another value by passing `Policy(field=...)`, never by editing a module. Each field
says why it has its value; what was tried instead and what it measured is in
docs/design/bisection.md and docs/design/alternatives.md.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    # -- limits, calibration and the cap (search.py, posterior.py) ----------------------------------
    # The most elements a bisection takes: the posterior holds every subset (2^16 is milliseconds).
    max_elements: int = 16
    # A calibration probe soaks at most a day without a cap (no soak is for a hang slower than that) ...
    calibration_soak_s: float = 24 * 3600.0
    # ... and this many caps with one (a failing cell that slow does not hang "within the cap").
    calibration_soak_caps: float = 8.0
    # A default cap moves only when the pooled MTTF's differs by over this share: each move re-reads
    # the posterior, and noise would move it every probe.
    cap_move: float = 0.1
    # A config soaked again gets at least this many times its longest soak so far: a hang that needs
    # a long unbroken run under load (seed 000 came hours into a chat) is never seen by short soaks.
    again_factor: float = 2.0
    # The cap is at least the pooled MTTF's upper bound at this confidence: the rate that counts as
    # "hangs like the failing cell" must hold the failing cell's own rate almost surely.
    cap_bound_confidence: float = 0.99
    # The default cap settles at this many times the pooled MTTF as hangs pool up: slower than that
    # is no longer "the same hang" for the search (x3 keeps an x8 modifier's slowdown outside).
    point_cap_factor: float = 3.0
    # A default cap may follow the pooled MTTF up to this many times the calibration's: two lucky
    # early calibration hangs would otherwise hold the cap far below the real MTTF.
    cap_rise: float = 4.0
    # A search probe soaks at least this many MTTFs (and at least its start-up): a shorter soak
    # buys little against the start-up every probe pays.
    min_soak_mttfs: float = 0.5
    # Until this many hangs are pooled, a search probe soaks at most `stage_mttfs` MTTFs: refuting a
    # config on a vague rate takes soaks that later positives shorten.
    stage_hangs: int = 6
    stage_mttfs: float = 5.0
    # The posterior search's prior-free necessity check asks at most this many extra soaks per flag.
    necessity_soaks: int = 3
    # The prior over sets: sets of 1..small_set flags equally likely; each flag beyond divides a
    # set's prior by 1 / large_set_factor; "the baseline itself hangs" weighs baseline_prior.
    small_set: int = 3
    large_set_factor: float = 0.1
    baseline_prior: float = 0.02

    # -- ablation, the search's first way (ablation.py) ---------------------------------------------
    # An ablation soak: at most this many MTTFs read from every probe so far (long enough that an
    # innocent flag's removal rarely passes, short enough that a culprit's costs little).
    ablation_stage_mttfs: float = 5.0
    # A flag's removal split out of a group whose removal did not hang is likelier a culprit: its
    # soak counts toward its necessity soak, so a longer one (8 MTTFs) saves a start-up.
    single_stage_mttfs: float = 8.0
    # A kept flag's absence is screened at this loose level before the rate check (an explicit cap).
    screen_level: float = 0.02
    # Ablation keeps a flag once its absence rejects "as fast" at alpha / (this x n).
    necessity_split: float = 3.0
    # Soaks of baseline + the kept flags before asking the rate check why it does not hang.
    certification_soaks: int = 2
    # Hangs of the failing cell the rule-out soaks read its rate from: two leave its predictive so
    # wide that each necessary flag needs some 85 MTTFs; eight bring that to about 38.
    reference_hangs: int = 8
    # The first round removes groups from this many flags on (with 4 or 5, two culprits put one in
    # each half too often) ...
    group_ablation_flags: int = 6
    # ... in this many groups: thirds (with two or three culprits both halves nearly always hold one).
    first_parts: int = 3
    # The rate check's probes for a kept set that does not hang (else: two triggers).
    rescue_probes: int = 12

    # -- the modifier verdicts' soaks (modifiers.py) -----------------------------------------------
    # Hangs of the failing cell and of a suspect's removal before a verdict needs no more.
    measure_hangs: int = 10
    # A removal with innocent_hangs+ hangs and a ratio under innocent_ratio looks innocent: no more
    # soaks. 2 hangs: an x8 modifier's quick hangs looked innocent 9 % of the time; 3: 2 %.
    innocent_ratio: float = 1.5
    innocent_hangs: int = 4
    # The failing cell's hangs before the first group check (6 and 12 tried), and once a group does
    # not clear (the side of every comparison that follows).
    cell_first_hangs: int = 8
    cell_hangs: int = 12
    # A suspect joins the group removal while its own removal looks at most this much slower.
    group_ratio: float = 3.0
    # The most load (failing-cell MTTFs) a group's removal gets to rule out a modifier ...
    group_mttfs: float = 20.0
    # ... unless its hangs reject "as fast as the failing cell" at this level first.
    group_slow_level: float = 0.05
    # A removal joins the failing cell's reference rate unless told apart at this level.
    reference_level: float = 0.05
    # The failing cell's top-up soaks for the modifier verdicts, in its MTTFs (most end at a hang) ...
    top_up_mttfs: float = 3.0
    # ... and for the rule-outs' reference rate, one batch at a time between the ablation's looks.
    reference_top_up_mttfs: float = 4.0
    # A group clears its flags at (1 - confidence) / this (6 tried: dearer, no better).
    group_rule_out_share: float = 3.0
    # A modifier soak: at least this many failing-cell MTTFs (4 tried: 1-2 % cheaper at 10 min, seed
    # 002 right in 0.953 instead of 0.956), and on to where a pass would decide.
    soak_mttfs: float = 2.0
    # Bisection steps of the search for where a flag's removal would be called (a hair long).
    called_steps: int = 12
    # A group that did not clear gives up the flag whose other removals look this slow.
    peel_level: float = 0.05
    # Each step of finding a group's modifier from the set's side (0.02, 0.1, 0.2 tried: within 1 %).
    locate_level: float = 0.05
    # A flag is called early at its Holm share / this: looking after every soak must not spend the
    # family's error budget on the innocent flags.
    clear_share: float = 3.0
    # A removal soaks at most to where an x rule_out_factor slower one hangs measure_hangs + this often.
    measure_spare_hangs: int = 2

    # -- verdicts (modifier_stats.py) ----------------------------------------------------------------
    # The rate ratio's interval is read on a log grid from ratio_low to ratio_high (the reported
    # interval's resolution: 80 points a decade).
    ratio_low: float = 1e-3
    ratio_high: float = 1e3
    ratio_points: int = 481
    # A "faster without it" call needs this many hangs without the flag: false calls on one quick
    # hang (46 -> 37 of 4000 runs at n=6, k=3), at the same cost.
    speedup_hangs: int = 4

    # -- the rate check under an explicit cap (ratecheck.py) --------------------------------------
    # The rate check's guard counts up to this much slower as "the set is enough".
    enough_factor: float = 2.0
    # Candidate soaks of a rate-check probe, in pooled MTTFs.
    modifier_soaks: tuple[float, ...] = (1.0, 2.0, 4.0)
    # The rate check's probes at most.
    max_modifier_probes: int = 100
    # The set alone hangs at least this often: every modifier verdict's "without" side.
    modifier_evidence_hangs: int = 3

    # -- the oracles around real probes (oracle_chunked.py, oracle_restart.py) -----------------------
    # A real probe soaks in pieces of at most this much load (unless --max-soak): a lost node costs
    # one piece, at one start-up per piece (about 1.4 % at a 10 min start-up).
    max_soak_s: float = 12 * 3600.0
    # Restarts of one probe at most: ~24 h of soak with a crash every 4 min; beyond, the probe ends.
    max_restarts: int = 400
    # Starts in a row that ended before any load (under idle_load_s of it): the config cannot run.
    max_idle_starts: int = 3
    idle_load_s: float = 1.0

    @property
    def modifier_factors(self) -> tuple[float, ...]:
        """The rate check's slowdowns a modifier may bring: x6, x12, x24, x48 at the default
        point_cap_factor (log-uniform from twice the cap's reach up: a factor nearer the cap's would
        be a coin toss on the cap's own noise)."""
        return tuple(2.0 * self.point_cap_factor * 2.0**i for i in range(4))


DEFAULT_POLICY = Policy()  # the one default instance (a frozen value, shared)
