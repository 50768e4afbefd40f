"""Prompt aggregation over epochs: a weighted running sum of learnable tensors (PromptSRC's GPA).

Introduced by PromptSRC (Gaussian weights over the epochs, ``trainers/promptsrc.py``); TAC averages
its prompts over the epochs with uniform weights.
"""

__all__ = ["GaussianPromptAggregation"]


class GaussianPromptAggregation:
    """Running sum over epochs of w_e x (learnable tensors).

    Args:
        weights: w_e for epochs 1..E (PromptSRC's Gaussian ``gpa_weights``, TAC's uniform ones).

    Attributes:
        total: {name: tensor} running sum (None before the first epoch).
        epochs: 0-based indices of the epochs added so far.
    """

    def __init__(self, weights):
        self.weights = weights
        self.total = None
        self.epochs = []

    def add(self, epoch, tensors):
        """Add w_(epoch+1) x tensors ({name: tensor}) for the 0-based ``epoch``."""
        weight = float(self.weights[epoch])
        weighted = {name: weight * tensor.detach().clone() for name, tensor in tensors.items()}
        if self.total is None:
            self.total = weighted
        else:
            self.total = {name: self.total[name] + weighted[name] for name in self.total}
        self.epochs.append(epoch)

    def state_dict(self):
        return {"epochs": list(self.epochs), "total": self.total}

    def load_state_dict(self, state):
        self.epochs, self.total = list(state["epochs"]), state["total"]
