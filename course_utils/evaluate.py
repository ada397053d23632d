"""How good is a frozen representation? Feature extraction, a linear probe and a kNN classifier.

Self-supervised lessons never train on labels; they judge an encoder by what a cheap classifier
can read off its frozen features:

- linear probe: multinomial logistic regression on standardised features (SimCLR, MoCo, MAE
  all report it);
- weighted kNN: cosine similarity to the k nearest training features, votes weighted by
  exp(similarity / T) (InstDisc, Wu et al. 2018; used as a monitor in MoCo).

Both are deterministic and fast on CPU (10k × 256 features: about a second).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from . import checks

__all__ = ["extract_features", "linear_probe", "knn_accuracy", "knn_probe", "probe_encoder"]


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _check_features_and_labels(feats, labels, what: str) -> None:
    checks.tensor(feats, f"{what} features", shape_hint="N×D")
    checks.tensor(labels, f"{what} labels", shape_hint="N")
    if feats.dim() != 2:
        raise ValueError(
            f"{what}: features must be N×D, got shape {tuple(feats.shape)}; "
            "use extract_features(encoder, images) or flatten with .flatten(1)"
        )
    if labels.dim() != 1:
        raise ValueError(f"{what}: labels must be a 1-D tensor of N class ids, got {tuple(labels.shape)}")
    if feats.shape[0] != labels.shape[0]:
        raise ValueError(
            f"{what}: {feats.shape[0]} feature rows but {labels.shape[0]} labels; "
            "pass one label per feature row"
        )
    if feats.shape[0] == 0:
        raise ValueError(f"{what}: got zero samples")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.is_complex():
        raise TypeError(f"{what}: labels must be an integer tensor (int64 class ids), got {labels.dtype}")
    if labels.min() < 0:
        raise ValueError(f"{what}: labels must be class ids >= 0, got min {int(labels.min())}")
    if not torch.isfinite(feats).all():
        raise ValueError(f"{what}: features contain NaN or inf (did training diverge?)")


def _check_pair(train_feats, train_labels, test_feats, test_labels) -> int:
    """Validate both splits; return the number of classes."""
    _check_features_and_labels(train_feats, train_labels, "train")
    _check_features_and_labels(test_feats, test_labels, "test")
    if train_feats.shape[1] != test_feats.shape[1]:
        raise ValueError(
            f"train features have dimension {train_feats.shape[1]} but test features "
            f"{test_feats.shape[1]}; extract both with the same encoder"
        )
    return int(max(train_labels.max(), test_labels.max())) + 1


def _images_and_labels(ds, what: str):
    """Accept an ImageDataset-like object (.images, .labels) or a tuple (images, labels)."""
    if hasattr(ds, "images") and hasattr(ds, "labels"):
        return ds.images, ds.labels
    if isinstance(ds, (tuple, list)) and len(ds) == 2:
        return ds[0], ds[1]
    raise TypeError(
        f"{what} must have .images and .labels (as load_dataset returns) or be a tuple "
        f"(images, labels), got {type(ds).__name__}"
    )


# --------------------------------------------------------------------------------------------
# Features
# --------------------------------------------------------------------------------------------


@contextmanager
def eval_mode(module: nn.Module):
    """Eval mode for the block; every submodule's own train/eval flag is restored after."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield module
    finally:
        for m, was_training in modes:
            m.training = was_training


def _module_device(module: nn.Module) -> torch.device:
    for tensor in list(module.parameters()) + list(module.buffers()):
        return tensor.device
    return torch.device("cpu")


