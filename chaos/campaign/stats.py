"""Statistics across seeds: mean, sample standard deviation and a Student-t 95% confidence interval.

Campaigns run a handful of seeds, so the normal 1.96 would understate the interval badly (with
2 seeds the t quantile is 12.7); the two-sided 97.5% quantiles below are the textbook table.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

# Two-sided 95% (0.975 one-sided) Student-t quantiles by degrees of freedom.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101,
         19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052,
         28: 2.048, 29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t_quantile_975(dof: int) -> float:
    """The 0.975 quantile of Student's t; between table rows the next smaller dof (wider, safe)."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {dof}")
    if dof in _T975:
        return _T975[dof]
    if dof > 120:
        return 1.960
    return _T975[max(k for k in _T975 if k < dof)]


@dataclass(frozen=True)
class Summary:
    """One metric over seeds; std and the interval are None with fewer than two values."""

    n: int
    mean: float | None
    std: float | None
    ci95_low: float | None
    ci95_high: float | None
    values: tuple[float, ...]

    @property
    def half_width(self) -> float | None:
        return None if self.ci95_high is None or self.mean is None else self.ci95_high - self.mean

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["values"] = list(self.values)
        return data


def summarize(values: list[float | None]) -> Summary:
    """Mean, sample std (n - 1) and mean ± t(0.975, n - 1)·std/√n; missing values (None) are left out."""
    present = tuple(float(v) for v in values if v is not None)
    n = len(present)
    if n == 0:
        return Summary(0, None, None, None, None, ())
    mean = sum(present) / n
    if n == 1:
        return Summary(1, mean, None, None, None, present)
    std = math.sqrt(sum((v - mean) ** 2 for v in present) / (n - 1))
    half = t_quantile_975(n - 1) * std / math.sqrt(n)
    return Summary(n, mean, std, mean - half, mean + half, present)
