"""Tables of record files, generated from files, never edited by hand.

Columns: name, n, clean accuracy, abstention rate, ACR, then certified accuracy at each radius
(``r=0.25``, ...). ``md`` and ``latex`` show accuracies in percent with one decimal and ACR with
three; ``csv`` and ``json`` keep full float precision as fractions in [0, 1]. PREDICT files (no
radius column) show their accuracy and abstention rate and leave the radius columns empty
(``–`` in md, ``--`` in LaTeX, empty in csv, null in json). ``envelope=True`` adds a row
``envelope``: the best certified accuracy over the files at each radius (the σ-envelope), for
files of the same examples of one dataset split. Files of several dataset splits (their
manifests say which) get a ``dataset`` column after ``name``.
Data-dependent files add ``adjusted`` (certificates the memory changed) and, since their σ_x
varies over the rows, ``σ_x min``, ``σ_x mean``, ``σ_x max`` (keys ``sigma_min``, ...).

Attack record files (``smoothcert attack``; recognised by their ``success`` and ``distance``
columns, so hand-written and merged files work too) get their own table: name, attack, n, clean
accuracy, attacked (the fraction of the clean-correct examples whose smoothed prediction was
flipped), median and mean distance (:class:`~smoothcert.evaluation.metrics.AttackSummary` says how
failed
attacks count), then the attack curve at each distance (``d<=0.25``: fraction flipped within
0.25). Attack files and certification files cannot share one table.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable, Sequence

import numpy as np

from ..errors import SmoothcertError
from ..runs.records import distinct_labels, read_records
from .dense import dense_table
from .metrics import (
    Agreement,
    AttackSummary,
    Summary,
    certified_accuracy_envelope,
    certified_agreement,
    forward_passes,
    is_attack_records,
    parse_radii,
    summarize,
    summarize_attack,
)
from .norms import NORM_LABELS, check_norm, in_norms, one_unit, radius_unit, radius_units
from .tables import Table, get_format

log = logging.getLogger(__name__)


def report(paths: Iterable, radii, fmt: str = "md", plot=None, *, envelope: bool = False,
           ecdf=None, sigma_hist=None, common: bool = False, cost: bool = False,
           plot_cost=None, cost_radius: float = 0.5, norm: str | None = None) -> str:
    """Read each record file, summarize it at ``radii`` and return the table in format ``fmt``.

    ``paths`` is one path or several; ``radii`` floats or a string (:func:`.parse_radii`).
    Segmentation and median-smoothing files get their own table (:func:`.dense.dense_table`).
    If ``plot`` is a path, the certified-accuracy-vs-radius figure of the files is written there
    (the attack curves, for attack files). ``envelope`` adds the σ-envelope row (and curve) of
    files holding the same examples of one dataset split (refused otherwise);
    ``ecdf``, a path, receives the p̂_A ECDF figure of the files (Sun et al. 2024, Fig. 3);
    ``sigma_hist``, a path, the histogram of each file's per-example σ (its ``sigma`` column:
    σ_x for data-dependent files). When some file's σ varies over its rows, the table gets the
    columns ``σ_x min``, ``σ_x mean``, ``σ_x max`` (see :func:`certification_table`).
    ``common`` restricts every file to the examples (idx) all of them hold. ``cost`` adds
    the columns :data:`COST_COLUMNS` (seconds and forward passes per example, the device);
    ``plot_cost``, a path, receives certified accuracy at ``cost_radius`` against forward passes
    per example, one point per file, the cheapest-best files joined (their Pareto frontier).
    ``norm`` (``l1``, ``l2``, ``linf``; None: each file's own) reads every file's radius in
    that norm (:func:`~.norms.in_norm`; all of the above is computed from it) and says it in
    the column :data:`UNIT_COLUMN` (:func:`with_units`: also a certifier's own unit).
    """
    formatter, radii = get_format(fmt), _radii(radii)  # fail on a bad name before reading
    check_norm(norm)
    figures = {"--ecdf": ecdf, "--sigma-hist": sigma_hist, "--plot-cost": plot_cost}
    check_outputs(paths, {"--plot": plot, **figures})
    records, certify_only = _read(paths, norm, common), {**figures, "--envelope": envelope,
                                                         "--cost": cost}
    if (dense := dense_table(records)) is not None:  # segmentation or median files
        refuse(certify_only | {"--plot": plot, "--norm": norm}, "segmentation or median")
        return formatter(dense)
    if _attack_files(records):
        refuse(certify_only, "attack")
        return formatter(_attack_report(records, radii, plot))
    _check_comparable(records, norm, envelope)
    summaries = [summarize(r, radii) for r in records]
    table = certification_table(summaries, radii)
    if cost:
        table = with_columns(table, COST_COLUMNS, [cost_values(r) for r in records])
    if envelope:
        best_clean = max(s.clean_accuracy for s in summaries)
        table = with_envelope(table, certified_accuracy_envelope(records, radii), best_clean)
    if plot_cost is not None:
        from .plots import plot_cost_frontier

        plot_cost_frontier(records, plot_cost, cost_radius, norm=norm)
    _figures(records, plot, envelope, ecdf, sigma_hist, norm)
    return formatter(with_datasets(with_units(table, records, norm), records))


def _check_comparable(records: Sequence, norm: str | None, envelope: bool) -> None:
    """Before any figure: the files' radii are in one norm (:func:`~.norms.radius_units`);
    with the envelope, in one unit, of one dataset split and the same examples."""
    radius_units(records, norm)
    if envelope:
        one_unit(records, norm, "--envelope")
        _check_one_dataset(records, "--envelope")
        _check_same_examples(records)


def refuse(flags: dict, files: str) -> None:
    """One line naming the ``flags`` given (not None or False) that ``files`` records lack."""
    given = [flag for flag, value in flags.items() if value not in (None, False)]
    if given:
        flags_text = given[0] if len(given) == 1 else f"{', '.join(given[:-1])} and {given[-1]}"
        raise SmoothcertError(f"{flags_text} {'needs' if len(given) == 1 else 'need'} CERTIFY "
                              f"record files, not {files} records")


def _read(paths, norm: str | None, common: bool) -> list:
    """The files, named, their radii in ``norm`` (:func:`~.norms.in_norm`), each restricted
    to the examples all hold where ``common``."""
    records = in_norms(_labelled_records(paths), norm)
    if common:
        _check_one_dataset(records, "--common")
        records = common_examples(records)
    return records


COST_COLUMNS = (("seconds_per_example", "s/img", "float3"),
                ("passes_per_example", "passes/img", "int"), ("device", "device", "text"))
"""(key, header, style) of ``report(cost=True)``'s columns: the mean of the ``time`` column, the
mean forward passes of base classifiers (n0 + n, plus a certifier's clean pass;
:func:`~smoothcert.evaluation.metrics.forward_passes`: an ensemble's count its members') and
the device the manifest names (empty where a file lacks the column or the manifest)."""


def cost_values(records) -> tuple:
    """One file's :data:`COST_COLUMNS` values."""
    passes = forward_passes(records)
    seconds = float(np.mean(records["time"])) if "time" in records else None
    device = ((records.manifest or {}).get("provenance") or {}).get("device")
    return (seconds, None if passes is None else float(np.mean(passes)),
            device if isinstance(device, str) else None)


def check_outputs(paths, outputs: dict) -> None:
    """Refuse outputs (flag → path, None where not asked) that would overwrite a file the report
    reads (a record file or its manifest) or another output (one would replace the other), before
    anything is read or written."""
    from ..io import check_not_input, same_file
    from ..runs.records import manifest_path

    paths = _paths_and_labels(paths)[0]
    given = [(flag, out) for flag, out in outputs.items() if out is not None]
    for k, (flag, out) in enumerate(given):
        check_not_input(out, [*paths, *map(manifest_path, paths)], flag)
        for other, earlier in given[:k]:
            if same_file(out, earlier):
                raise SmoothcertError(f"{other} and {flag} name the same file {out}; give each "
                                      "its own file")


def _figures(records: Sequence, plot, envelope: bool, ecdf, sigma_hist,
             norm: str | None = None) -> None:
    """Write the figures asked for, after checking every file for all of them (so that a bad
    file leaves no figure written)."""
    from .metrics import pa_hat

    for r in records:
        if ecdf is not None:
            pa_hat(r)
        if sigma_hist is not None and "sigma" not in r:
            raise SmoothcertError(f"--sigma-hist needs a sigma column (σ per example); {r.path} "
                                  "has none")
    if plot is not None:
        from .plots import plot_certified_accuracy

        plot_certified_accuracy(records, plot, envelope=envelope, norm=norm)
    if ecdf is not None:
        from .plots import plot_pa_ecdf

        plot_pa_ecdf(records, ecdf)
    if sigma_hist is not None:
        from .plots import plot_sigma_histogram

        plot_sigma_histogram(records, sigma_hist)


def common_examples(records: Sequence) -> list:
    """Each file restricted to the idx every file holds (rows kept in file order)."""
    shared = set.intersection(*(set(r["idx"].tolist()) for r in records))
    if not shared:
        raise SmoothcertError("--common: the files share no example (idx)")
    out = []
    for r in records:
        keep = np.isin(r["idx"], sorted(shared))
        out.append(dataclasses.replace(r, data={k: v[keep] for k, v in r.data.items()}))
    return out


def data_split(records) -> str | None:
    """The dataset split a file's rows certify, as its manifest's identity says
    (``fashion-mnist test``); None for a file without one (Cohen et al.'s files)."""
    identity = (records.manifest or {}).get("identity") or {}
    if "dataset" not in identity:
        return None
    return " ".join(str(identity[k]) for k in ("dataset", "split") if identity.get(k) is not None)


def _check_one_dataset(records: Sequence, flag: str) -> None:
    """``flag`` matches files example by example (by idx), and the same idx in two datasets (or
    splits) are two different images: every file must certify one dataset split, as their
    manifests say (files without a manifest, such as Cohen et al.'s, are taken on trust)."""
    seen = {}
    for r in records:
        if (data := data_split(r)) is not None:
            seen.setdefault(data, r.path)
    if len(seen) > 1:
        (a, path_a), (b, path_b) = list(seen.items())[:2]
        raise SmoothcertError(
            f"{flag} combines files of one dataset split, but {path_a} is {a} and {path_b} is "
            f"{b}; report them without {flag} or in separate reports")


def _check_same_examples(records: Sequence) -> None:
    """The σ-envelope takes the best file at each radius: over files of different examples
    it would be a maximum over different populations, so every file must hold the same idx."""
    first = set(records[0]["idx"].tolist())
    for r in records[1:]:
        other = set(r["idx"].tolist())
        if other != first:
            raise SmoothcertError(
                f"--envelope takes the best file at each radius, so its files must hold the "
                f"same examples, but {records[0].path} and {r.path} hold {len(first)} and "
                f"{len(other)} examples ({len(first & other)} in both); add --common to take it "
                "on the examples all files hold")


UNIT_COLUMN = ("radius_in", "radius in", "text")
"""(key, header, style) of the column that says what each row's radii are in: the norm of
``--norm`` (``ℓ∞``), or a certifier's own unit (``patch side, pixels``)."""


def with_units(table: Table, records: Sequence, norm: str | None) -> Table:
    """``table`` (one row per file of ``records``, then any envelope row) with
    :data:`UNIT_COLUMN` after ``name`` when a norm is chosen or some radius is in another unit
    than ℓ2 (:func:`~.norms.radius_units`: a noise's ℓ1 or ℓ∞, a certifier's own unit; a file
    without a radius says the others' unit); ``table`` itself for ℓ2 files, so Cohen et al.'s
    tables read as they did."""
    units = radius_units(records, norm)
    if norm is None and set(units) <= {"l2"}:
        return table
    only = next(iter(units)) if len(units) == 1 else None
    shared = NORM_LABELS.get(only, only)
    values = [shared if shared is not None and "radius" not in r else radius_unit(r, norm)
              for r in records]
    values += [shared] * (len(table.rows) - len(values))  # the envelope row's
    return _inserted(table, UNIT_COLUMN, values)


def _unit_shown(norm: str | None, unit: str | None) -> bool:
    """Whether a table says its radii's unit: for a chosen norm, or any but ℓ2 (the default
    of every table before radii in every norm; None: no file has a radius)."""
    return norm is not None or unit not in (None, "l2")


def _inserted(table: Table, column: tuple, values: Sequence, at: int = 1) -> Table:
    """``table`` with ``column`` ((key, header, style)) at position ``at`` (after its first),
    holding ``values``."""
    def put(cells, value):
        return (*cells[:at], value, *cells[at:])

    return Table(*(put(cells, value) for cells, value in
                   zip((table.keys, table.headers, table.styles), column)),
                 rows=tuple(put(row, v) for row, v in zip(table.rows, values)))


DATASET_COLUMN = ("dataset", "dataset", "text")
"""(key, header, style) of the column a table gets when its files certify several datasets."""


def with_datasets(table: Table, records: Sequence) -> Table:
    """``table`` (one row per file of ``records``, then any envelope row) with the column
    :data:`DATASET_COLUMN` after ``name`` where the files certify more than one dataset split,
    and a one-line note saying so; ``table`` itself otherwise."""
    data = [data_split(r) for r in records]
    groups: dict = {}
    for r, d in zip(records, data):
        if d is not None:
            groups.setdefault(d, []).append(r.path)
    if len(groups) < 2:
        return table
    log.warning("note: the table mixes %d dataset splits (%s); its dataset column says which "
                "row is which", len(groups),
                "; ".join(f"{d}: {paths[0] if len(paths) == 1 else f'{len(paths)} files'}"
                          for d, paths in groups.items()))
    data += [None] * (len(table.rows) - len(data))
    return _inserted(table, DATASET_COLUMN, data)


def agreement_report(paths: Iterable, radii, fmt: str = "md", *, common: bool = False,
                     norm: str | None = None) -> str:
    """Compare record files pairwise, example by example (1st with 2nd, 3rd with 4th, ...).

    One row per pair: the two names, n, the fraction of (example, radius) pairs on which they
    agree, ACR(second) − ACR(first) with its paired standard error, then per radius ``a/b``:
    the examples only the first certifies there / only the second (see
    :class:`~smoothcert.evaluation.metrics.Agreement`). ``common``: each pair is compared on the
    examples both files hold. ``norm``: each file's radius in that norm, as :func:`report`'s;
    the files' radii must be in one unit (:func:`~.norms.one_unit`), said in the column
    :data:`UNIT_COLUMN` after ``second`` as :func:`with_units` says it.
    """
    formatter = get_format(fmt)
    check_norm(norm)
    radii = _radii(radii)
    paths = _paths_and_labels(paths)[0]
    if len(paths) % 2:
        raise SmoothcertError(f"--agreement compares files in pairs; got {len(paths)} files")
    records = in_norms(_labelled_records(paths), norm)
    unit = one_unit(records, norm, "--agreement")  # an ℓ1 minus an ℓ2 radius means nothing
    pairs = list(zip(records[::2], records[1::2]))
    for pair in pairs:
        _check_one_dataset(pair, "--agreement")
    if common:
        pairs = [common_examples(pair) for pair in pairs]
    for a, b in pairs:
        _check_same_idx(a, b)
    table = agreement_table([certified_agreement(a, b, radii) for a, b in pairs])
    if _unit_shown(norm, unit):
        table = _inserted(table, UNIT_COLUMN, [NORM_LABELS.get(unit, unit)] * len(pairs), at=2)
    return formatter(table)


def _check_same_idx(first, second) -> None:
    """The agreement compares two files example by example: they must hold the same idx."""
    a, b = set(first["idx"].tolist()), set(second["idx"].tolist())
    if a != b:
        raise SmoothcertError(
            f"{first.path} and {second.path} hold different examples ({len(a)} and {len(b)}, "
            f"{len(a & b)} in both); add --common to compare them on the examples both hold")


def agreement_table(agreements: Sequence[Agreement]) -> Table:
    radii = agreements[0].radii
    labels = [radius_label(r) for r in radii]
    return Table(
        keys=("first", "second", "n", "agreement", "acr_difference", "acr_difference_se",
              *labels),
        headers=("first", "second", "n", "agree", "ΔACR", "± SE", *labels),
        styles=("text", "text", "int", "percent", "signed3", "float3", *["text"] * len(radii)),
        rows=tuple((a.first, a.second, a.count, a.agreement, a.acr_difference,
                    a.acr_difference_se,
                    *(f"{f}/{s}" for f, s in zip(a.first_only, a.second_only)))
                   for a in agreements),
    )


def _radii(radii) -> tuple[float, ...]:
    """A sequence of floats, or a string for :func:`~smoothcert.evaluation.metrics.parse_radii`."""
    return parse_radii(radii) if isinstance(radii, str) else tuple(float(r) for r in radii)


def _labelled_records(paths) -> list:
    """Each file's records, named by :func:`~smoothcert.runs.records.distinct_labels`."""
    return [dataclasses.replace(read_records(p), label=label)
            for p, label in zip(*_paths_and_labels(paths))]


def _attack_files(records: Sequence) -> bool:
    """True if every file holds attack records, False if none; refuses a mixture."""
    kinds = [is_attack_records(r) for r in records]
    if any(kinds) and not all(kinds):
        attack = records[kinds.index(True)].path
        other = records[kinds.index(False)].path
        raise SmoothcertError(f"{attack} holds attack records but {other} does not; report "
                              "attack files and certification files separately")
    return all(kinds)


def _attack_report(records: Sequence, distances, plot) -> Table:
    table = attack_table([summarize_attack(r, distances) for r in records], distances)
    if plot is not None:
        from .plots import plot_attack_curve

        plot_attack_curve(records, plot)
    return table


def _paths_and_labels(paths, folders: bool = False) -> tuple[list, list[str]]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = list(paths)
    if not paths:
        raise SmoothcertError("report needs at least one file")
    return paths, distinct_labels(paths, strip_suffix=not folders)


def certification_table(summaries: Sequence[Summary], radii: Sequence[float]) -> Table:
    """One row per record file: name, n, clean acc, abstain, ACR, certified accuracy at radii.

    PREDICT files (no radius column) leave ACR and the radius columns empty. When a file comes
    from the memory-based certifier, an ``adjusted`` column counts the certificates it changed.
    When some file's σ varies over its rows (σ_x of data-dependent smoothing), the columns
    ``σ_x min``, ``σ_x mean``, ``σ_x max`` follow (a fixed-σ file: its σ three times; a file
    without a sigma column: empty); otherwise the table is as it was before those columns.
    """
    labels = [radius_label(r) for r in radii]
    table = Table(
        keys=("name", "n", "clean_accuracy", "abstention_rate", "acr", *labels),
        headers=("name", "n", "clean acc", "abstain", "ACR", *labels),
        styles=("text", "int", "percent", "percent", "float3", *["percent"] * len(radii)),
        rows=tuple((s.name, s.count, *_values(s)) for s in summaries),
    )
    if any(s.adjusted is not None for s in summaries):
        table = with_columns(table, [("adjusted", "adjusted", "int")],
                             [(s.adjusted,) for s in summaries])
    if any(s.sigma_varies for s in summaries):
        table = with_columns(table, SIGMA_COLUMNS, [s.sigma or (None,) * 3 for s in summaries])
    return table


SIGMA_COLUMNS = (("sigma_min", "σ_x min", "float4"), ("sigma_mean", "σ_x mean", "float4"),
                 ("sigma_max", "σ_x max", "float4"))
"""(key, header, style) of the per-example σ columns of :func:`certification_table` (four
decimals: at the paper's α_σ = 1e-4, σ_x often differs from σ only in the third)."""


def with_columns(table: Table, columns: Sequence[tuple], values: Sequence[tuple]) -> Table:
    """``table`` with ``columns`` ((key, header, style) each) appended; ``values[i]`` holds
    row i's values of them."""
    keys, headers, styles = zip(*columns)
    return Table(keys=(*table.keys, *keys), headers=(*table.headers, *headers),
                 styles=(*table.styles, *styles),
                 rows=tuple((*row, *extra) for row, extra in zip(table.rows, values)))


ENVELOPE = "envelope"  # the name of the σ-envelope row


def with_envelope(table: Table, envelope: Sequence[float], clean: float | None = None) -> Table:
    """``table`` (a :func:`certification_table`) plus the row ``envelope``: certified accuracy
    ``envelope[i]`` at each radius and ``clean``, the best clean accuracy over the files (for
    CERTIFY files, the envelope at radius 0); n, abstention and ACR stay empty (the envelope is
    not one classifier)."""
    row = (ENVELOPE, None, clean, None, None, *(float(v) for v in envelope))
    row += (None,) * (len(table.keys) - len(row))  # e.g. the memory certifier's ``adjusted``
    return dataclasses.replace(table, rows=(*table.rows, row))


def attack_table(summaries: Sequence[AttackSummary], distances: Sequence[float]) -> Table:
    """One row per attack record file: name, attack, n, clean acc, attacked, median and mean
    distance, and the attack curve (fraction of attacked examples flipped) at ``distances``."""
    keys = [distance_label(d) for d in distances]
    return Table(
        keys=("name", "attack", "n", "clean_accuracy", "attacked", "median_distance",
              "mean_distance", *keys),
        headers=("name", "attack", "n", "clean acc", "attacked", "median dist", "mean dist",
                 *(k.replace("<=", "≤") for k in keys)),
        styles=("text", "text", "int", "percent", "percent", "float3", "float3",
                *["percent"] * len(keys)),
        rows=tuple((s.name, s.attack, s.count, s.clean_accuracy, s.success_rate,
                    s.median_distance, s.mean_distance, *s.attacked_at) for s in summaries),
    )


# --------------------------------------------------------------------------- cell values
def radius_label(r: float) -> str:
    """``r=0.25``: the shortest decimal that reads back as ``r`` (1.0 → ``r=1``)."""
    return "r=" + np.format_float_positional(float(r), trim="-")


def distance_label(d: float) -> str:
    """``d<=0.25``: the attack-curve column of distance d."""
    return "d<=" + np.format_float_positional(float(d), trim="-")


def _values(s: Summary) -> list:
    """The row as numbers (fractions), None where a PREDICT file has no value."""
    cert = list(s.certified_accuracy) if s.has_radius else [None] * len(s.radii)
    return [s.clean_accuracy, s.abstention_rate, s.acr, *cert]
