"""Run at start-up by every Python process whose PYTHONPATH names this folder: cuDNN off, so that CUDA
convolutions are ATen's own kernels. tests/test_gpu.py puts it on the path of the spatial strategies' ranks
(see WITHOUT_CUDNN there). It shadows any other sitecustomize module for those processes."""

import torch

torch.backends.cudnn.enabled = False
