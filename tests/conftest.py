import torch
from torch import nn


class Halfspace(nn.Module):
    """f(x) = [w·x > b] as two logits: the closed-form oracle of randomized smoothing.

    Under N(0, σ²I) noise, P(f(x+δ) = 1) = Φ((w·x − b)/(σ‖w‖)), and the smoothed classifier's
    exact L2 robustness radius at x is the distance |w·x − b| / ‖w‖ to the hyperplane.
    """

    def __init__(self, w, b=0.0, input_shape=None):
        super().__init__()
        self.register_buffer("w", torch.as_tensor(w, dtype=torch.float32).flatten())
        self.b = float(b)
        if input_shape is not None:
            self.input_shape = tuple(input_shape)

    def forward(self, x):
        z = x.flatten(1) @ self.w - self.b
        return torch.stack([-z, z], dim=1)
