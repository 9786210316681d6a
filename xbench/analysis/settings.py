"""The analysis settings and their command-line options, shared by ``xbench.analyze`` and
``xbench.report``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from xbench.metrics.bootstrap import CONFIDENCE, REPLICATES, SEED

#: Lesion area as a fraction of the image: < 1 %, 1-10 %, >= 10 % (docs/analyses.md, "Lesion-size strata").
DEFAULT_SIZE_BINS = (0.01, 0.1)
#: The views of a phrase dataset's queries in ``queries.csv.gz``.
QUERY_VIEWS = ("query", "finding_name")


@dataclass(frozen=True)
class Settings:
    """replicates: bootstrap replicates; seed: of every random stream; confidence: interval level;
    folds: K of the cross-fitted threshold; size_bins: ascending area-fraction boundaries;
    queries: analyse a phrase dataset's (image, query) pairs of this view (``query``: as each model
    grounds a phrase; ``finding_name``: by the finding's name) in place of its (image, class) pairs."""

    replicates: int = REPLICATES
    seed: int = SEED
    confidence: float = CONFIDENCE
    folds: int = 5
    size_bins: tuple[float, ...] = field(default=DEFAULT_SIZE_BINS)
    queries: str | None = None

    def __post_init__(self) -> None:
        if self.replicates < 1:
            raise ValueError(f"--replicates must be at least 1; got {self.replicates}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"--confidence must lie in (0, 1), e.g. 0.95; got {self.confidence}")
        if self.folds < 2:
            raise ValueError(f"--folds must be at least 2; got {self.folds}")
        bins = tuple(float(b) for b in self.size_bins)
        if not all(0 < b < 1 for b in bins) or list(bins) != sorted(set(bins)):
            raise ValueError(f"--size-bins must be strictly increasing fractions of the image in (0, 1), e.g. 0.01 0.1; got "
                             f"{list(self.size_bins)}")
        object.__setattr__(self, "size_bins", bins)
        if self.queries not in (None, *QUERY_VIEWS):
            raise ValueError(f"--queries must be one of {', '.join(QUERY_VIEWS)}; got {self.queries!r}")


def add_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--validation``, ``--replicates``, ``--seed``, ``--confidence``, ``--folds``, ``--size-bins``."""
    defaults = Settings()
    parser.add_argument("--validation", nargs="+", default=[], metavar="VAL_DIR",
                        help="results folders of the same models on the dataset's validation split: each sets "
                             "its model's calibrated τ. Without them τ is cross-fitted over the test images.")
    parser.add_argument("--replicates", type=int, default=defaults.replicates, help="bootstrap replicates")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of resampling and folds")
    parser.add_argument("--confidence", type=float, default=defaults.confidence, help="interval level")
    parser.add_argument("--folds", type=int, default=defaults.folds, help="K of the cross-fitted τ")
    parser.add_argument("--size-bins", type=float, nargs="*", default=list(DEFAULT_SIZE_BINS), metavar="FRACTION",
                        help="lesion-area boundaries as fractions of the image (default: 0.01 0.1)")


def from_arguments(options: argparse.Namespace) -> Settings:
    """The [`Settings`][xbench.analysis.settings.Settings] the options of `add_arguments` name."""
    return Settings(replicates=options.replicates, seed=options.seed, confidence=options.confidence,
                    folds=options.folds, size_bins=tuple(options.size_bins))
