"""The Run timeline as SVG geometry, computed on the server: no script, no chart library.

One bar per model call, stacked by zone in estimated tokens; the provider-reported input
(input + cache read + cache write) outlined over it; the cache-read share of that input as a
line on a 0-100 % axis; a dashed rule where a turn starts; a mark over each call that missed.
The template (templates/_timeline.svg) only places what this module computes.
"""

from __future__ import annotations

from dataclasses import dataclass

from psych_sidecar.domain.prompt import Zone
from psych_sidecar.domain.run_inspector import ModelCall

ZONE_NAMES = {
    Zone.STATIC_SYSTEM: "static system",
    Zone.DYNAMIC_TAIL: "dynamic tail",
    Zone.HISTORY: "history",
    Zone.TRANSIENT: "transient",
}
ZONE_COLOURS = {
    Zone.STATIC_SYSTEM: "#4e79a7",
    Zone.DYNAMIC_TAIL: "#f28e2b",
    Zone.HISTORY: "#59a14f",
    Zone.TRANSIENT: "#b07aa1",
}
LEFT, RIGHT, TOP, BOTTOM = 64, 84, 28, 40
PLOT_HEIGHT = 240
MIN_PLOT_WIDTH = 640
SLOT_WIDTH = 36


@dataclass(frozen=True, slots=True)
class Segment:
    y: float
    height: float
    colour: str
    title: str


@dataclass(frozen=True, slots=True)
class Bar:
    index: int
    x: float
    width: float
    segments: tuple[Segment, ...]
    # The provider-reported input outlined over the bar (None when no usage was recorded).
    usage_y: float | None
    usage_height: float
    missed: bool
    title: str
    label_x: float


@dataclass(frozen=True, slots=True)
class TurnRule:
    x: float
    label: str


@dataclass(frozen=True, slots=True)
class Tick:
    y: float
    label: str


@dataclass(frozen=True, slots=True)
class TimelineChart:
    width: int
    height: int
    plot_left: int
    plot_right: int
    plot_top: int
    plot_bottom: int
    bars: tuple[Bar, ...]
    turns: tuple[TurnRule, ...]
    ticks: tuple[Tick, ...]
    share_points: str  # an SVG polyline's points: the cache-read share per call with usage
    share_dots: tuple[tuple[float, float, str], ...]
    legend: tuple[tuple[str, str], ...]


def _nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5 x 10^n at or above value (at least 10)."""
    step = 10
    while True:
        for factor in (1, 2, 5):
            if factor * step >= value:
                return factor * step
        step *= 10


def _usage_input(call: ModelCall) -> int:
    if call.usage is None:
        return 0
    u = call.usage.usage
    return u.input_tokens + u.cache_read_tokens + u.cache_write_tokens


def timeline_chart(calls: tuple[ModelCall, ...]) -> TimelineChart:
    count = max(len(calls), 1)
    plot_width = max(MIN_PLOT_WIDTH, count * SLOT_WIDTH)
    width = LEFT + plot_width + RIGHT
    height = TOP + PLOT_HEIGHT + BOTTOM
    bottom = TOP + PLOT_HEIGHT
    largest = max(
        [sum(z.estimated_tokens for z in c.entry.zones) for c in calls]
        + [_usage_input(c) for c in calls]
        + [1]
    )
    scale_max = _nice_ceiling(largest)

    def y_of(tokens: float) -> float:
        return bottom - PLOT_HEIGHT * tokens / scale_max

    slot = plot_width / count
    bar_width = min(28.0, slot * 0.7)
    bars = []
    turns = []
    share: list[tuple[float, float, str]] = []
    previous_turn: int | None = None
    for position, call in enumerate(calls):
        x = LEFT + slot * position + (slot - bar_width) / 2
        centre = x + bar_width / 2
        running = 0
        segments = []
        for zone_size in call.entry.zones:
            tokens = zone_size.estimated_tokens
            top = y_of(running + tokens)
            segments.append(
                Segment(
                    top,
                    y_of(running) - top,
                    ZONE_COLOURS[zone_size.zone],
                    f"{ZONE_NAMES[zone_size.zone]}: ~{tokens:,} tokens "
                    f"({zone_size.byte_length:,} bytes)",
                )
            )
            running += tokens
        usage_total = _usage_input(call)
        usage_y = y_of(usage_total) if call.usage is not None else None
        title = (
            f"call {call.index}: turn {call.entry.turn}, step {call.entry.step}, "
            f"{call.entry.model}, ~{running:,} estimated tokens"
        )
        if call.usage is not None:
            u = call.usage.usage
            title += (
                f"; provider: {u.input_tokens:,} input, {u.cache_read_tokens:,} cache read, "
                f"{u.cache_write_tokens:,} cache write, {u.output_tokens:,} output"
            )
            if usage_total:
                ratio = u.cache_read_tokens / usage_total
                share.append((centre, TOP + PLOT_HEIGHT * (1 - ratio), f"cache read {ratio:.0%}"))
        if call.miss is not None:
            title += "; cache miss"
        bars.append(
            Bar(
                call.index,
                x,
                bar_width,
                tuple(segments),
                usage_y,
                bottom - usage_y if usage_y is not None else 0.0,
                call.miss is not None,
                title,
                centre,
            )
        )
        if call.entry.turn != previous_turn:
            turns.append(TurnRule(LEFT + slot * position, f"turn {call.entry.turn}"))
            previous_turn = call.entry.turn
    ticks = tuple(Tick(y_of(scale_max * i / 4), f"{scale_max * i // 4:,}") for i in range(5))
    return TimelineChart(
        width=width,
        height=height,
        plot_left=LEFT,
        plot_right=LEFT + plot_width,
        plot_top=TOP,
        plot_bottom=bottom,
        bars=tuple(bars),
        turns=tuple(turns),
        ticks=ticks,
        share_points=" ".join(f"{x:.1f},{y:.1f}" for x, y, _ in share),
        share_dots=tuple(share),
        legend=tuple((ZONE_NAMES[z], ZONE_COLOURS[z]) for z in Zone),
    )
