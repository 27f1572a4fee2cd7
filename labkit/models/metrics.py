"""Quality metrics of a trained model, computed from its scores (no sklearn needed)."""

from __future__ import annotations

import torch


def auc(scores, labels) -> float:
    """Area under the ROC curve: the chance that a random positive scores above a random
    negative (ties count one half). Rank-based (Mann-Whitney U):

        AUC = (sum of the positives' ranks - P (P + 1) / 2) / (P N)

    with tied scores given their average rank. 0.5 is guessing, 1.0 a perfect ranking.
    Returns NaN when ``labels`` hold only one class.
    """
    scores = torch.as_tensor(scores, dtype=torch.float64).flatten()
    labels = torch.as_tensor(labels).flatten().bool()
    positives = int(labels.sum())
    negatives = labels.numel() - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    _, inverse, counts = torch.unique(scores, return_inverse=True, return_counts=True)
    last = counts.cumsum(0).double()  # 1-based rank of the last score of each tie group
    average_rank = last - (counts.double() - 1) / 2
    rank_sum = average_rank[inverse][labels].sum().item()
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)
