"""Run PREDICT, CERTIFY or any registered certifier over a dataset; one record per example.

:func:`certify_dataset` is the one entry point, for Python users (any pixel-space module, any
map-style dataset) and for the CLI (a checkpoint and a registered dataset, through
:func:`run_dataset`). The runner owns everything around the algorithm: loading the model and
the examples (``inputs.py``), checking they fit, the global index list and this shard's part of
it, per-example generators seeded from (seed, idx), resuming, timing and progress (a bar, or a
plain line every 30 s off a terminal: ``progress.py``). A certifier (``certifiers/``) owns the
algorithm: a program that maps one input to one row. The runner drives the programs of many
inputs through the one engine; a certifier needs only its own file.

Identity and resuming. A record file's manifest stores the run's identity (:func:`run_identity`):
everything that determines its rows. ``batch`` is not part of it — the engine draws each
example's noise in canonical chunks of ``chunk`` draws (``sampling.CHUNK``), so the rows are
the same for every batch size — and neither is ``max_count``: the examples are a prefix of the
run's index list, which the manifest's ``indices`` records. A rerun with the same identity
resumes with any ``batch``, and with a ``max_count`` whose index list extends the file's (a
larger ``--max``, or none): it appends only the new examples and updates the manifest's
``indices`` to the new list, so that ``merge`` checks coverage against it. A smaller ``--max``
is refused (the file holds examples the run would not select).

Denoisers. ``certify_dataset(model, data, denoiser=SPEC)`` (or ``model`` a ``Denoised`` module)
certifies the classifier behind a denoiser: the identity then holds the denoiser's fingerprint
(``denoiser``) and, for a diffusion denoiser, its one-shot timestep t* (``timestep``). Both are
left out of the identity when there is no denoiser, so the files of runs without one keep their
identity; a rerun with another denoiser, or none, is refused.

A resumed run draws in the chunk size of its file (the identity's ``chunk``), whatever
``CHUNK`` is now: the rows already there were drawn so. Manifests of older versions, such as
those from before the chunks were fixed (their chunk was the run's ``batch``), are read through
:mod:`smoothcert.upgrade`, so everything here sees the current format.
"""

from __future__ import annotations

