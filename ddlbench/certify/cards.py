"""What a GPU can do, beside what it did: the shipped table of cards (cards.yaml) and the shares a certificate
gives a measured figure of the card's datasheet peak and of its published achievable.

For a figure `machine/matmul_flop_per_s/<precision>` (FLOP/s) or `machine/memory_bandwidth_bytes_per_s`
(B/s) of a machine whose device name matches a card, the same of the node levels (`quick/…`, `burn-in/…`,
with or without their `/cuda:<i>` ending), and a node level's pinned host↔device copy
(`…/host_to_device_bytes_per_s`, `…/device_to_host_bytes_per_s`: B/s in one direction, against `host_link`,
the card's host interface in one direction), and a collective's NCCL bus bandwidth within one node
(`machine/<op>/nccl/1x<ranks>/busbw_bytes_per_s`, against `nvlink_busbw`: NVLink's line rate per direction,
and what NCCL reaches on it):

- share_of_peak = value ÷ peak (dense datasheet figure, same precision);
- share_of_achievable = value ÷ achievable (a published measured maximum), where one is cited.

Every table entry carries its sources; a card without a cited achievable has only the peak share. A CPU
machine, or a GPU no entry matches, gets no share: the certificate says which card was looked for.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ddlbench.errors import ConfigError

CARDS_FILE = Path(__file__).with_name("cards.yaml")
FIGURES = ("fp32", "tf32", "bf16", "fp16", "fp8", "memory_bandwidth", "host_link", "nvlink_busbw")
# the figures set against a card: the standard suite's machine/ figures, and the node levels' quick/ and
# burn-in/ ones, which end in their GPU (`…/cuda:1`)
_FAMILIES = r"(?:machine|quick|burn-in)"
_DEVICE = r"(?:/cuda:\d+)?"
_MATMUL = re.compile(rf"{_FAMILIES}/matmul_flop_per_s/(?P<precision>[a-z0-9]+){_DEVICE}")
_BANDWIDTH = re.compile(rf"{_FAMILIES}/memory_bandwidth_bytes_per_s{_DEVICE}")
_HOST_LINK = re.compile(rf"(?:quick|burn-in)/(?:host_to_device|device_to_host)_bytes_per_s{_DEVICE}")
# a collective's bus bandwidth through NCCL within one node (layout 1 × ranks): what NVLink carries
_NVLINK = re.compile(r"machine/(?:all_reduce|all_gather|reduce_scatter|broadcast)/nccl/1x\d+/busbw_bytes_per_s")


@dataclass(frozen=True, kw_only=True)
class Card:
    key: str
    name: str
    match: tuple[str, ...]
    peak: Mapping[str, float]
    peak_source: str
    achievable: Mapping[str, float]
    achievable_source: str


def parse_cards(data: Mapping[str, Any], *, source: str) -> tuple[Card, ...]:
    """The cards of a table, each entry checked: a name, match strings, peaks among FIGURES (positive, in
    FLOP/s or B/s), a source for the peaks and one for the achievable figures, achievable ≤ peak."""
    cards = []
    for key, entry in (data.get("cards") or {}).items():
        where = f"{source}: cards.{key}"
        if not isinstance(entry, Mapping):
            raise ConfigError(where, "expected a mapping")
        for field in ("name", "match", "peak", "peak_source", "achievable_source"):
            if not entry.get(field) and field != "achievable":
                raise ConfigError(f"{where}.{field}", "required")
        peak = {str(k): float(v) for k, v in entry["peak"].items()}
        achievable = {str(k): float(v) for k, v in (entry.get("achievable") or {}).items()}
        for name, value in (peak | achievable).items():
            if name not in FIGURES:
                raise ConfigError(f"{where}: {name}", f"unknown figure; accepted: {', '.join(FIGURES)}")
            if not value > 0:
                raise ConfigError(f"{where}: {name}", f"must be positive, got {value}")
        for name, value in achievable.items():
            if name not in peak or value > peak[name]:
                raise ConfigError(f"{where}.achievable.{name}", f"{value:g} is above the peak {peak.get(name)}")
        cards.append(
            Card(
                key=str(key),
                name=str(entry["name"]),
                match=tuple(str(m) for m in entry["match"]),
                peak=peak,
                peak_source=str(entry["peak_source"]),
                achievable=achievable,
                achievable_source=str(entry["achievable_source"]),
            )
        )
    return tuple(cards)


@functools.cache
def shipped_cards() -> tuple[Card, ...]:
    return parse_cards(yaml.safe_load(CARDS_FILE.read_text()), source=CARDS_FILE.name)


def find_card(device_name: str | None, cards: tuple[Card, ...] | None = None) -> Card | None:
    """The first card (file order) one of whose match strings the device name contains, ignoring case."""
    if not device_name:
        return None
    name = device_name.lower()
    for card in shipped_cards() if cards is None else cards:
        if any(pattern.lower() in name for pattern in card.match):
            return card
    return None


def figure_key(name: str) -> str | None:
    """The card figure a certificate figure is set against, or None."""
    if match := _MATMUL.fullmatch(name):
        return match["precision"]
    if _BANDWIDTH.fullmatch(name):
        return "memory_bandwidth"
    if _NVLINK.fullmatch(name):
        return "nvlink_busbw"
    return "host_link" if _HOST_LINK.fullmatch(name) else None


def card_shares(name: str, value: float | None, card: Card | None) -> dict[str, Any] | None:
    """A figure's shares of the card's peak and achievable (module docstring), or None where none applies."""
    key = figure_key(name)
    if card is None or key is None or value is None or key not in card.peak:
        return None
    achievable = card.achievable.get(key)
    return {
        "card": card.name,
        "peak": card.peak[key],
        "share_of_peak": value / card.peak[key],
        "peak_source": card.peak_source,
        "achievable": achievable,
        "share_of_achievable": value / achievable if achievable else None,
        "achievable_source": card.achievable_source,
    }
