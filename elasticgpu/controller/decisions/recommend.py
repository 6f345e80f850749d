"""Recommendations from measured use (issue 17): the size a Bound share claim should request,
from the agent's `status.usage` samples over a window. Pure: samples in, a recommendation out.

# The rule (docs/recommendations.md)

- peak      the largest cores and the largest memory seen in the window (each on its own);
            p95 is reported beside it, for people.
- rec       peak x (1 + margin), rounded UP (cores to 5 %, memory to 256 MiB), then clamped to
            the class's minSize..maxSize and to one card (1..100 %, the card's memory).
- band      [rec, upper] with upper = rec x (1 + margin) rounded up the same way.
- state     UnderSized when the request is below rec in cores or memory; else OverSized when it
            is above upper in cores or memory; else RightSized.
- Auto      resizes an Under- or OverSized claim to rec: the request then lies in the band, so
            the next samples move it again only when the use leaves the band (the hysteresis),
            and never sooner than the settings' minimum interval after the last Auto resize.
            It never resizes below the measured peak (rounded up) nor above maxSize: when the
            peak is above maxSize the claim is left as it is. A shrink waits until the window
            has watched the claim for `shrink_after_s` (a controller that just restarted has an
            empty window and must not shrink from a few minutes of quiet).

A sample holds until the next one (the agent writes `status.usage` only when the use changes), so
a steady claim keeps its last sample. The window is kept in the controller's memory per claim uid
(`UsageWindow`); it restarts empty
after a controller restart. That is acceptable because the recommendation needs `min_samples`
new samples before it is written again (the old one stays in the claim's status meanwhile), and
Auto's shrink waits for a full `shrink_after_s` of fresh observation: a restart delays a
recommendation, it never makes a smaller one from too little data.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from elasticgpu.api import names

CORES_STEP = 5
"""Percent: recommendations are multiples of 5 % of a card's compute."""
MEMORY_STEP = 256
"""MiB: recommendations are multiples of 256 MiB."""

RIGHT_SIZED = "RightSized"
REASON_OVER_SIZED = "OverSized"
"""State, and Event reason when a claim turns over-sized (Normal)."""
REASON_UNDER_SIZED = "UnderSized"
"""State, and Event reason when a claim turns under-sized (Warning)."""
OVER_SIZED = REASON_OVER_SIZED
UNDER_SIZED = REASON_UNDER_SIZED
REASON_AUTO_RESIZED = "AutoResized"
"""Event reason when `resizePolicy: Auto` changed a claim's requests."""


@dataclass(frozen=True)
class Sample:
    """One measurement of the agent: at `at` (seconds, the controller's monotonic clock)."""

    at: float
    cores: int
    memory: int


@dataclass
class UsageWindow:
    """The samples of one claim over the last `window_s` seconds, in arrival order. A sample
    that repeats the previous one's `key` (the agent's updateTime) is the same measurement seen
    again (a resync, another field of the status changed) and is not counted twice."""

    window_s: float
    samples: deque[Sample] = field(default_factory=deque)
    last_key: str | None = None
    first_at: float | None = None
    """When this window first saw the claim (not trimmed): how long it has been watched."""

    def add(self, sample: Sample, *, key: str | None) -> bool:
        """Add a sample unless it repeats the last one's key; trims what fell out of the window.
        True when it was added."""
        if key is not None and key == self.last_key:
            return False
        self.last_key = key
        if self.first_at is None:
            self.first_at = sample.at
        self.samples.append(sample)
        self.trim(sample.at)
        return True

    def trim(self, now: float) -> None:
        """Drop the samples no longer in effect during the window. A sample holds until the next
        one: the agent writes only when the use changes, so a steady claim's last sample is its
        use now, however old, and is never dropped."""
        while len(self.samples) > 1 and self.samples[1].at <= now - self.window_s:
            self.samples.popleft()

    def watched_s(self, now: float) -> float:
        """Seconds since the window first saw the claim (0 when it saw nothing)."""
        return 0.0 if self.first_at is None else now - self.first_at


@dataclass(frozen=True)
class Bounds:
    """What the class says: margin (percent) and the Auto bounds, already limited to one card."""

    margin: int
    min_cores: int
    max_cores: int
    min_memory: int
    max_memory: int


