"""The OOM boundary: every cell trained for real; the estimator predicts the same map."""

from __future__ import annotations

import labkit


def test_boundary_map_is_measured_and_predicted():
    with labkit.Cluster(1, device="cpu", progress=False) as cluster:
        boundary = labkit.sweep_boundary(cluster, "gpt", sizes=(2e5, 5e5, 2e6),
                                         world_sizes=(1, 2), memory_per_device="24MiB",
                                         global_batch=16)
        assert cluster.world_size == 1  # put back as it was
    assert len(boundary.cells) == 6
    assert any(c.fits for c in boundary.cells) and not all(c.fits for c in boundary.cells)
    assert boundary.agreement == 1.0
    # More devices split the batch: the boundary never moves down.
    assert (boundary.largest_fitting(2) or 0) >= (boundary.largest_fitting(1) or 0)
    for cell in boundary.cells:
        if cell.fits:
            assert cell.peak_bytes <= boundary.capacity_bytes
    fig = labkit.plots.plot_boundary(boundary)
    assert "predicted boundary" in [t.get_text() for t in fig.legends[0].get_texts()][0]