import dataclasses
import platform
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..certifiers import CERTIFIERS, Certifier, RunContext, build_certifier
from ..data.datasets import load_dataset
from ..errors import SmoothcertError, check_count, check_positive_finite, check_probability
from ..io import write_json_atomic
from ..models.checkpoint import versions
from ..noise.base import NOISES
from ..noise.tables import tables_behind
from ..smoothing.ablation import NO_NOISE, NoNoise
from ..smoothing.engine import CHUNK, BatchedVotes
from ..smoothing.probe import Tuning
from ..smoothing.smoothed import Smoothed, plain
from ..tensors import eval_mode
from ..upgrade import certifier_spelling
from ..version import git_sha
from .arguments import check_arguments
from .inputs import (
    Examples,
    ModelSource,
    as_examples,
    check_compatible,
    check_labels,
    check_source,
    checked_indices,
    checked_shard,
    denoiser_fields,
    load_source,
    resolved_engine,
    sigma_and_noise,
    split_denoised,
    with_denoiser,
)
from .notes import holding_notes, release_notes
from .progress import check_progress, progress_meter
from .records import (
    global_indices,
    manifest_path,
    open_records,
    read_manifest,
    read_records,
    shard_indices,
    shard_path,
)
from .roles import check_role_shapes, load_roles, role_fingerprints, roles_in_eval_mode
from .rows import LATER_COLUMNS, NoFile, no_records, python_row, run_rows, written
from .same_data import check_same_data, run_data_files
from .tasks import check_task
from .tuning import tuned


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines the rows of a run, and how it is run.

    The manifest's identity (:func:`run_identity`) is all of it but ``batch`` (noisy inputs per
    forward pass: the speed, not the rows) and ``max_count`` (the examples are a prefix of the
    index list; see the module doc). ``chunk`` is the draws per canonical noise chunk
    (``sampling.CHUNK``; a resumed file's own). ``certifier`` names the
    per-input program (:data:`~smoothcert.certifiers.CERTIFIERS`, the attack included); ``noise``
    the noise
    (:data:`~smoothcert.noise.NOISES`) at standard deviation ``sigma``; ``options`` the
    certifier's own settings, completed with its defaults, so that equal runs have equal
    identities. The certifier names from before noise was an axis (``uniform``,
    ``data-dependent-uniform``) are read through :func:`smoothcert.upgrade.certifier_spelling`.
    ``denoiser`` is the fingerprint of the denoiser in front of the classifier (None: none) and
    ``timestep`` a diffusion denoiser's one-shot timestep t* (None: not a diffusion denoiser).
    """

    certifier: str
    checkpoint_sha256: str
    dataset: str
    split: str
    sigma: float
    n: int
    alpha: float
    batch: int
    seed: int
    skip: int = 1
    max_count: int | None = None
    n0: int | None = None  # CERTIFY's selection draws; PREDICT has none
    device_type: str = "cpu"  # noise streams differ between CPU and CUDA generators
    options: dict = field(default_factory=dict)
    # The engine's non-default accelerations (``BatchedVotes.settings``); empty = float32 eager.
    # Only those that differ from the defaults: a default that changes keeps the identity.
    engine: dict = field(default_factory=dict)
    # An explicit list of dataset indices instead of skip/max (``certify_dataset(indices=...)``).
    indices: tuple[int, ...] | None = None
    noise: str = "gaussian"
    chunk: int = CHUNK  # draws per canonical noise chunk: changes the draws, so the rows
    denoiser: str | None = None  # the denoiser's fingerprint (DenoiserSource.sha256)
    timestep: int | None = None  # a diffusion denoiser's t*: fixed by sigma
    # an ensemble's members (their fingerprints, in order), mode and K-consensus (None: one model)
    ensemble: dict | None = None
    models: dict | None = None  # the certifier's other models: role → fingerprint (roles.py)

    def __post_init__(self):
        certifier, noise = _resolved_names(self.certifier, self.noise)
        object.__setattr__(self, "certifier", certifier), object.__setattr__(self, "noise", noise)
        if certifier_class(certifier).uses_noise:  # else σ is 0: no noise (_no_noise)
            check_positive_finite("sigma", self.sigma)
        check_count("n", self.n)
        check_probability("alpha", self.alpha), check_count("batch", self.batch)
        check_count("skip", self.skip), check_count("seed", self.seed, minimum=0)
        check_count("chunk", self.chunk)
        if self.max_count is not None:
            check_count("max", self.max_count)
        if certifier_class(certifier).needs_n0:
            check_count("n0", self.n0 if self.n0 is not None else 0)
        if self.split not in ("train", "test"):
            raise SmoothcertError(f"split must be 'train' or 'test', got {self.split!r}")
        object.__setattr__(self, "options", self.build_certifier().options())
        object.__setattr__(self, "engine", resolved_engine(self.engine))
        if self.indices is not None:
            object.__setattr__(self, "indices", checked_indices(self.indices))
        _check_denoiser(self)

    def build_certifier(self) -> Certifier:
        """A fresh instance of the run's certifier with its options (checked)."""
        return build_certifier(certifier_class(self.certifier), self.options)

    def run_indices(self, dataset_size: int) -> list[int]:
        """The run's global index list (before sharding): the explicit indices, or every
        ``skip``-th index, at most ``max_count`` of them."""
        if self.indices is None:
            return global_indices(dataset_size, self.skip, self.max_count)
        outside = [i for i in self.indices if i >= dataset_size]
        if outside:
            raise SmoothcertError(f"indices {outside[:5]} lie outside the dataset of "
                                  f"{dataset_size} examples")
        return list(self.indices)


def certifier_class(name: str) -> type[Certifier]:
    """The registered class of certifier ``name`` (the attack included); an unknown name is one
    SmoothcertError listing the known ones."""
    return CERTIFIERS[name]


def _resolved_names(certifier: str, noise: str) -> tuple[str, str]:
    """(certifier, noise) with an old certifier name upgraded; the noise checked against the
    certifier's."""
    certifier, noise = certifier_spelling(certifier, noise)
    cls = certifier_class(certifier)
    if not cls.uses_noise or noise == NO_NOISE:  # e.g. ablation: the identity says no noise
        if cls.uses_noise or noise != NO_NOISE:
            needs = "needs a" if cls.uses_noise else "draws no"
            raise SmoothcertError(f"certifier {certifier!r} {needs} noise; its run's noise "
                                  f"cannot be {noise!r}")
        return certifier, noise
    family = NOISES[noise].family  # an unknown name raises with the list of known ones
    if cls.noises is not None and family not in cls.noises:
        raise SmoothcertError(f"certifier {certifier!r} certifies with noise "
                              f"{', '.join(cls.noises)} only, not {noise!r}")
    return certifier, noise


def _check_denoiser(cfg: RunConfig) -> None:
    """The denoiser's fields, and a diffusion denoiser's fixed σ against the certifier's."""
    if cfg.denoiser is not None and (not isinstance(cfg.denoiser, str) or not cfg.denoiser):
        raise SmoothcertError(f"denoiser must be a fingerprint string, got {cfg.denoiser!r}")
    if cfg.timestep is None:
        return
    if cfg.denoiser is None:
        raise SmoothcertError("timestep is a diffusion denoiser's: pass its denoiser too")
    check_count("timestep", cfg.timestep, minimum=0)
    if certifier_class(cfg.certifier).varies_sigma:
        raise SmoothcertError(
            f"certifier {cfg.certifier!r} certifies each input at its own sigma, but a "
            f"diffusion denoiser denoises at the one timestep of sigma {cfg.sigma} "
            f"(t* = {cfg.timestep}); use a trained denoiser or another certifier")


def certify_dataset(
    model, dataset, *, sigma=None, noise: str | None = None, n0: int = 100, n: int = 100_000,
    alpha: float = 0.001, batch: int = 1000, seed: int = 0, skip: int = 1,
    max_count: int | None = None, indices=None, certifier: str = "certify",
    options: dict | None = None, out=None, shard: tuple[int, int] = (0, 1),
    num_classes: int | None = None, device=None, workers: int | None = None,
    engine: dict | None = None, progress: bool = False, denoiser=None, models=None,
    tune: Tuning | None = None,
) -> list[dict]:
    """Certify (or run any registered certifier on) every selected example of ``dataset``.

    ``model``: a checkpoint path, any ``nn.Module`` mapping pixels in [0, 1] (B, C, H, W) to
    logits (its normalization inside), or an ensemble (an ``Ensemble``, or a list of checkpoint
    paths); ``dataset``: any map-style dataset of ``(x (C, H, W) float in [0, 1], y int)`` (an x
    outside [0, 1] is warned about once per run: its radii are in x's units). ``sigma``: a
    float or a noise object (``Gaussian(0.25)``, ``Laplace(0.25)``; default: the checkpoint's);
    ``noise`` names the noise (``smoothcert.noise.NOISES``; default: the noise object's, else
    the checkpoint's, else Gaussian). The examples are every ``skip``-th index, at most
    ``max_count`` (or the explicit ``indices``), then every K-th of them from k for ``shard`` =
    (k, K); example ``idx`` draws its noise from a generator seeded from (``seed``, idx) in
    canonical chunks, so the rows depend on neither ``batch``, sharding nor resuming. Numbers
    may be numpy's; a wrong argument or a label outside [0, num_classes) is one SmoothcertError.

    With ``out`` the rows go to its record file (shard K > 1: its shard name) and manifest, as
    ``smoothcert certify`` writes them; a rerun resumes (a larger ``max_count`` adds only the
    new examples), another configuration is refused. Returns the rows (with ``out``: the
    file's, resumed ones included) as dicts of plain Python values, ready for ``json.dumps``
    (a vector column, e.g. a segmentation's per-class ``tp``, as a list: :func:`.python_row`).
    For the default certifier each certificate holds with probability ≥ 1 − ``alpha`` (Cohen
    et al., Thm. 1); ``predict`` −1 is an abstention.

    ``progress``: False, True, ``"bar"`` or ``"lines"`` (a line every 30 s). ``denoiser`` (a
    checkpoint, ``"diffusers:FOLDER"``: one step at the t* of ``sigma``, or a module) goes in
    front of the classifier, as in a ``Denoised`` ``model``. ``options``: the certifier's
    (``{"th": 0.5}``); ``models``: its other models by role (:mod:`.roles`); ``tune``
    measures the batch before the first row (:mod:`.tuning`).
    """
    check_arguments(models, options, engine, tune, device, indices)
    with holding_notes():  # notes are logged once every check has passed (.notes)
        model, denoiser = split_denoised(model, denoiser)
        source, data = load_source(model, device, plain(num_classes)), as_examples(dataset)
        counts = dict(n0=n0, n=n, alpha=alpha, batch=batch, seed=seed, skip=skip,
                      max_count=max_count)
        cfg, source = _api_config(source, data, denoiser, certifier, noise, sigma, counts,
                                  options, engine, indices)
        roles = load_roles(models, cfg.build_certifier(), source.device)
        cfg = dataclasses.replace(cfg, models=role_fingerprints(roles))
        return execute(cfg, source, data, out, shard=checked_shard(shard), workers=workers,
                       progress=progress, roles=roles, tune=tune)


def _api_config(source: ModelSource, data: Examples, denoiser, certifier: str, noise, sigma,
                counts: dict, options, engine, indices) -> tuple[RunConfig, ModelSource]:
    """:func:`certify_dataset`'s run configuration, and its model behind the denoiser: the
    certifier's name upgraded, σ and the noise from the arguments or the checkpoint, then the
    denoiser (a diffusion denoiser's t* is σ's); n0 dropped for a certifier that takes none."""
    certifier, noise = certifier_spelling(certifier, noise)
    if not certifier_class(certifier).needs_n0:  # an unknown name raises, listing the known
        counts = {**counts, "n0": None}
    if certifier_class(certifier).uses_noise:
        sigma, noise = sigma_and_noise(plain(sigma), noise, source,
                                       denoised=denoiser is not None)
    else:
        sigma, noise = _no_noise(certifier, sigma, noise)
    source = with_denoiser(source, denoiser, sigma, noise)
    return _dataset_config(source, data, certifier, noise, sigma, counts, options, engine,
                           indices), source


def _no_noise(certifier: str, sigma, noise) -> tuple[float, str]:
    """σ 0 and noise "none" for a certifier that draws no noise (``uses_noise`` False, e.g.
    ablation smoothing); a σ or a noise given is refused, since it would change nothing."""
    if sigma is not None or noise is not None:
        raise SmoothcertError(f"certifier {certifier!r} draws no noise: drop --sigma and "
                              "--noise")
    return 0.0, NO_NOISE


def _dataset_config(source: ModelSource, data: Examples, certifier: str, noise: str,
                    sigma: float, counts: dict, options, engine, indices) -> RunConfig:
    """:func:`certify_dataset`'s run configuration: its numbers as plain Python numbers (numpy
    scalars are numbers too), the model's fingerprints (classifier, denoiser, ensemble)."""
    return RunConfig(
        certifier=certifier, checkpoint_sha256=source.sha256, dataset=data.name, split=data.split,
        sigma=sigma, **{k: plain(v) for k, v in counts.items()},
        device_type=source.device.type, options=dict(options or {}), engine=dict(engine or {}),
        indices=tuple(map(plain, indices)) if indices is not None else None, noise=noise,
        **denoiser_fields(source), ensemble=source.ensemble,
    )


def run_dataset(
    cfg: RunConfig, checkpoint, out, *, shard=(0, 1), device="cpu", data_root=None,
    progress=True, workers: int | None = None, image_size: int | None = None, denoiser=None,
) -> Path:
    """Run ``cfg`` on this shard of ``cfg.dataset``'s split with the model of ``checkpoint``
    (behind ``denoiser``, whose fingerprint must be ``cfg.denoiser``), appending to (or
    resuming) its record file; returns that file's path (``out`` itself, or its shard name when
    there are shards). See :func:`smoothcert.certify_dataset`."""
    with holding_notes():  # said once the run is checked (notes.py)
        source = with_denoiser(load_source(checkpoint, device), denoiser, cfg.sigma, cfg.noise)
        dataset = load_dataset(cfg.dataset, cfg.split, data_root=data_root,
                               image_size=image_size)
        execute(cfg, source, as_examples(dataset), out, shard=shard, workers=workers,
                progress=progress)
    return shard_path(out, *shard)


def execute(cfg: RunConfig, source: ModelSource, data: Examples, out, *, shard=(0, 1),
            workers: int | None = None, progress: bool = False, roles=None,
            tune: Tuning | None = None) -> list[dict]:
    """The rows of ``cfg`` on this shard's examples of ``data``; with ``out`` each row is also
    appended (fsynced) to the shard's record file, resuming after the rows already there, and
    the rows returned are the file's, as dicts of plain Python scalars (:func:`python_row`).
    ``roles``: the certifier's other models (role → ModelSource; :mod:`.roles`).
    Everything is checked before the file is opened; ``tune`` then measures the batch
    (:mod:`.tuning`), and the notes are held until the certifier has started (:mod:`.notes`: a
    run refused by its file, or by the certifier's start, is an error alone)."""
    roles = dict(roles or {})
    cfg.build_certifier().check_models(frozenset(roles))  # run_dataset: a role it needs
    check_role_shapes(roles, data)
    certifier, noise, mine = _checked_run(cfg, source, data, shard, workers, progress)
    certifier.check_sources(roles, source.num_classes)  # e.g. ACES: a 2-class selection
    path = shard_path(out, *shard) if out is not None else None
    cfg = _file_chunk(cfg, path)
    tables = tables_behind(noise, data.example(mine[0])[0].numel()) \
        if mine and "radius" in record_columns(cfg) else []  # the tables its radii come from
    writer, done = _open(path, cfg, source, shard, len(data), run_data_files(data.dataset),
                         tables)
    smoothed = Smoothed(source.model, noise, source.num_classes,
                        BatchedVotes(**cfg.engine, chunk=cfg.chunk))
    previous = read_records(path) if path is not None else no_records(record_columns(cfg))
    todo = [i for i in mine if i not in done]
    with writer, eval_mode(source.model), roles_in_eval_mode(roles):
        if todo and tune is not None:  # before the bar: its lines come first
            draws = len(todo) * ((cfg.n0 or 0) + cfg.n)
            cfg = tuned(cfg, smoothed, data.example(todo[0])[0], draws, tune)
        run = RunContext(cfg, smoothed, data, previous, source.device, roles)
        certifier.start(run)  # e.g. data-dependent: its memory rebuilt from the file's rows
        release_notes()  # every check passed, the file was accepted: the notes are said
        name = path.name if path is not None else data.name
        stream = data.stream(todo, workers, num_classes=source.num_classes)
        with progress_meter(progress, len(mine), len(mine) - len(todo),
                            f"{cfg.certifier} {name}") as bar:
            produced = written(writer, bar, run_rows(certifier, run, stream))
    done_rows = read_records(path).rows() if path is not None else produced
    return [python_row(row) for row in done_rows]


def _checked_run(cfg: RunConfig, source: ModelSource, data: Examples, shard, workers,
                 progress) -> tuple[Certifier, object, list[int]]:
    """The run's certifier, noise and this shard's indices, once every check has passed (and
    the certifier's notes are said): nothing is opened or written before."""
    check_source(source, cfg)
    certifier = cfg.build_certifier()
    check_task(certifier, source, data)  # before the classes: a task's mismatch says it
    check_compatible(source, data)
    check_progress(progress)
    if workers is not None:
        check_count("workers", workers, minimum=0)
    mine = shard_indices(cfg.run_indices(len(data)), *shard)
    _check_shardable(cfg, certifier, shard)
    certifier.check(cfg)  # e.g. sequential's grid: refused before the record file exists
    certifier.check_model(source.model, data.input_shape)  # e.g. ablation's encoding
    noise = NOISES[cfg.noise](cfg.sigma) if cfg.noise != NO_NOISE else NoNoise()
    if mine:  # e.g. the sound noises' 8-bit grid: refused before the file is opened
        noise.check_input(data.example(mine[0])[0])
    check_labels(data, mine, source.num_classes)  # a row with label -1 would poison the file
    return certifier, noise, mine


def _file_chunk(cfg: RunConfig, path) -> RunConfig:
    """``cfg`` with the chunk size of the existing record file at ``path``: a resumed run draws
    as the file's rows were drawn. A chunk that is not an integer >= 1 is refused."""
    old = read_manifest(path) if path is not None and path.exists() else None
    chunk = ((old or {}).get("identity") or {}).get("chunk")
    if chunk is None or chunk == cfg.chunk:
        return cfg
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise SmoothcertError(f"{manifest_path(path)}: identity chunk must be an integer >= 1, "
                              f"got {chunk!r}")
    return dataclasses.replace(cfg, chunk=chunk)


def _open(path, cfg: RunConfig, source: ModelSource, shard, dataset_size: int,
          files: dict | None = None, tables: list = ()):
    """The record writer and the indices already done; a writer that keeps nothing without a
    file. A run that extends the file's index list updates its manifest's ``indices``; a file
    made from other data (``files``) is refused (:func:`.same_data.check_same_data`). A new
    file's manifest names the radius ``tables`` (:func:`~smoothcert.noise.tables.tables_behind`)."""
    if path is None:
        return NoFile(record_columns(cfg)), set()
    manifest = _manifest(cfg, source, shard, dataset_size)
    if tables:
        manifest["radius_tables"] = list(tables)
    if files is not None:  # which data files were read (provenance: the data may move)
        manifest["provenance"]["data_files"] = files
    old = read_manifest(path) if path.exists() else None
    if old is not None and old.get("identity") == manifest["identity"]:  # else refused below
        check_same_data(path, old, files)  # before the index list: a folder's size changed
    extends = old is not None and old.get("indices") != manifest["indices"]
    if extends and old.get("identity") == manifest["identity"]:  # else open_records refuses
        _check_extends(path, old, manifest)
    writer, done = open_records(path, record_columns(cfg, old), manifest)
    if extends:  # the lock is held: the manifest now names the extended index list
        write_json_atomic(manifest_path(path), {**old, "indices": manifest["indices"]})
    return writer, done


def _check_extends(path: Path, old: dict, new: dict) -> None:
    """The new index list must start with the file's: same examples, possibly more."""
    before, after = old.get("indices"), new["indices"]
    if "explicit" in after or not isinstance(before, dict):
        return  # explicit indices are in the identity, compared by open_records
    try:
        kept = global_indices(before["dataset_size"], before["skip"], before["max_count"])
    except (KeyError, TypeError) as err:
        raise SmoothcertError(f"{manifest_path(path)}: unreadable indices {before!r}") from err
    wanted = global_indices(after["dataset_size"], after["skip"], after["max_count"])
    if wanted[:len(kept)] != kept:
        had = before.get("max_count")
        raise SmoothcertError(
            f"{path} holds the first {len(kept)} examples (--max {had}); a resumed run may "
            f"raise --max or drop it, not lower it: pass --max {had} or more, or another --out")


def record_columns(cfg: RunConfig, old_manifest: dict | None = None) -> tuple:
    """The certifier's columns; an ensemble's files add ``member_passes`` (its members' forward
    passes per example). A file written before a column it would have now (``member_passes``,
    the radius in every norm: :data:`~smoothcert.certifiers.columns.RADIUS_COLUMNS`) resumes
    without it, so that its header and its rows stay one format."""
    columns = tuple(certifier_class(cfg.certifier).columns)
    if cfg.ensemble is not None:
        columns = (*columns, "member_passes")
    if old_manifest is None:
        return columns
    had = set(old_manifest.get("columns") or ())
    return tuple(c for c in columns if c in had or c not in LATER_COLUMNS)


def _check_shardable(cfg: RunConfig, certifier: Certifier, shard) -> None:
    if shard[1] > 1 and not certifier.shardable():
        raise SmoothcertError(
            f"certifier {cfg.certifier!r} with options {cfg.options} needs every input in one run "
            "and order; run it without --num-shards"
        )


def run_identity(cfg: RunConfig) -> dict:
    """The run's identity (see the module doc), as JSON reads it back: every field of ``cfg``
    but ``batch`` and ``max_count``, and ``denoiser``, ``timestep``, ``ensemble`` and ``models``
    where they are None (so runs of one model without a denoiser keep the identity they had
    before)."""
    fields = dataclasses.asdict(cfg)
    del fields["batch"], fields["max_count"]
    for name in ("denoiser", "timestep", "ensemble", "models"):
        if fields[name] is None:
            del fields[name]
    if fields["indices"] is not None:
        fields["indices"] = list(fields["indices"])
    return fields


def _manifest(cfg: RunConfig, source: ModelSource, shard, dataset_size: int) -> dict:
    """The manifest of a new record file (``open_records`` adds its columns and format)."""
    indices = {"dataset_size": dataset_size, "skip": cfg.skip, "max_count": cfg.max_count}
    if cfg.indices is not None:
        indices["explicit"] = list(cfg.indices)
    denoiser = {"denoiser": source.denoiser.label} if source.denoiser is not None else {}
    return {
        "identity": run_identity(cfg),
        # outside the identity (files written before it resume): the readers' class bound
        "num_classes": source.num_classes,
        "shard": {"index": shard[0], "count": shard[1]},
        "indices": indices,
        "provenance": {
            "checkpoint": source.label,
            **denoiser,
            "device": str(source.device),
            "host": socket.gethostname(),
            "platform": platform.platform(),
            "versions": versions(),
            "git_sha": git_sha(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
    }
