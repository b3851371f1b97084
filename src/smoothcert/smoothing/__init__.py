"""The smoothed classifier g and the one Monte Carlo engine that serves it.

``engine.py`` runs programs that yield :class:`Draws`; ``smoothed.py`` is :class:`Smoothed`
(PREDICT and CERTIFY); ``sigma_optimization.py`` and ``attacks.py`` are algorithms on g.
"""

from .engine import BatchedVotes, Draws
from .smoothed import Certificate, Prediction, Smoothed

__all__ = ["BatchedVotes", "Certificate", "Draws", "Prediction", "Smoothed"]
