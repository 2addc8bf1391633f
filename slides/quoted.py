"""Figures the talk quotes from others, each with its source: quoted, not measured by gpuload.

Example:
    >>> GPU_TRAINING["quoted_not_measured"], GPU_TRAINING["images_per_second"] > 0
    (True, True)
"""

from __future__ import annotations

__all__ = ["GPU_TRAINING"]

# What one GPU trains per second, the yardstick of the "cores per GPU" slide: NVIDIA's published
# ResNet-50 v1.5 training throughput, mixed precision, one GPU of a DGX A100 (8x A100 80GB), PyTorch,
# from the results table of its DeepLearningExamples README (pytorch-21.03 NGC container).
GPU_TRAINING = {
    "quoted_not_measured": True,
    "images_per_second": 2470,
    "model": "ResNet-50 v1.5",
    "precision": "mixed precision",
    "gpu": "one A100 80GB (DGX A100)",
    "publisher": "NVIDIA DeepLearningExamples, PyTorch, pytorch-21.03 NGC container",
    "url": "https://github.com/NVIDIA/DeepLearningExamples/tree/master/PyTorch/Classification/ConvNets/resnet50v1.5",
    "published": "2021-03",
    "read_on": "2026-11-27",
}