def extract_features(encoder: nn.Module, images: torch.Tensor, *, batch_size: int = 256) -> torch.Tensor:
    """encoder(images) in eval mode without gradients: N×C×H×W -> N×D float32 on the CPU.

    `images` may also be a dataset with an `.images` tensor (load_dataset's ImageDataset).
    Batches are moved to the encoder's device. Every submodule's train/eval flag is put back
    afterwards (so calling this mid-training does not leave BatchNorm in eval mode).
    """
    if not isinstance(images, torch.Tensor) and isinstance(getattr(images, "images", None), torch.Tensor):
        images = images.images
    checks.instance(encoder, "encoder", nn.Module, what="an nn.Module")
    if not isinstance(images, torch.Tensor) or images.dim() < 2:
        raise ValueError(
            "extract_features expects an image tensor N×C×H×W (e.g. dataset.images), got "
            f"{tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__}"
        )
    checks.positive_int(batch_size, "batch_size")
    if images.shape[0] == 0:
        raise ValueError("extract_features got zero images")

    device = _module_device(encoder)
    chunks = []
    with eval_mode(encoder), torch.no_grad():
        for start in range(0, images.shape[0], batch_size):
            batch = images[start : start + batch_size].to(device, non_blocking=True)
            feats = encoder(batch)
            if feats.dim() != 2:
                feats = feats.flatten(1)  # e.g. a model that returns B×D×1×1
            chunks.append(feats.float().cpu())
    return torch.cat(chunks)  # N×D


# --------------------------------------------------------------------------------------------
# Linear probe
# --------------------------------------------------------------------------------------------


def linear_probe(
    train_feats: torch.Tensor,
    train_labels: torch.Tensor,
    test_feats: torch.Tensor,
    test_labels: torch.Tensor,
    *,
    epochs: int = 100,
    lr: float = 1.0,
    weight_decay: float = 1e-4,
    seed: int = 0,
) -> float:
    """Test accuracy in [0, 1] of a multinomial logistic regression on frozen features.

    Features are standardised with the *train* mean and std (test data never informs the
    probe). Then W (D×K), b (K) minimise, full batch,

        mean_i CE(softmax(x_i W + b), y_i) + weight_decay/2 · ||W||²

    with L-BFGS (strong-Wolfe line search), at most `epochs` iterations, starting from small
    random weights drawn from a generator seeded with `seed`. The problem is convex, so the
    result hardly depends on the seed; it is fully deterministic for a given seed.
    Runs on the device the features are on.
    """
    num_classes = _check_pair(train_feats, train_labels, test_feats, test_labels)
    checks.positive_int(epochs, "epochs", hint="the number of L-BFGS iterations")
    checks.positive_float(lr, "lr")
    checks.float_in_range(weight_decay, "weight_decay")

    device = train_feats.device
    x_train = train_feats.detach().float()
    mean = x_train.mean(dim=0, keepdim=True)
    std = x_train.std(dim=0, keepdim=True, unbiased=False).clamp_min(1e-6)  # constant dims stay 0
    x_train = (x_train - mean) / std  # N×D
    x_test = (test_feats.detach().to(device).float() - mean) / std
    y_train = train_labels.to(device)

    generator = torch.Generator().manual_seed(seed)
    dim = x_train.shape[1]
    weight = (0.01 * torch.randn(dim, num_classes, generator=generator)).to(device).requires_grad_()
    bias = torch.zeros(num_classes, device=device, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [weight, bias], lr=lr, max_iter=epochs, history_size=20, line_search_fn="strong_wolfe",
        tolerance_grad=1e-6, tolerance_change=1e-9,
    )

    def closure():
        optimizer.zero_grad()
        loss = F.cross_entropy(x_train @ weight + bias, y_train)
        loss = loss + 0.5 * weight_decay * weight.pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():  # callers may sit inside no_grad
        optimizer.step(closure)
    with torch.no_grad():
        predictions = (x_test @ weight + bias).argmax(dim=1)
    return (predictions.cpu() == test_labels.cpu()).float().mean().item()


# --------------------------------------------------------------------------------------------
# Weighted kNN
# --------------------------------------------------------------------------------------------


