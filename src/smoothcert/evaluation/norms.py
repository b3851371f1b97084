"""Which radius a report reads: the radius in a chosen norm (``report --norm``), and the unit
a record file's radius is in.

Since Step 16 the files of certifiers whose certificate is a ball of the noise hold
``radius_l1``, ``radius_l2`` and ``radius_linf`` beside ``radius`` (the noise's own norm:
ℓ2 for Gaussian noise, ℓ1 for uniform). :func:`in_norm` gives a file whose ``radius`` column
is the one of the chosen norm, so that every metric, envelope, interval and plot reads the
chosen norm without knowing about norms.

A file from before those columns is read in its noise's norm from ``radius``; another norm is
refused with one line (re-certify to get it) rather than converted: a re-certified file holds
the noise's best certificate in that norm, which for noises with a direct certificate there
(uniform noise's ℓ∞, Yang et al. 2020) is larger than the conversion of ``radius``, so a
converted column would give one name two meanings; and converting needs the input dimension,
which an old manifest does not record for every dataset.

A certifier whose radius is not an ℓp distance says so with
:meth:`~smoothcert.certifiers.certifier.Certifier.radius_norm` (e.g. a patch side in pixels);
its files are read as they are, their unit shown, and ``--norm`` is refused for them.

One report reads one norm (:func:`radius_units`): without ``--norm``, files whose radii are
in different norms (a Gaussian file's ℓ2, a Laplace file's ℓ1) are refused in one line naming
the ``--norm`` values every file holds (:func:`readable_norms`), since a table, axis,
σ-envelope or agreement over them would compare radii of different balls; a certifier's own
unit may share a table, each row saying its unit, but no envelope or agreement
(:func:`one_unit`). The metrics (:mod:`.metrics`, :mod:`.intervals`) read the ``radius``
column they are given: their callers read the files in one norm first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..certifiers.certifier import CERTIFIERS
from ..certifiers.columns import radius_column
from ..errors import SmoothcertError
from ..noise.base import NOISES, NORMS
from ..runs.records import Records

NORM_LABELS = {"l1": "ℓ1", "l2": "ℓ2", "linf": "ℓ∞"}
"""How tables and plots write each norm of :data:`~smoothcert.noise.base.NORMS`."""

ATTACK_NORM = "l2"  # the attacks' distances (PGD-L2, DDN: smoothing/attacks.py)


def check_norm(norm: str | None) -> None:
    """``norm`` is None (each file's own radius) or one of the norms; else one line."""
    if norm is not None and norm not in NORMS:
        raise SmoothcertError(f"unknown norm {norm!r}; choose one of {', '.join(NORMS)}")


def primary_norm(records: Records) -> str | None:
    """The norm of the file's ``radius``: its noise's (the manifest identity's; a file without
    a manifest, as Cohen et al.'s, is Gaussian: ℓ2); None for a noise no longer registered."""
    identity = (records.manifest or {}).get("identity") or {}
    noise = NOISES.get(identity.get("noise", "gaussian"))
    return None if noise is None else noise.norm


def certifier_unit(records: Records) -> str | None:
    """The unit its certifier gives the file's ``radius`` when that is no ℓp ball of the noise
    (:meth:`~smoothcert.certifiers.certifier.Certifier.radius_norm`, asked of the certifier
    the manifest names, with its options); None otherwise, or when the manifest names none."""
    certifier = _certifier(records)
    return None if certifier is None else certifier.radius_norm()


def radius_unit(records: Records, norm: str | None = None) -> str:
    """What the file's radii are read in, as a table shows it: ``norm``'s label when one is
    chosen, else its certifier's unit, else its noise's norm (``?`` when unknown)."""
    if norm is not None:
        return NORM_LABELS[norm]
    unit = certifier_unit(records)
    if unit is not None:
        return unit
    return NORM_LABELS.get(primary_norm(records), "?")


def in_norm(records: Records, norm: str | None) -> Records:
    """``records`` whose ``radius`` is the radius in ``norm`` (None: the file as it is).

    Its ``radius_<norm>`` column where it has one; its ``radius`` where that is already in
    ``norm`` (a file from before Step 16); a file without a radius (PREDICT) as it is; an
    attack file (distances in ℓ2) only for ℓ2. Anything else is one SmoothcertError naming the
    file and how to get the radius (this module's doc)."""
    check_norm(norm)
    if norm is None:
        return records
    if "success" in records and "distance" in records:  # attack files: metrics.is_attack_records
        if norm != ATTACK_NORM:
            raise SmoothcertError(f"{records.path} holds attack distances, which are "
                                  f"{NORM_LABELS[ATTACK_NORM]}; report it without --norm")
        return records
    if "radius" not in records:
        return records
    unit = certifier_unit(records)
    if unit is not None:
        raise SmoothcertError(f"{records.path} certifies {unit}, not an ℓp radius; report it "
                              "without --norm")
    column = radius_column(norm)
    if column in records:
        return dataclasses.replace(records, data={**records.data, "radius": records[column]})
    if primary_norm(records) == norm:
        return records
    raise SmoothcertError(_missing(records, norm))


def in_norms(records: Sequence[Records], norm: str | None) -> list[Records]:
    """:func:`in_norm` of each file."""
    return [in_norm(r, norm) for r in records]


def readable_norms(records: Records) -> tuple[str, ...]:
    """The norms :func:`in_norm` reads the file in, in :data:`NORMS` order: every one for a
    file without a radius (PREDICT), ℓ2 for an attack file, none for a certifier's own unit,
    else the norms of its ``radius_<norm>`` columns and its noise's own."""
    if "success" in records and "distance" in records:  # attack files: metrics.is_attack_records
        return (ATTACK_NORM,)
    if "radius" not in records:
        return NORMS
    if certifier_unit(records) is not None:
        return ()
    own = primary_norm(records)
    return tuple(n for n in NORMS if radius_column(n) in records or n == own)


def radius_units(records: Sequence[Records], norm: str | None) -> dict:
    """What the files' radii are read in: {unit: the paths of its files}, in file order; the
    unit is ``norm`` when one is chosen (:func:`in_norm` reads each file in it), else each
    file's noise's norm (``l1``, ``l2``, ``linf``; None for a noise this smoothcert does not
    know) or its certifier's own unit. Files without a radius (PREDICT) have none.

    Without ``norm``, files whose radii are ℓp balls of different norms are refused in one line
    naming each file's and the ``--norm`` values every file holds: an ℓ1 radius of 0.5 and an
    ℓ2 radius of 0.5 are different certificates, so one table, axis, envelope or agreement
    reads one norm. A certifier's own unit (a patch side, pixels changed: another threat model,
    which no norm converts) may sit beside them in a table, each row saying its unit; what
    compares files radius by radius asks :func:`one_unit`.
    """
    check_norm(norm)
    units: dict = {}
    for r in records:
        if "radius" in r:  # a PREDICT file certifies no radius; attack files are all ℓ2
            unit = norm or certifier_unit(r) or primary_norm(r)
            units.setdefault(unit, []).append(str(r.path))
    if len([u for u in units if u is None or u in NORMS]) > 1:
        raise SmoothcertError(_mixed(records, units))
    return units


def one_unit(records: Sequence[Records], norm: str | None, flag: str) -> str | None:
    """The one unit of :func:`radius_units` (None: no file has a radius, or its noise is
    unknown), for ``flag``, which compares the files radius by radius (``--envelope``,
    ``--agreement``, a plot's axis): files of a certifier's own unit beside others are refused
    in one line."""
    units = radius_units(records, norm)
    if len(units) > 1:
        raise SmoothcertError(f"{flag} compares the files radius by radius, but their radii "
                              f"are in different units ({_listing(units)}); drop {flag} or "
                              "report them separately")
    return next(iter(units), None)


MIXED_LISTED = 3  # files named per unit in one line; more are counted (the line stays short)


def _listing(units: dict) -> str:
    """``ℓ2: a.tsv, b.tsv; ℓ1: 5 files (c.tsv, d.tsv, e.tsv, ...)``."""
    return "; ".join(f"{NORM_LABELS.get(u, u or '?')}: " + (
        ", ".join(paths) if len(paths) <= MIXED_LISTED else
        f"{len(paths)} files ({', '.join(paths[:MIXED_LISTED])}, ...)")
        for u, paths in units.items())


def _mixed(records: Sequence[Records], units: dict) -> str:
    """Why files of several norms (``units``: unit → paths) share no report, and what to do."""
    shared = [n for n in NORMS if all(n in readable_norms(r) for r in records)]
    fix = ("; add " + _either([f"--norm {n}" for n in shared]) + " (radii every file holds)"
           if shared else "; no --norm reads every file, so report them separately")
    return (f"the files' radii are in different norms ({_listing(units)}), and one table, "
            f"plot, envelope or agreement reads one norm{fix}")


def _either(options: Sequence[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return options[0] if len(options) == 1 else f"{', '.join(options[:-1])} or {options[-1]}"


def _missing(records: Records, norm: str) -> str:
    """Why a file has no radius in ``norm``, and what to do, in one line."""
    certifier, label = _certifier(records), NORM_LABELS[norm]
    own = NORM_LABELS.get(primary_norm(records), "its noise's norm")
    if certifier is not None and radius_column(norm) not in certifier.columns:
        return (f"{records.path}: its certifier ({certifier.name}) records its {own} radius "
                f"only; report it without --norm")
    return (f"{records.path} has no {radius_column(norm)} column (it was certified before "
            f"smoothcert recorded radii in every norm) and its radius is {own}; re-certify it "
            f"to report {label} radii, or report it without --norm")


def _certifier(records: Records):
    """The certifier the manifest names, built with its options; None without a manifest, or
    for a certifier (or options) this smoothcert does not know."""
    identity = (records.manifest or {}).get("identity") or {}
    cls = CERTIFIERS.get(identity.get("certifier"))
    if cls is None:
        return None
    try:
        return cls(**(identity.get("options") or {}))
    except (SmoothcertError, TypeError):
        return None