def bounds(*, margin: int, card_memory: int, min_cores: int | None = None, max_cores: int | None = None,
           min_memory: int | None = None, max_memory: int | None = None) -> Bounds:
    """The bounds of a class on a card of `card_memory` MiB: unset minima are one step, unset
    maxima the whole card; nothing beyond the card."""
    top_cores, top_memory = names.CORES_PER_CARD, max(1, card_memory)
    high_cores = min(top_cores, max_cores or top_cores)
    high_memory = min(top_memory, max_memory or top_memory)
    return Bounds(margin=max(0, margin),
                  min_cores=min(high_cores, max(1, min_cores or CORES_STEP)), max_cores=high_cores,
                  min_memory=min(high_memory, max(1, min_memory or MEMORY_STEP)), max_memory=high_memory)


@dataclass(frozen=True)
class Recommendation:
    """What the window says about a claim requesting (`cores`, `memory`)."""

    cores: int
    memory: int
    state: str
    peak_cores: int
    peak_memory: int
    message: str


def _grown(value: int, margin: int, step: int) -> int:
    # value x (1 + margin/100) rounded up to the step, in integers (no float rounding at the edges).
    return -(-(value * (100 + margin)) // (100 * step)) * step


def percentile(values: list[int], fraction: float) -> int:
    """The nearest-rank percentile (`fraction` 0..1) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def recommend(samples: list[Sample], *, bounds: Bounds, requested_cores: int, requested_memory: int,
              min_samples: int = 3) -> Recommendation | None:
    """The recommendation for a claim requesting (`requested_cores` %, `requested_memory` MiB)
    from `samples`, or None with fewer than `min_samples` (too little to say anything)."""
    if len(samples) < max(1, min_samples):
        return None
    peak_cores = max(s.cores for s in samples)
    peak_memory = max(s.memory for s in samples)
    cores = min(bounds.max_cores, max(bounds.min_cores, _grown(peak_cores, bounds.margin, CORES_STEP)))
    memory = min(bounds.max_memory, max(bounds.min_memory, _grown(peak_memory, bounds.margin, MEMORY_STEP)))
    upper_cores = max(cores, _grown(cores, bounds.margin, CORES_STEP))
    upper_memory = max(memory, _grown(memory, bounds.margin, MEMORY_STEP))
    if requested_cores < cores or requested_memory < memory:
        state = UNDER_SIZED
    elif requested_cores > upper_cores or requested_memory > upper_memory:
        state = OVER_SIZED
    else:
        state = RIGHT_SIZED
    p95_cores = percentile([s.cores for s in samples], 0.95)
    p95_memory = percentile([s.memory for s in samples], 0.95)
    message = (f"peak {peak_cores}% cores, {peak_memory} MiB (p95 {p95_cores}%, {p95_memory} MiB) over"
               f" {len(samples)} samples; +{bounds.margin}% margin recommends {cores}% cores, {memory} MiB;"
               f" right-sized up to {upper_cores}% cores, {upper_memory} MiB; requested {requested_cores}% cores,"
               f" {requested_memory} MiB")
    return Recommendation(cores=cores, memory=memory, state=state, peak_cores=peak_cores,
                          peak_memory=peak_memory, message=message)


def auto_target(rec: Recommendation, *, bounds: Bounds, requested_cores: int, requested_memory: int,
                watched_s: float, since_last_auto_s: float | None, min_interval_s: float,
                shrink_after_s: float) -> tuple[int, int] | None:
    """The (cores, memory) `resizePolicy: Auto` sets the claim's requests to, or None to leave
    them: right-sized, too soon after the last Auto resize, a shrink from too short a watch, or
    a target that would be below the measured peak (maxSize is below it)."""
    if rec.state == RIGHT_SIZED:
        return None
    if since_last_auto_s is not None and since_last_auto_s < min_interval_s:
        return None
    cores, memory = rec.cores, rec.memory
    if cores < rec.peak_cores or memory < rec.peak_memory or cores > bounds.max_cores or memory > bounds.max_memory:
        return None  # the bounds leave no size that holds the peak
    if (cores < requested_cores or memory < requested_memory) and watched_s < shrink_after_s:
        # Too short a watch to give anything back: only the growing dimension moves.
        cores, memory = max(cores, requested_cores), max(memory, requested_memory)
    if (cores, memory) == (requested_cores, requested_memory):
        return None
    return cores, memory
