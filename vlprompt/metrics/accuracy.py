"""Top-k classification accuracy (Dassl ``compute_accuracy``)."""

__all__ = ["compute_accuracy"]


def compute_accuracy(output, target, topk=(1,)):
    """Top-k accuracy in percent.

    Args:
        output (Tensor or tuple/list): logits [N, C]; for a tuple/list the first element is used.
        target (Tensor): labels [N].
        topk (tuple of int): the k values.

    Returns:
        list of 1-element float tensors, one per k: 100 * (#samples whose label is among
        the k highest logits) / N.
    """
    if isinstance(output, (tuple, list)):
        output = output[0]
    batch_size = target.size(0)
    _, pred = output.topk(max(topk), dim=1, largest=True, sorted=True)  # [N, maxk]
    correct = pred.eq(target.view(-1, 1))  # [N, maxk]
    return [
        correct[:, :k].sum().float().reshape(1).mul_(100.0 / batch_size)
        for k in topk
    ]
