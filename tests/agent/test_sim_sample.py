"""The shipped sample for the simulated backend (examples/sim/cards.yaml) loads as it is."""

from __future__ import annotations

from pathlib import Path

from elasticgpu.agent import discovery

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sim" / "cards.yaml"


def test_the_shipped_sample_loads(tmp_path: Path) -> None:
    backend = discovery.open_backend("simulated", node_name="node-a", simulation_file=SAMPLE,
                                     device_dir=tmp_path / "dev", inject_dir=tmp_path / "inject")
    cards = backend.snapshot().cards
    assert [(c.model, c.memory_mib, c.numa) for c in cards] == [
        ("NVIDIA A100-SXM4-80GB", 81920, 0), ("NVIDIA A100-SXM4-80GB", 81920, 0), ("NVIDIA T4", 15360, 1)]
    assert cards[0].links == (cards[1].uuid,)


def test_the_samples_commented_timeline_is_valid(tmp_path: Path) -> None:
    text = SAMPLE.read_text()
    assert "# timeline:" in text
    uncommented = tmp_path / "with-timeline.yaml"
    uncommented.write_text(text.replace("# timeline:", "timeline:").replace("#   - {", "  - {"))
    backend = discovery.open_backend("simulated", node_name="node-a", simulation_file=uncommented,
                                     device_dir=tmp_path / "dev", inject_dir=tmp_path / "inject")
    assert len(backend.snapshot().cards) == 3
