"""The paper's baselines score as the authors' simulator does (table of node states)."""

from __future__ import annotations

import pytest

from elasticgpu.allocator.policies import BestFit, Packing
from elasticgpu.allocator.shapes import CardSig, NodeSig, Shape

MEMORY = 32768


def node(*frees: int, cpu: int = 64000, gpus: int | None = None) -> NodeSig:
    cards = tuple(sorted(CardSig(f, MEMORY * f // 100, MEMORY, f == 100, "G2") for f in frees))
    return NodeSig(cpu, 96000, cards, gpus if gpus is not None else len(frees), 1 << 40)


SHARE_30 = Shape(0, 30, None, 4000, ())
ONE_CARD = Shape(1, 100, None, 4000, ())


@pytest.mark.parametrize(
    ("sig", "shape", "paper_score"),
    [
        # A card in use that fits: 100 - (its free %) // 10, at least 50.
        (node(40, 100), SHARE_30, 96),
        (node(95, 100), SHARE_30, 91),
        # Only free cards fit on a node in use: 50 - free cards taken, at least 33.
        (node(10, 100), SHARE_30, 49),
        (node(10, 100, 100), Shape(2, 100, None, 0, ()), 48),
        # Every card free: max(33 - cards, cards).
        (node(100, 100), SHARE_30, 31),
        (node(*[100] * 8), ONE_CARD, 25),
        # A card taken whole elsewhere on the node makes it "in use".
        (node(100, 100, gpus=3), ONE_CARD, 49),
    ],
)
def test_packing_scores_as_the_simulator(sig: NodeSig, shape: Shape, paper_score: int) -> None:
    score, _ = Packing().best(sig, shape)
    assert score == -paper_score


def test_packing_puts_a_share_on_the_fullest_card_that_fits() -> None:
    _, taken = Packing().best(node(20, 40, 100), SHARE_30)
    assert [c.free_cores for c in taken] == [40]


def test_bestfit_scores_cpu_and_gpu_left_against_the_largest_node() -> None:
    # 1 - ((64 - 4) / 128 + (200 - 30) / 800) / 2 = 0.659... -> 65
    score, taken = BestFit().best(node(100, 100), SHARE_30)
    assert score == -65
    assert [c.free_cores for c in taken] == [100]