def knn_accuracy(
    train_feats: torch.Tensor,
    train_labels: torch.Tensor,
    test_feats: torch.Tensor,
    test_labels: torch.Tensor,
    *,
    k: int = 20,
    temperature: float = 0.1,
    chunk_size: int = 1024,
) -> float:
    """Accuracy in [0, 1] of the cosine-similarity weighted kNN classifier (InstDisc / MoCo).

    For each test feature q (L2-normalised, as are the train features f_j): take the k train
    features with the largest s_j = q·f_j, give class c the score Σ_{j in top-k, y_j = c}
    exp(s_j / T), and predict the class with the highest score. Test rows are processed in
    chunks of `chunk_size`, so memory is chunk_size × N_train similarities at a time.
    """
    num_classes = _check_pair(train_feats, train_labels, test_feats, test_labels)
    n_train = train_feats.shape[0]
    checks.positive_int(k, "k")
    if k > n_train:
        raise ValueError(f"k must be an int in [1, {n_train}] (the number of train samples), got {k}")
    checks.positive_float(temperature, "temperature")
    checks.positive_int(chunk_size, "chunk_size")

    device = train_feats.device
    bank = F.normalize(train_feats.detach().float(), dim=1)  # N_train×D
    bank_labels = train_labels.to(device)
    correct = 0
    with torch.no_grad():
        for start in range(0, test_feats.shape[0], chunk_size):
            query = F.normalize(test_feats[start : start + chunk_size].to(device).float(), dim=1)
            sims, idx = (query @ bank.T).topk(k, dim=1)  # b×k each
            weights = (sims / temperature).exp()  # b×k
            votes = torch.zeros(query.shape[0], num_classes, device=device)
            votes.scatter_add_(1, bank_labels[idx], weights)  # b×K
            predictions = votes.argmax(dim=1).cpu()
            correct += (predictions == test_labels[start : start + chunk_size].cpu()).sum().item()
    return correct / test_feats.shape[0]


# --------------------------------------------------------------------------------------------
# Both at once
# --------------------------------------------------------------------------------------------


def _frozen_features(encoder: nn.Module, train_ds, test_ds, batch_size: int):
    """(train features, train labels, test features, test labels), all on the CPU."""
    train_images, train_labels = _images_and_labels(train_ds, "train_ds")
    test_images, test_labels = _images_and_labels(test_ds, "test_ds")
    return (extract_features(encoder, train_images, batch_size=batch_size), train_labels.cpu(),
            extract_features(encoder, test_images, batch_size=batch_size), test_labels.cpu())


def batchnorm_calibrated(encoder: nn.Module, images: torch.Tensor, *, batch_size: int = 256) -> nn.Module:
    """A copy of ``encoder`` whose BatchNorm running statistics are measured on ``images``
    (``torch.optim.swa_utils.update_bn``: forward passes in train mode, no gradient, cumulative
    averages); ``encoder`` itself is untouched. The kit's random-init floor is the encoder as
    built, running statistics (0, 1); this is the other floor a lesson prints beside it where the
    choice matters, asserting against the stricter. An encoder without BatchNorm comes back as an
    unchanged copy."""
    import copy
    checks.tensor(images, "images", dim=4, shape_hint="B×C×H×W")
    checks.positive_int(batch_size, "batch_size")
    calibrated = copy.deepcopy(encoder)
    torch.optim.swa_utils.update_bn(images.split(batch_size), calibrated)
    return calibrated


def probe_encoder(
    encoder: nn.Module,
    train_ds,
    test_ds,
    *,
    batch_size: int = 256,
    k: int = 20,
    temperature: float = 0.1,
    epochs: int = 100,
    weight_decay: float = 1e-4,
) -> dict:
    """Extract frozen features of both splits and return {"linear": acc, "knn": acc}.

    train_ds / test_ds: objects with .images and .labels (load_dataset's ImageDataset) or
    (images, labels) tuples. k is capped at the number of training samples.
    """
    train_feats, train_labels, test_feats, test_labels = _frozen_features(encoder, train_ds, test_ds, batch_size)
    return {
        "linear": linear_probe(train_feats, train_labels, test_feats, test_labels,
                               epochs=epochs, weight_decay=weight_decay),
        "knn": knn_accuracy(train_feats, train_labels, test_feats, test_labels,
                            k=min(k, train_feats.shape[0]), temperature=temperature),
    }


def knn_probe(encoder: nn.Module, train_ds, test_ds, *, k: int = 20, temperature: float = 0.1,
              batch_size: int = 256) -> float:
    """kNN accuracy of frozen encoder features alone: cheap enough to watch during training
    (probe_encoder adds the linear probe on the same features). k is capped at the train size."""
    train_feats, train_labels, test_feats, test_labels = _frozen_features(encoder, train_ds, test_ds, batch_size)
    return knn_accuracy(train_feats, train_labels, test_feats, test_labels,
                        k=min(k, train_feats.shape[0]), temperature=temperature)


