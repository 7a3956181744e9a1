import math

import numpy as np
import pytest
import torch

from sixbit.eval.metrics import psnr, ssim


def test_psnr_by_hand():
    a = np.zeros((2, 8, 8, 3))
    b = a + 0.1
    assert psnr(b, a) == pytest.approx(20.0)  # 10·log10(1 / 0.01)
    assert psnr(a, a) == math.inf
    with pytest.raises(ValueError, match="shape"):
        psnr(a, a[:1])


def test_ssim_identity_and_ordering():
    rng = np.random.default_rng(0)
    ref = rng.random((1, 4, 32, 32, 3))
    assert ssim(ref, ref) == pytest.approx(1.0)
    small = np.clip(ref + rng.normal(0, 0.02, ref.shape), 0, 1)
    large = np.clip(ref + rng.normal(0, 0.2, ref.shape), 0, 1)
    assert 1.0 > ssim(small, ref) > ssim(large, ref) > 0
    assert ssim(torch.tensor(small), torch.tensor(ref)) == pytest.approx(ssim(small, ref))
    # a constant brightness shift keeps structure: SSIM stays far above that of noise of the same MSE
    shifted = np.clip(ref * 0.8 + 0.1, 0, 1)
    assert ssim(shifted, ref) > ssim(large, ref)
    with pytest.raises(ValueError, match="window"):
        ssim(np.zeros((1, 2, 4, 4, 3)), np.zeros((1, 2, 4, 4, 3)))
