"""A kernel against the roofline of the machine it runs on.

The roofline is min(peak, intensity x bandwidth): what the machine allows a kernel that does
`flop` operations per `bytes` moved from where its data lives. The measured throughput over
that bound is the share of the machine the kernel uses; a share above one means the bound
itself is wrong (peaks measured while the machine was busy, or a roof that does not apply to
where the data stayed), never that the kernel beat it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Roofline:
    """A kernel against the roofline: min(peak, intensity x bandwidth) is what its memory
    traffic allows; the measured throughput says how much of that it reaches."""

    flop: float                    # floating-point operations of one call
    bytes: float                   # estimated bytes moved from memory in one call
    peak_gflops: float | None      # this machine's FMA peak for the kernel's element type
    bandwidth_gbs: float | None    # the bandwidth of where its data lives between calls
    gflops: float | None = None    # the kernel's measured throughput
    data_in: str = "memory"        # where that is: "memory", or a cache its working set fits

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved from memory."""
        return self.flop / self.bytes if self.bytes > 0 else math.inf

    @property
    def ridge(self) -> float | None:
        """The intensity where the memory roof meets the compute roof."""
        if not self.peak_gflops or not self.bandwidth_gbs:
            return None
        return self.peak_gflops / self.bandwidth_gbs

    @property
    def bound_gflops(self) -> float | None:
        """min(peak, intensity x bandwidth): the most the machine allows at this intensity."""
        if self.peak_gflops is None or self.bandwidth_gbs is None:
            return None
        return min(self.peak_gflops, self.intensity * self.bandwidth_gbs)

    @property
    def bound(self) -> str | None:
        """Which roof applies: "compute" or "memory"."""
        if self.bound_gflops is None:
            return None
        return "compute" if self.peak_gflops <= self.intensity * self.bandwidth_gbs else "memory"

    @property
    def fraction(self) -> float | None:
        """The measured throughput over the bound that applies."""
        if self.gflops is None or not self.bound_gflops:
            return None
        return self.gflops / self.bound_gflops

    @property
    def suspect(self) -> bool:
        """Whether the kernel measured above its bound: then the bound, not the kernel, is wrong
        (a roof measured low), and a share of it means nothing."""
        return self.fraction is not None and self.fraction > 1.0

    def share_text(self) -> str:
        """The kernel's share of its bound in words; above 100% it says the bound is suspect."""
        if self.fraction is None:
            return "not measured"
        if self.suspect:
            return (f"{self.fraction:.1%} of its bound, which no kernel reaches: the bound is suspect "
                    f"(a roof measured too low, or the data stayed in a faster cache than assumed)")
        return f"{self.fraction:.1%} of its bound"