@torch.no_grad()
def classification_accuracy(model: nn.Module, dataset, *, batch_size: int = 512) -> float:
    """Top-1 accuracy in [0, 1] of a classifier ``model`` (images -> logits) on ``dataset``.

    ``dataset`` has ``.images`` and ``.labels`` (or is an ``(images, labels)`` pair). The model is
    put in eval mode for the pass and its train/eval flags are restored afterwards.
    """
    images, labels = _images_and_labels(dataset, "dataset")
    checks.positive_int(batch_size, "batch_size")
    device = _module_device(model)
    correct = 0
    with eval_mode(model):
        for i in range(0, len(images), batch_size):
            logits = model(images[i:i + batch_size].to(device))
            correct += (logits.argmax(dim=1).cpu() == labels[i:i + batch_size].cpu()).sum().item()
    return correct / len(images)


# --------------------------------------------------------------------------- the representation itself
def collapse_stats(features: torch.Tensor) -> dict:
    """How spread a batch of features is, with no labels: {"std", "effective_rank"}.

    std: the mean over dimensions of the standard deviation of the L2-normalised features
    (Chen & He 2021 §4.1): 0 when every input maps to one vector (collapse), about 1/√d when
    they spread evenly over the sphere. effective_rank: exp of the entropy of the shares of
    energy (squared singular values) of the N×d matrix of L2-normalised features, not centred
    (Roy & Vetterli 2007's effective rank, on energies): near 1 when the rows share one
    direction (collapse), up to min(N, d) when they use every direction equally."""
    checks.tensor(features, "features", dim=2, shape_hint="N×d")
    if features.shape[0] < 2:
        raise ValueError(f"collapse_stats needs at least 2 rows, got {features.shape[0]}")
    z = F.normalize(features.detach().double(), dim=1)
    std = z.std(dim=0).mean().item()
    energy = torch.linalg.svdvals(z).pow(2)
    weights = energy / energy.sum()
    weights = weights[weights > 0]
    return {"std": std, "effective_rank": math.exp(-(weights * weights.log()).sum().item())}


def alignment_uniformity(z1: torch.Tensor, z2: torch.Tensor, *, t: float = 2.0) -> dict:
    """Wang & Isola (2020) on two views' features (N×d, row i of each the same image), L2-normalised:

        alignment  = mean_i ‖z1_i − z2_i‖²                       (lower: views agree)
        uniformity = log mean_{i<j} exp(−t ‖z_i − z_j‖²)        over the rows of z1 (lower: spread)

    A collapsed representation has alignment 0 and uniformity 0, its worst."""
    checks.tensor(z1, "z1", dim=2, shape_hint="N×d")
    checks.tensor(z2, "z2", dim=2, shape_hint="N×d")
    if z1.shape != z2.shape or z1.shape[0] < 2:
        raise ValueError(f"z1 and z2 must share a shape N×d with N >= 2, got {tuple(z1.shape)} and {tuple(z2.shape)}")
    a, b = F.normalize(z1.detach().double(), dim=1), F.normalize(z2.detach().double(), dim=1)
    distances = torch.pdist(a).pow(2)
    return {"alignment": (a - b).pow(2).sum(dim=1).mean().item(),
            "uniformity": torch.logsumexp(-t * distances, dim=0).item() - math.log(distances.numel())}


def view_embeddings(model: nn.Module, views) -> tuple[torch.Tensor, torch.Tensor]:
    """The features an objective's loss compares (``model.embed``: SimCLR's and SimSiam's
    projections, MoCo's queries) for two views of the same images, in eval mode and without
    gradients: the input of ``alignment_uniformity`` and ``collapse_stats``, the same way in every
    lesson that reads a representation's geometry (02, 03, 13)."""
    if len(views) != 2:
        raise ValueError(f"view_embeddings takes two views of the same images, got {len(views)}")
    if not callable(getattr(model, "embed", None)):
        raise TypeError(f"{type(model).__name__} has no embed(x): pass an objective of "
                        "course_utils.objectives (SimCLR, MoCo, SimSiam)")
    with torch.no_grad(), eval_mode(model):
        return model.embed(views[0]), model.embed(views[1])
