"""Ensembles of base classifiers (Horváth, Müller, Fischer & Vechev, ICLR 2022).

Averaging the outputs of a few independently trained classifiers lowers the variance of the
base classifier under noise, so the smoothed ensemble's p_A moves away from the thresholds and
certified accuracy and ACR rise. :class:`Ensemble` is one ``nn.Module``: the mean of its
members' logits (``mode="logits"``, Horváth et al.'s default) or of their softmaxes
(``mode="softmax"``, returned as the log of the mean, so that argmax and softmax read it as the
averaged probabilities).

K-consensus (``consensus=K``, Horváth et al., Sec. 4): on each noisy input the first K members
run first; where their argmaxes agree on a class, that class is the vote and the other members
do not run on that input; elsewhere every member runs and the mean decides. It defines the
base classifier f_K: x ↦ the first K members' common class where they agree, else the
ensemble's argmax. Its certificates are exact for the smoothed f_K, as every certificate is for
the classifier it samples. With K equal to the number of members f_K is the ensemble itself
(when every member's argmax is c, c is also the argmax of their mean, in either mode), and
nothing is skipped: the same certificates at the same cost. Only K smaller saves member
evaluations, and then f_K may differ from the ensemble where the first K agree and the rest
would outvote them: the certificates are f_K's, not the ensemble's. The identity holds K, so
records of f_K never mix with the ensemble's.

Exact consensus (``consensus="exact"``, softmax mode only) changes the cost and nothing else.
Members run one after another; after k of M, let S be the sum of their softmaxes on a noisy
input and c its top class. Each member still to run adds a probability vector, which raises
any class against c by at most 1, so if S_c − S_j > M − k for every j ≠ c, the ensemble's
argmax is c whatever the rest return, and the input stops there. (Logits are unbounded, so
in logits mode no such bound exists and the option is refused.) It needs k > M/2, so it skips
members only from three on: with M = 3, the third member runs only where the first two are not
confident together. The skip happens only inside the engine's vote counting (an
``argmax_only`` call, :mod:`smoothcert.model_calls`), where the argmax and finiteness of each row
are all that is read; every other call (soft scores, gradients of attacks) gets the whole mean.
So the votes, hence every certificate, are the ensemble's, and the identity is the plain
ensemble's: a file can be resumed with or without it. The test carries a slack of 1e-4 for the
float32 sums.

Members. :meth:`Ensemble.from_checkpoints` refuses members that differ in dataset, number of
classes, class names (and their order) or input shape, in one line naming the first member,
the one that differs and both values; members given as modules that return different numbers
of classes are refused when first called. Members trained at different σ or noise leave the
run's open: :meth:`Ensemble.training_noise` refuses to pick one (the first member's would make
the certificate depend on the order of the members, even its norm), so ``--sigma`` or
``--noise`` must be given, and the run's note names every member's.

Cost. In every engine call the ensemble reports the members that ran on each row; a run's
record gains the column ``member_passes`` (per example, the member forward passes of its
votes, soft scores and clean forwards), which ``report --cost`` reads as the example's forward
passes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from ..errors import SmoothcertError
from ..model_calls import current_call, whole_outputs

MODES = ("logits", "softmax")
SLACK = 1e-4  # exact consensus: margin beyond M − k that covers the float32 sums' rounding


class Ensemble(nn.Module):
    """The mean of ``members``' outputs (see the module doc). ``member_sha256`` are the
    members' fingerprints for a run's identity (the checkpoint files' SHA-256 when built by
    :meth:`from_checkpoints`; None: their state dicts are hashed), ``meta`` the first
    checkpoint's meta ({} for modules), ``member_meta`` each checkpoint's (its file, its meta;
    () for modules), from which :meth:`training_noise` reads what the members were trained
    with. ``evaluations`` counts member forward passes (rows) and
    ``inputs`` the rows the ensemble was called on, for measuring what a consensus saves
    (:meth:`evaluations_per_input`)."""

    def __init__(self, members: Sequence[nn.Module], mode: str = "logits",
                 consensus: int | str | None = None, member_sha256: Sequence[str] | None = None,
                 meta: dict | None = None,
                 member_meta: Sequence[tuple[str, dict]] | None = None):
        super().__init__()
        members = list(members)
        if not members or not all(isinstance(m, nn.Module) for m in members):
            raise SmoothcertError("an ensemble needs one or more nn.Module members, got "
                                  f"{[type(m).__name__ for m in members]}")
        if mode not in MODES:
            raise SmoothcertError(f"ensemble mode must be one of {', '.join(MODES)}, got "
                                  f"{mode!r}")
        _check_consensus(consensus, mode, len(members))
        if member_sha256 is not None and len(member_sha256) != len(members):
            raise SmoothcertError("member_sha256 needs one fingerprint per member")
        self.members = nn.ModuleList(members)
        self.mode, self.consensus = mode, consensus
        self.member_sha256 = tuple(member_sha256) if member_sha256 is not None else None
        self.meta = dict(meta or {})
        self.member_meta = tuple((str(label), dict(m)) for label, m in member_meta or ())
        # counters as device tensors: no host synchronisation, and torch.compile traces them
        self.register_buffer("_evaluations", torch.zeros((), dtype=torch.long), persistent=False)
        self.register_buffer("_inputs", torch.zeros((), dtype=torch.long), persistent=False)
        classes = {getattr(m, "num_classes", None) for m in members} - {None}
        if len(classes) > 1:
            raise SmoothcertError(f"the members disagree on the number of classes: {classes}")
        if classes:
            self.num_classes = classes.pop()
        encodings = {getattr(m, "input_encoding", None) for m in members}
        if len(encodings) > 1:  # ablated inputs (NaN) would reach a member without the encoding
            raise SmoothcertError(f"the members disagree on the input encoding: {encodings}")
        self.input_encoding = encodings.pop()

    @classmethod
    def from_checkpoints(cls, paths: str | os.PathLike | Sequence[str | os.PathLike],
                         mode: str = "logits", consensus: int | str | None = None,
                         device="cpu") -> Ensemble:
        """The classifiers of smoothcert checkpoints (files or train run folders; one path is
        an ensemble of one) that agree on the dataset, the classes (their number and names)
        and the input shape (:func:`check_members`), fingerprinted by their files."""
        from ..io import file_sha256
        from .checkpoint import checkpoint_file, model_from_checkpoint

        files = [checkpoint_file(p) for p in _checkpoint_paths(paths)]
        loaded = [model_from_checkpoint(f, device=device) for f in files]
        metas = [meta for _, meta in loaded]
        check_members([str(f) for f in files], metas)
        return cls([m for m, _ in loaded], mode, consensus, [file_sha256(f) for f in files],
                   meta=metas[0], member_meta=list(zip(map(str, files), metas)))

    def training_noise(self, sigma, noise: str | None) -> tuple[dict, str | None]:
        """(the training noise the members agree on, a line naming each member's where they
        disagree, else None), from their checkpoints' metas.

        Where they disagree on σ (a member trained without noise included), ``sigma`` must be
        given; where they disagree on the noise, ``noise``: no member's stands for the others
        (the order of the members would otherwise pick the run's σ, or its norm). The agreed
        part holds ``name`` and ``sigma`` where every member that has it agrees on it."""
        stored = self.meta.get("noise") or {}
        trained = [(label, meta.get("noise") or None) for label, meta in self.member_meta]
        if len({_noise_key(n) for _, n in trained}) <= 1:
            return stored, None
        names = {n["name"] for _, n in trained if n is not None}
        sigmas = {None if n is None else n["sigma"] for _, n in trained}
        missing = [flag for flag, open_, given in (("--sigma", len(sigmas) > 1, sigma),
                                                    ("--noise", len(names) > 1, noise))
                   if open_ and given is None]
        listed = ", ".join(f"{label}: {_noise_text(n)}" for label, n in trained)
        if missing:
            raise SmoothcertError(
                f"the ensemble's members were trained with different noise ({listed}); pass "
                f"{' and '.join(missing)} (Python: {', '.join(m[2:] + '=' for m in missing)}) "
                "to choose the run's")
        agreed = {"name": names.pop()} if len(names) == 1 else {}
        if len(sigmas) == 1:
            agreed["sigma"] = sigmas.pop()
        return agreed, f"the ensemble's members were trained with {listed}"

    def fingerprint(self, member_sha256: Sequence[str]) -> dict:
        """The ensemble's part of a run identity: the members' fingerprints in order, the mode
        and K (None: no consensus, or the exact one, which changes no vote)."""
        consensus = None if self.consensus == "exact" else self.consensus  # votes unchanged
        return {"members": list(member_sha256), "mode": self.mode, "consensus": consensus}

    @property
    def evaluations(self) -> int:
        """Member forward passes (rows) so far."""
        return int(self._evaluations)

    @property
    def inputs(self) -> int:
        """Rows the ensemble was called on so far."""
        return int(self._inputs)

    def evaluations_per_input(self) -> float | None:
        """Member forward passes per input row so far (the number of members without a
        consensus); None before the first call."""
        inputs = self.inputs
        return self.evaluations / inputs if inputs else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        call = current_call()  # the engine's: it may read only argmaxes, and takes the cost
        tally = _Tally(len(x), x.device)  # members run per row, the classes they return
        with whole_outputs():  # members' outputs are averaged, never only argmaxed
            if self.consensus == "exact" and call is not None and call.argmax_only:
                out = self._exact(x, tally)
            elif self.consensus in (None, "exact"):
                out = self._mean([self._run(i, x, tally) for i in range(len(self.members))])
            else:
                out = self._k_consensus(x, tally)
        self._inputs += len(x)
        self._evaluations += tally.passes.sum()
        if call is not None:
            call.row_passes = tally.passes
        return out

    def _k_consensus(self, x: torch.Tensor, tally: _Tally) -> torch.Tensor:
        first = [self._run(i, x, tally) for i in range(self.consensus)]
        votes = torch.stack([out.argmax(dim=1) for out in first])
        agree = (votes == votes[0]).all(dim=0)
        out = self._mean(first)  # where the first K agree, its argmax is their class
        rest = ~agree
        if rest.any() and len(self.members) > self.consensus:
            later = [self._run(i, x[rest], tally, rest)
                     for i in range(self.consensus, len(self.members))]
            full = self._mean([o[rest] for o in first] + later)
            out = out.to(full.dtype).index_put((rest.nonzero().squeeze(1),), full)
        return out

    def _exact(self, x: torch.Tensor, tally: _Tally) -> torch.Tensor:
        """Outputs with the argmax (and finiteness) of the whole mean on every row, members run
        only on the rows whose vote the members still to run could change (module doc)."""
        live = torch.arange(len(x), device=x.device)  # rows still undecided
        outputs: list = []  # each run member's outputs on the live rows
        total = None  # the sum of their softmaxes on the live rows
        out = None
        for k in range(1, len(self.members) + 1):
            outputs.append(self._run(k - 1, x[live], tally, live))
            p = outputs[-1].float().softmax(dim=1)
            total = p if total is None else total + p
            if out is None:
                out = torch.empty((len(x), p.shape[1]), dtype=torch.float32, device=x.device)
            left = len(self.members) - k
            if left == 0:
                out[live] = self._mean(outputs)  # the same mean as without consensus
                break
            top2 = total.topk(2, dim=1).values  # NaN rows never pass: they run to the end
            decided = top2[:, 0] - top2[:, 1] > left + SLACK
            out[live[decided]] = (total[decided] / k).log()  # argmax c, as the whole mean's
            keep = ~decided
            live, total = live[keep], total[keep]
            outputs = [o[keep] for o in outputs]
            if not len(live):
                break
        return out

    def _run(self, index: int, x: torch.Tensor, tally: _Tally,
             rows: torch.Tensor | None = None) -> torch.Tensor:
        """Member ``index`` on ``x``, the rows ``rows`` of the call's input (None: all of
        them), counted in ``tally``, which refuses a member of other classes."""
        tally.passes[rows if rows is not None else slice(None)] += 1
        out = self.members[index](x)
        tally.check_classes(index, out)
        return out

    def _mean(self, outputs: list) -> torch.Tensor:
        if self.mode == "logits":
            return torch.stack(outputs).mean(dim=0)
        # float32 log-probabilities whatever the members' dtype: bf16 would round near-ties
        # into ties, so the vote would depend on the class order
        return torch.stack([o.float().softmax(dim=1) for o in outputs]).mean(dim=0).log()


class _Tally:
    """One call of an ensemble: the member passes of each row, and the classes the first
    member that ran returned (the means of outputs of other widths would be torch errors)."""

    __slots__ = ("passes", "classes")

    def __init__(self, rows: int, device):
        self.passes = torch.zeros(rows, dtype=torch.long, device=device)
        self.classes: tuple[int, int] | None = None  # (member, its number of classes)

    def check_classes(self, index: int, out: torch.Tensor) -> None:
        width = out.shape[-1] if out.dim() else 0
        if self.classes is None:
            self.classes = (index, width)
        elif width != self.classes[1]:
            first, classes = self.classes
            raise SmoothcertError(
                f"the ensemble's members must return the same classes: member {first + 1} "
                f"returns {classes} classes, member {index + 1} returns {width}; build it of "
                "classifiers of one dataset")


def _checkpoint_paths(paths) -> list:
    """``paths`` as a list of paths: one path is a list of one (a string is not walked
    character by character)."""
    if isinstance(paths, (str, os.PathLike)):
        return [paths]
    if isinstance(paths, (Sequence, Iterator)) and not isinstance(paths, bytes):
        paths = list(paths)
        if all(isinstance(p, (str, os.PathLike)) for p in paths):
            if not paths:
                raise SmoothcertError("an ensemble needs at least one checkpoint")
            return paths
        held = sorted({type(p).__name__ for p in paths if not isinstance(p, (str, os.PathLike))})
        raise SmoothcertError("Ensemble.from_checkpoints takes one path or a list of paths of "
                              f"checkpoints, got a list holding {', '.join(held)}")
    raise SmoothcertError("Ensemble.from_checkpoints takes one path or a list of paths of "
                          f"checkpoints, got {type(paths).__name__}")


# what every member must share (input_encoding: absent from the meta of a plain classifier)
SHARED = ("dataset", "num_classes", "classes", "input_shape", "input_encoding")


def check_members(labels: Sequence[str], metas: Sequence[dict]) -> None:
    """Every member's meta against the first's on :data:`SHARED`: one line naming the first
    member that differs, the first one, and both values (an ensemble's mean of members of
    other classes, or of class names in another order, would average unrelated outputs)."""
    for label, meta in zip(labels[1:], metas[1:]):
        for key in SHARED:
            mine, first = meta.get(key), metas[0].get(key)
            if mine != first:
                detail = _class_names_differ(first, mine) if key == "classes" else ""
                raise SmoothcertError(
                    f"ensemble members must share {key}: {labels[0]} has "
                    f"{_shown(key, first)}, {label} has {_shown(key, mine)}{detail}")


def _shown(key: str, value) -> str:
    if key != "classes" or value is None:
        return "no class names" if key == "classes" else repr(value)
    names = ", ".join(value[:4]) + (", ..." if len(value) > 4 else "")
    return f"{len(value)} classes ({names})"


def _class_names_differ(first, other) -> str:
    if first is None or other is None:
        return ""
    only = sorted(set(first) ^ set(other))
    return f"; names only in one: {', '.join(only[:6])}" if only else "; same names, other order"


def _noise_key(noise: dict | None) -> tuple:
    return (None, None) if noise is None else (noise.get("name"), noise.get("sigma"))


def _noise_text(noise: dict | None) -> str:
    return "without noise" if noise is None else f"{noise['name']} noise at sigma {noise['sigma']}"


def fingerprint_sha256(fingerprint: dict) -> str:
    """One SHA-256 for an ensemble's identity part (the run's ``checkpoint_sha256``)."""
    text = json.dumps(fingerprint, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _check_consensus(consensus, mode: str, members: int) -> None:
    if consensus == "exact":
        if mode != "softmax":
            raise SmoothcertError("exact consensus needs the softmax mode (--ensemble-mode "
                                  "softmax): logits are unbounded, so the members still to run "
                                  "could always overturn the vote")
        return
    if consensus is not None and (isinstance(consensus, bool) or not isinstance(
            consensus, int) or not 1 <= consensus <= members):
        raise SmoothcertError(f"consensus must be 'exact' or an integer K in 1..{members} (the "
                              f"number of members), got {consensus!r}")
