"""The one upgrade path for files and spellings from older smoothcert versions.

Three kinds of files carry a format version, under the key ``format_version``: record manifests
(``FILE.tsv.manifest.json``), training configs (recipes, a run's ``config.yaml``, the config in a
checkpoint's meta) and checkpoints. Files written before Step 11 carry none (checkpoints carried
version 1 from the start); their version is read from their shape. Reading a file upgrades it in
memory through a chain of small functions, one per version step (k → k+1), each saying what
changed and when; a file on disk is never rewritten by reading it. The rest of the package sees
only the current formats: :func:`upgrade_manifest` (with :func:`upgrade_header` for a record
file's header), :func:`upgrade_config` and
:func:`upgrade_checkpoint` are called where those files are read (``runs/records.py``,
``training/config.py`` and ``training/recipes.py``, ``models/checkpoint.py``).

The old spellings a user types — the certifier names ``uniform`` and ``data-dependent-uniform``,
the ``dd_*`` keywords of ``TrainConfig`` and the ``--dd-*`` flags of ``smoothcert train`` — go
through here too: they keep working, and each use logs one deprecation line naming the new
spelling (``CHANGELOG.md``). Old files are upgraded silently: they are data, not requests.

Pure functions on dicts; this module imports only ``errors.py``, so every layer may call it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from .errors import SmoothcertError

log = logging.getLogger(__name__)

VERSION_KEY = "format_version"  # the current versions: MANIFEST_, CONFIG_, CHECKPOINT_VERSION

OLD_CERTIFIER_NAMES = {"uniform": ("certify", "uniform"),
                       "data-dependent-uniform": ("data-dependent", "uniform")}
"""Certifier names from before noise was an axis (Step 7) -> (certifier, noise)."""

OLD_SIGMA_PARAMS = {"dd_steps": "num_steps", "dd_step_size": "step_size",
                    "dd_num_samples": "num_samples", "dd_start_epoch": "start_epoch"}
"""The data-dependent σ mode's parameters as configs named them before Step 7 (top-level
``dd_*`` keys) -> their names in ``sigma_mode_params``."""
DATA_DEPENDENT = "data_dependent"  # the σ mode the dd_* keys belong to


# --------------------------------------------------------------------------- the chains
def _climb(obj: dict, version: int, steps: tuple[Callable[[dict], dict], ...], what: str,
           where: str) -> dict:
    """``obj`` of ``version`` upgraded step by step (``steps[k - 1]``: k → k + 1) to the last
    version, each step's result stamped with its version; a new dict, stamped also when it was
    current. A newer version than this smoothcert knows, and a file a step cannot read, are one
    SmoothcertError naming ``where``."""
    current = len(steps) + 1
    if version > current:
        raise SmoothcertError(f"{where}: {what} format version {version} is newer than this "
                              f"smoothcert reads ({current}); upgrade smoothcert")
    for k in range(version, current):
        try:
            obj = {**steps[k - 1](obj), VERSION_KEY: k + 1}
        except (KeyError, TypeError, AttributeError, SmoothcertError) as err:
            raise SmoothcertError(f"{where}: cannot read this version-{k} {what} "
                                  f"({_said(err)}); the file is damaged") from err
    return {**obj, VERSION_KEY: current}


def _said(err: Exception) -> str:
    return str(err) if isinstance(err, SmoothcertError) else f"{type(err).__name__}: {err}"


def _stated_version(obj: Mapping, what: str, where: str) -> int | None:
    """The version ``obj`` states, or None where it states none."""
    if VERSION_KEY not in obj:
        return None
    version = obj[VERSION_KEY]
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise SmoothcertError(f"{where}: {what} {VERSION_KEY} must be an integer >= 1, "
                              f"got {version!r}")
    return version


# --------------------------------------------------------------------------- record manifests
def manifest_version(manifest: Mapping, where: str = "manifest") -> int:
    """The format version of a record manifest: the one it states, else 1 for an identity that
    holds ``batch`` (before Step 8), else 2."""
    stated = _stated_version(manifest, "record manifest", where)
    if stated is not None:
        return stated
    identity = manifest.get("identity")
    return 1 if isinstance(identity, Mapping) and "batch" in identity else 2


def upgrade_manifest(manifest: dict, where: str = "manifest") -> dict:
    """A record manifest of any version, as version :data:`MANIFEST_VERSION` (a new dict).

    A grad-norm file's manifest (``kind`` ``grad-norms``, ``evaluation/analysis.py``; since
    version 4 the only manifest with a ``kind``) is not a run's: its identity is its own, with
    its own versions (:data:`GRAD_NORMS_VERSION`). A
    manifest without an identity, which every reader refuses, is returned as it is."""
    if not isinstance(manifest.get("identity"), dict):
        return manifest  # damaged: refused where it is used, with the file's name
    if manifest.get("kind") == "grad-norms":
        version = _stated_version(manifest, "grad-norm manifest", where) or 1
        return _climb(manifest, version, _GRAD_NORMS_STEPS, "grad-norm manifest", where)
    version = manifest_version(manifest, where)
    return _climb(manifest, version, _MANIFEST_STEPS, "record manifest", where)


def _manifest_1_to_2(manifest: dict) -> dict:
    """Version 1 → 2, Step 8 (6460835, 2026-11-23): noise in fixed chunks.

    Until then the engine drew each example's noise in chunks of the run's ``--batch``, and the
    identity held every RunConfig field, ``batch`` (the rows depend on it) and ``max_count``
    included. Since, it holds ``chunk``, the draws per chunk, and neither: a version-1 file's
    chunk is its batch (a resumed run goes on drawing those chunks), and ``max_count`` lives in
    ``indices``, where it always was, so the file may grow with a larger ``--max`` like any
    other. The first files, from before the certifier registry (9617c1a, 2026-11-22), hold no
    ``options``: their certifiers had none."""
    identity = dict(manifest["identity"])
    batch = identity.pop("batch")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise SmoothcertError(f"identity batch must be an integer >= 1, got {batch!r}")
    identity.pop("max_count", None)
    identity.setdefault("options", {})
    return {**manifest, "identity": {**identity, "chunk": batch}}


def _manifest_2_to_3(manifest: dict) -> dict:
    """Version 2 → 3, Step 11: the identity names every axis, and the manifest its version.

    Each axis added to the identity was left out where it had the value every earlier file had,
    so that those files kept resuming: ``noise`` when Gaussian (noise became an axis in Step 7,
    41d9612, 2026-11-23), ``engine`` when at its defaults (9c05d97, 2026-11-22), ``indices``
    when the run took every ``skip``-th example; and a run with uniform noise of the CERTIFY or
    the data-dependent certifier kept the certifier name it had before Step 7 (``uniform``,
    ``data-dependent-uniform``; :data:`OLD_CERTIFIER_NAMES`). Version 3 states all of them:
    ``task`` is the certifier, ``noise`` its noise, and ``kind`` is ``task``."""
    identity = dict(manifest["identity"])
    task, implied = OLD_CERTIFIER_NAMES.get(identity.get("task"), (identity.get("task"), None))
    identity["task"] = task
    identity["noise"] = identity.get("noise") or implied or "gaussian"
    identity.setdefault("engine", {})
    identity.setdefault("indices", None)
    return {**manifest, "kind": task, "identity": identity}


def _manifest_3_to_4(manifest: dict) -> dict:
    """Version 3 → 4, Step 11: one name, ``certifier``, for the run's per-input program.

    Until then the program had four names: ``RunConfig.task`` (the identity's ``task``), the
    manifest's ``kind`` (always equal to it), ``--certifier`` and a second registry for the
    attack. Since, the attack is a certifier that certifies nothing, the identity names the
    program ``certifier``, and a run's manifest has no ``kind``: a grad-norm manifest's
    ``kind`` (``grad-norms``) is the one left, and it never reaches this chain. The rows are
    unchanged, so a version-3 file resumes."""
    identity = dict(manifest["identity"])
    identity["certifier"] = identity.pop("task")
    rest = {k: v for k, v in manifest.items() if k != "kind"}
    return {**rest, "identity": identity}


OLD_PREDICT_COLUMNS = {"count": "nA", "runner_up": "nB"}
"""PREDICT's vote-count columns before version 5 -> their names since (:func:`_manifest_4_to_5`)."""


def _manifest_4_to_5(manifest: dict) -> dict:
    """Version 4 → 5, Step 15: PREDICT's vote counts are ``nA`` and ``nB``.

    Until then a PREDICT file named the votes of its top two classes ``count`` and
    ``runner_up``, while the runner-up and L-bound certifiers' ``runner_up`` is a class: one
    name, two meanings. Since, PREDICT names them as Cohen et al.'s Algorithm PREDICT does
    (n_A, n_B: the counts its binomial test compares), so ``nA`` is the top class's votes and
    ``nB`` the runner-up's votes in every file that has them (the runner-up certifier's
    ``nB`` already was), and ``runner_up`` is always a class. The rows are unchanged; the
    header of such a file on disk keeps the old names and reads through
    :func:`upgrade_header`."""
    if manifest["identity"].get("certifier") != "predict" or \
            not isinstance(manifest.get("columns"), list):
        return manifest
    return {**manifest, "columns": upgrade_header(manifest["columns"])}


def upgrade_header(header):
    """A record file's column names in today's spelling (a tuple or list, as given): a PREDICT
    header from before manifest version 5 (``count``, ``runner_up`` beside ``pvalue``: no
    other file has that triple) names its vote counts ``nA`` and ``nB``. Keyed on the header,
    not the manifest's version, because a file's header is never rewritten: a file grown by a
    later version (a larger ``--max``) has a current manifest above its old header."""
    if "pvalue" not in header or not set(OLD_PREDICT_COLUMNS) <= set(header):
        return header
    return type(header)(OLD_PREDICT_COLUMNS.get(name, name) for name in header)


DSRS_OPTIONS_6 = {"q": "ball", "th": "x", "q_scale": 0.8, "q_share": 0.5, "alpha_split": 0.5,
                  "bounds": "lower", "count": "selection", "tol": 1e-4}
"""The dsrs certifier's options in version 6, at the values a version-5 file's run had."""


def _manifest_5_to_6(manifest: dict) -> dict:
    """Version 5 → 6, Step 20: the dsrs certifier's options.

    Until then ``dsrs`` took the Gaussian only, with Q its ball, and the options ``th`` (default
    ``x``), ``q_share``, ``alpha_split``, ``search`` and ``unit`` (its radius search). Since, it
    also takes the generalized Gaussian and Q of another scale (``q``, ``q_scale``), the
    authors' ``x+`` (the new default), ``bounds`` and ``count``, and ``tol`` replaces
    ``search`` and ``unit``: the Gaussian with its ball keeps the same computation at the old
    defaults (precise, 0.01), which are dropped here. A version-5 file's identity gets the new
    options at the values its run had, so it reads and resumes. (A file made with
    ``search=grid`` resumes with the precise search for its new rows: both radii are sound,
    grid's at most one step lower.) Other certifiers' files are unchanged."""
    identity = manifest["identity"]
    if identity.get("certifier") != "dsrs" or not isinstance(identity.get("options"), dict):
        return manifest
    kept = {k: v for k, v in identity["options"].items() if k not in ("search", "unit")}
    return {**manifest, "identity": {**identity, "options": {**DSRS_OPTIONS_6, **kept}}}


_MANIFEST_STEPS = (_manifest_1_to_2, _manifest_2_to_3, _manifest_3_to_4, _manifest_4_to_5,
                   _manifest_5_to_6)
MANIFEST_VERSION = len(_MANIFEST_STEPS) + 1
# Grad-norm manifests (46c8849, 2026-11-22) have one layout so far: version 1, stated since
# Step 11. Their first change adds its step here.
_GRAD_NORMS_STEPS: tuple[Callable[[dict], dict], ...] = ()
GRAD_NORMS_VERSION = len(_GRAD_NORMS_STEPS) + 1


# --------------------------------------------------------------------------- training configs
def config_version(config: Mapping, where: str = "config") -> int:
    """The format version of a training config (a recipe, a ``config.yaml``, a checkpoint's
    config): the one it states, else 1 (every config before Step 11)."""
    stated = _stated_version(config, "config", where)
    return 1 if stated is None else stated


def upgrade_config(config: Mapping, where: str = "config", version: int | None = None) -> dict:
    """A training config of any version (``version``, default: its own) as version
    :data:`CONFIG_VERSION`, with its ``format_version``; a new dict. Values are not checked
    here: ``TrainConfig`` does that."""
    if version is None:
        version = config_version(config, where)
    return _climb(dict(config), version, _CONFIG_STEPS, "config", where)


def _config_1_to_2(config: dict) -> dict:
    """Version 1 → 2, Step 11: the σ-mode keys, and the config's version.

    Configs carried no version before Step 11. From data-dependent training (c8e3aba,
    2026-11-22) to Step 7 (41d9612, 2026-11-23) they stored the data-dependent σ mode's
    parameters as the top-level keys ``dd_steps``, ``dd_step_size``, ``dd_num_samples`` and
    ``dd_start_epoch``, under every σ mode; since, that mode's ``sigma_mode_params``. The
    ``dd_*`` keys move there under ``sigma_mode: data_dependent`` and are dropped under another
    mode, which ignored them. Fields added over version 1's life (``sigma_mode``, ``noise``,
    ``train_size``, ``init_checkpoint``, ``arch_kwargs``, ``image_size``) are absent from the
    configs written before them; their defaults are what those runs did, so none is added."""
    return _sigma_keys_moved(config)


_CONFIG_STEPS = (_config_1_to_2,)
CONFIG_VERSION = len(_CONFIG_STEPS) + 1


def _sigma_keys_moved(fields: dict) -> dict:
    """``fields`` with its ``dd_*`` keys (those not None) folded into ``sigma_mode_params``
    when its σ mode is the data-dependent one, else dropped. An old and a new spelling of one
    parameter that disagree are refused."""
    rest = {k: v for k, v in fields.items() if k not in OLD_SIGMA_PARAMS}
    given = {OLD_SIGMA_PARAMS[k]: v for k, v in fields.items()
             if k in OLD_SIGMA_PARAMS and v is not None}
    params = rest.get("sigma_mode_params")
    if not given or fields.get("sigma_mode") != DATA_DEPENDENT or \
            not isinstance(params, (Mapping, type(None))):
        return rest  # nothing to move, ignored by the mode, or a bad mapping TrainConfig refuses
    params = dict(params or {})
    clash = sorted(k for k in set(given) & set(params) if given[k] != params[k])
    if clash:
        old = {new: old for old, new in OLD_SIGMA_PARAMS.items()}
        said = "; ".join(f"{old[k]}={given[k]!r} vs sigma_mode_params {k}={params[k]!r}"
                         for k in clash)
        raise SmoothcertError(f"old and new spelling of a σ-mode parameter disagree ({said}); "
                              "give each parameter once")
    return {**rest, "sigma_mode_params": {**given, **params}}


# --------------------------------------------------------------------------- checkpoints
def upgrade_checkpoint(obj: dict, where: str = "checkpoint") -> dict:
    """A smoothcert checkpoint (the dict ``torch.load`` returns; its ``format`` already checked)
    of any version as version :data:`CHECKPOINT_VERSION`, and the training config in its meta
    as the current config (an imported checkpoint's config holds the import's settings instead
    and is kept). A new outer dict; tensors are shared, not copied."""
    version = _stated_version(obj, "checkpoint", where)
    if version is None:
        raise SmoothcertError(f"{where}: the checkpoint states no {VERSION_KEY}; it is corrupt")
    obj = _climb(obj, version, _CHECKPOINT_STEPS, "checkpoint", where)
    meta = obj["meta"]
    if "imported_from" not in meta and isinstance(meta.get("config"), Mapping):
        meta = {**meta, "config": upgrade_config(meta["config"], f"{where} (its config)")}
    return {**obj, "meta": meta}


def _checkpoint_1_to_2(obj: dict) -> dict:
    """Version 1 → 2, Step 11: what version 1 gained over its life is always there.

    Version 1 (from the first checkpoints, d35ce7e, 2026-11-22) kept its layout while its
    contents grew: ``train_state["per_example_sigma"]`` arrived with data-dependent training
    (c8e3aba, 2026-11-22; before it every run trained at one σ: None), ``meta["num_hparams"]``
    with ``report --train`` (83ffdf8, 2026-11-22: the method's hyperparameter count, the length
    of ``meta["method"]["hparams"]``), and the config in the meta gained its own
    ``format_version`` in Step 11 (upgraded by :func:`upgrade_checkpoint` whatever the
    checkpoint's version). Version 2 always has the first two."""
    meta = dict(obj["meta"])
    hparams = (meta.get("method") or {}).get("hparams")
    if "num_hparams" not in meta and isinstance(hparams, Mapping):
        meta["num_hparams"] = len(hparams)
    state = obj.get("train_state")
    if isinstance(state, Mapping):
        state = {"per_example_sigma": None, **state}
    return {**obj, "meta": meta, "train_state": state}


_CHECKPOINT_STEPS = (_checkpoint_1_to_2,)
CHECKPOINT_VERSION = len(_CHECKPOINT_STEPS) + 1


# --------------------------------------------------------------------------- old spellings
def _deprecated(old: str, new: str) -> None:
    """The one line on stderr (a logging warning) for one use of an old spelling."""
    log.warning("deprecated: %s; use %s (see CHANGELOG.md)", old, new)


def certifier_spelling(name: str, noise: str | None) -> tuple[str, str | None]:
    """(certifier, noise) for a certifier name as given: an old name (:data:`OLD_CERTIFIER_NAMES`)
    becomes its certifier and noise, with one deprecation line; a noise that contradicts the
    old name's (other than the default Gaussian) is refused. Other names pass unchanged."""
    if name not in OLD_CERTIFIER_NAMES:
        return name, noise
    certifier, implied = OLD_CERTIFIER_NAMES[name]
    if noise not in (None, "gaussian", implied):
        raise SmoothcertError(f"certifier {name!r} already implies noise {implied!r}, not "
                              f"{noise!r}; use --certifier {certifier} --noise {noise}")
    _deprecated(f"certifier name {name!r}",
                f"certifier {certifier!r} with noise {implied!r} "
                f"(--certifier {certifier} --noise {implied})")
    return certifier, implied


def sigma_flags(fields: dict) -> dict:
    """``smoothcert train``'s fields with the ``--dd-*`` flags' values (keys ``dd_*``) folded
    into ``sigma_mode_params``, with one deprecation line naming ``--sigma-param``."""
    return _old_sigma_spelling(fields, lambda k, v: f"--{k.replace('_', '-')} {v}",
                               lambda k, v: f"--sigma-param {OLD_SIGMA_PARAMS[k]}={v}")


def sigma_keywords(fields: dict) -> dict:
    """``TrainConfig``'s keyword arguments with the ``dd_*`` ones folded into
    ``sigma_mode_params``, with one deprecation line naming it."""
    return _old_sigma_spelling(fields, lambda k, v: f"TrainConfig({k}={v!r})",
                               lambda k, v: f"sigma_mode_params={{{OLD_SIGMA_PARAMS[k]!r}: "
                                            f"{v!r}}}")


def _old_sigma_spelling(fields: dict, old: Callable, new: Callable) -> dict:
    used = {k: fields[k] for k in OLD_SIGMA_PARAMS if fields.get(k) is not None}
    if used:
        ignored = "" if fields.get("sigma_mode") == DATA_DEPENDENT else \
            f" (ignored: they apply to sigma_mode {DATA_DEPENDENT} only)"
        _deprecated(", ".join(old(k, v) for k, v in used.items()),
                    ", ".join(new(k, v) for k, v in used.items()) + ignored)
    return _sigma_keys_moved(fields)


def accepts_sigma_keywords(cls: type) -> type:
    """Class decorator for ``TrainConfig``: its constructor also takes the ``dd_*`` keyword
    arguments (:func:`sigma_keywords`). The signature shown is the class's own."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if any(k in kwargs for k in OLD_SIGMA_PARAMS):
            kwargs = sigma_keywords(kwargs)
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls
