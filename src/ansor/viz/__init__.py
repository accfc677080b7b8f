"""Why a kernel is fast (or not): its tiles against the caches, and its place on the roofline.

`visualize(kernel | record | (task, state))` (`viz.view`) reads the program's loop IR as it runs
on its target (`viz.nest`): the tile levels of its heaviest statement, the bytes each tile
touches, which caches they fit in and how many bytes move between the levels. Against this
machine's measured FMA peak and memory bandwidth (`viz.machine`, measured once, checked and
cached) it places the kernel on the roofline (`viz.roofline`): the bound that applies (compute
or memory) and the share of it the measured program reaches. The result prints as text
(`viz.explain`) and draws as a picture (`viz.draw`). This module only gathers the names.
"""

from __future__ import annotations

from ansor.viz.explain import explain
from ansor.viz.machine import CacheLevel, MachinePeaks, check_peaks, machine_peaks, measure_peaks
from ansor.viz.nest import LoopInfo, NestAnalysis, TileLevel, analyze_nest
from ansor.viz.roofline import Roofline
from ansor.viz.units import format_bytes, format_flop
from ansor.viz.view import KernelView, visualize

__all__ = ["KernelView", "Roofline", "visualize", "explain", "MachinePeaks", "machine_peaks", "measure_peaks",
           "check_peaks", "CacheLevel", "NestAnalysis", "TileLevel", "LoopInfo", "analyze_nest", "format_bytes",
           "format_flop"]
