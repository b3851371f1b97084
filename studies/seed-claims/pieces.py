"""The report step of the seed-claims study (run.py report): every table and figure of README.md.

Each piece is one ``smoothcert report`` (or ``analyze easy-hard``) call over published record
files; its table goes to tables/NAME.md and into README.md's block ``<!-- report:NAME -->``
(``--into README.md --block NAME``), its figures to figures/. Five tables the CLI has no command
for (training and certification time, sequential draws, σ_x after data-dependent training, the
claims' paired bootstrap intervals) are computed here from the published files. A piece whose
record files are not all published yet is left as it is, so the report can be written while the
study is still running.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import yaml

SIGMAS = ["gaussian_s025", "gaussian_s050", "gaussian_s100", "consistency_s025",
          "consistency_s050", "consistency_s100"]
EASY = ["gaussian_s050", "easy_focus_s050", "easy_focus_discard_s050", "easy_focus_reweigh_s050",
        "easy_focus_attack_s050"]
STOPS = ("all", "n_max", "unreachable", "futile")
OTHERS = ["consistency_s050", "smoothadv_s050", "macer_s050", "smoothmix_s050", "catrs_s050",
          "easy_focus_s050"]  # Sun et al.'s Fig. 3: the methods against Gaussian at σ = 0.5
# The comparisons behind the ACR and certified-accuracy claims, one row each: (claim, quantity
# ("ACR" or "r=R"), first (run, record stem), second, claimed direction of second − first).
# A claim holds where all its rows do, so each row's interval is at 95% (intersection-union).
# Claim 10 claims equality ("≈"): there only a tie is consistent with it.
COMPARISONS = [
    *[("1", "ACR", (f"gaussian_s{s}", "certify"), (f"consistency_s{s}", "certify"), "greater")
      for s in ("025", "050", "100")],
    ("1", "ACR", ("stability_s050", "certify"), ("consistency_s050", "certify"), "greater"),
    ("4", "ACR", ("gaussian_s050", "certify"), ("gaussian_s050", "data_dependent_k900"),
     "greater"),
    ("5", "ACR", ("gaussian_s050", "data_dependent_k900"),
     ("gaussian_dd900_s050", "data_dependent_k900"), "greater"),
    *[("6", what, ("gaussian_s050", "certify"), (run, "certify"), claimed)
      for run in EASY[1:] for what, claimed in (("ACR", "greater"), ("r=0", "less"),
                                                ("r=0.25", "less"))],
    *[("8", what, ("gaussian_s050", "certify"), (run, "certify"), claimed)
      for run in OTHERS for what, claimed in (("r=0", "less"), ("r=1.5", "greater"))],
    *[("9", "ACR", ("consistency_s050", "certify"), (run, "certify"), "greater")
      for run in ("smoothmix_s050", "catrs_s050", "catrs_teacher_s050")],
    *[("10", "ACR", ("gaussian_s050", "certify"), (f"heat_g{g}_s050", "deterministic"), "≈")
      for g in ("0006", "001", "003", "01")],
]
CLAIMED = {">": "greater", "<": "less", "≈": "equal"}  # COMPARISONS' signs, as driver.judge's
# The claims of README.md's Verdicts: (number in COMPARISONS, or None, seed, claim, note). A claim
# with comparisons gets its word from their intervals (driver.combine: all needed); one without
# (a timing, a ranking, a count test) gets no verdict word, only the note's measurement.
CLAIMS = [
    ("1", "Jeong & Shin 2020", "consistency beats Gaussian (ACR, larger radii) at σ = 0.25, 0.5, "
     "1.0, and beats stability", ""),
    (None, "Jeong & Shin 2020", "consistency costs about twice Gaussian training",
     "no interval (one timing per run): 1.2× on an H100, 2.4–3.6× on the CPU"),
    (None, "Jeong & Shin 2020", "SmoothAdv and MACER cost far more than consistency",
     "no interval (one timing per run): 20×, 19× and 11× consistency's seconds per epoch"),
    ("4", "Alfarra et al.", "data-dependent σ certifies more at larger radii",
     "at K = 900 (K = 100 and the package's step 0.04: \"Claim 3 re-tested\")"),
    ("5", "Alfarra et al.", "data-dependent training helps further", "at K = 900"),
    ("6", "Sun et al.", "easy-focus parts raise ACR, lower small-radius accuracy", ""),
    (None, "Sun et al.", "strong methods weigh easy inputs more (Table 1)",
     "no interval (one ratio per method): Gaussian lowest and CAT-RS highest, as in Table 1"),
    ("8", "Sun et al.", "Gaussian keeps most p̂_A > ½; others win only at larger radii (Fig. 3)",
     ""),
    ("9", "Jeong et al. 2021, 2023", "SmoothMix and CAT-RS beat consistency in ACR", ""),
    ("10", "Campbell et al.", "one-epoch deterministic HeatSmoothing ≈ stochastic Gaussian", ""),
    (None, "ours", "the sequential certifier agrees with CERTIFY",
     "no interval (a count test): every disagreement below 3σ of its expectation, (6) above"),
]


class Pieces:
    """Writes the pieces of one study folder ``out`` (records/, tables/, figures/) into ``doc``."""

    def __init__(self, out: Path, doc: Path, defs):
        self.out, self.doc, self.defs = out, doc, defs
        (out / "tables").mkdir(parents=True, exist_ok=True)
        (out / "figures").mkdir(parents=True, exist_ok=True)

    def files(self, stem: str, *runs: str) -> list[str]:
        return [str(self.out / "records" / run / f"{stem}.tsv") for run in runs]

    def fig(self, name: str) -> str:
        return str(self.out / "figures" / name)

    def report(self, name: str, *args: str, command: str = "report") -> None:
        """Table ``name`` from ``smoothcert COMMAND ARGS``, unless a record file is missing."""
        missing = [a for a in args if a.endswith(".tsv") and not Path(a).is_file()]
        if missing:
            print(f"not rewritten: {name} ({missing[0]} is not published yet)")
            return
        has_block = f"<!-- report:{name} -->\n" in self.doc.read_text(encoding="utf-8")
        into = ["--into", str(self.doc), "--block", name] if command == "report" and has_block \
            else []
        cmd = [*self.defs.SMOOTHCERT, *command.split(), *args, *into]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"failed (exit {done.returncode}): {' '.join(cmd)}\n{done.stderr}")
        table = done.stdout
        (self.out / "tables" / f"{name}.md").write_text(table, encoding="utf-8")
        if not into:  # analyze has no --into; a missing block is reported by splice
            splice(self.doc, name, table)

    def summary(self, name: str, header: list[str], rows: list[list[str]]) -> None:
        """A table computed here: tables/NAME.tsv, tables/NAME.md and README.md's block."""
        tsv = "".join("\t".join(r) + "\n" for r in [header, *rows])
        (self.out / "tables" / f"{name}.tsv").write_text(tsv, encoding="utf-8")
        lines = ["| " + " | ".join(r) + " |" for r in [header, ["---"] * len(header), *rows]]
        md = "\n".join(lines) + "\n"
        (self.out / "tables" / f"{name}.md").write_text(md, encoding="utf-8")
        splice(self.doc, name, md)


def write_report(out: Path, doc: Path, defs) -> None:
    """Every piece, in the order of README.md's sections."""
    p, d = Pieces(out, doc, defs), defs
    certify = p.files  # certify("certify", RUN...): the runs' CERTIFY files
    # Claim 1 (and the σ-envelopes): gaussian vs consistency at every σ.
    p.report("sigmas", *certify("certify", *SIGMAS), "--radii", "0:3:0.25",
             "--plot", p.fig("sigmas.png"), "--ecdf", p.fig("sigmas_pa_ecdf.png"))
    for method in ("gaussian", "consistency"):
        runs = [f"{method}_s{s}" for s in ("025", "050", "100")]
        p.report(f"envelope_{method}", *certify("certify", *runs), "--radii", "0:3:0.25",
                 "--envelope", "--plot", p.fig(f"envelope_{method}.png"))
    # Claims 1, 2, 4: every method at σ = 0.5; the easy-focus parts (Sun et al.'s Fig. 3 ECDF).
    # CAT-RS with its teacher joins Sun et al.'s seven once its records are published (the
    # target=self variant's row stays beside it)
    seven = [*d.SEVEN, *[r for r in d.LATE if Path(p.files("certify", r)[0]).is_file()]]
    for name, runs in (("methods_s050", d.S050), ("easy_focus", EASY), ("seven_s050", seven)):
        p.report(name, *certify("certify", *runs), "--radii", "0:2:0.25",
                 "--plot", p.fig(f"{name}.png"), "--ecdf", p.fig(f"{name}_pa_ecdf.png"))
    dd_runs = ("gaussian_s050", "consistency_s050", "gaussian_dd_s050")
    p.report("data_dependent", *[f for r in dd_runs for s in ("certify", "data_dependent")
                                 for f in p.files(s, r)],
             "--radii", "0:2:0.25", "--plot", p.fig("data_dependent.png"))
    p.report("heat", *certify("certify", "gaussian_s050", "heat_s050"),
             *p.files("deterministic", "heat_s050"), *p.files("lbound_heuristic", "heat_s050"),
             "--radii", "0:2:0.25", "--plot", p.fig("heat.png"))
    grad_norms(p, seven)
    heat_faithful(p, d.HEATS)
    dd_pieces(p)
    sequential_pieces(p, d)
    p.summary("dd_training", *dd_training(out))
    judged = judged_comparisons(out)
    p.summary("claim_intervals", *claim_intervals(judged))
    p.summary("claim_words", *claim_words(judged))
    p.summary("sequential_draws", *sequential_draws(out, d))
    p.summary("certify_time", *certify_time(out, d))
    p.summary("train_time", *train_time(out, d))
    trained = [str(out / "records" / r) for r in d.RUNS
               if (out / "records" / r / "log.tsv").is_file()]
    p.report("train_cost", "--train", *trained)


def grad_norms(p: Pieces, seven: list[str]) -> None:
    """Sun et al.'s Table 1: grows as the runs' grad-norm files are published."""
    measured = [r for r in seven if Path(p.files("grad_norms", r)[0]).is_file()]
    if measured:
        p.report("grad_norms", *p.files("grad_norms", *measured), "--acr",
                 *p.files("certify", *measured), command="analyze easy-hard")


def heat_faithful(p: Pieces, heats: list[str]) -> None:
    """Claim 5 re-tested: the γ whose deterministic records are published so far."""
    done = [r for r in heats if Path(p.files("deterministic", r)[0]).is_file()]
    p.report("heat_faithful", *p.files("certify", "gaussian_s050", "heat_g0006_s050"),
             *p.files("deterministic", *done), "--radii", "0:2:0.25",
             "--plot", p.fig("heat_faithful.png"))


def dd_pieces(p: Pieces) -> None:
    """Claim 3 re-tested: OptimizeSigma's budget, the package's option set, the trained σ."""
    g = "gaussian_s050"
    wide = ["--radii", "0:2.5:0.25", "--common"]
    stems = ["certify", "data_dependent", "data_dependent_k300", "data_dependent_k900"]
    p.report("dd_budgets", *[f for s in stems for f in p.files(s, g)], *wide,
             "--plot", p.fig("dd_budgets.png"), "--sigma-hist", p.fig("dd_sigma_hist.png"))
    stems = ["certify", "data_dependent", "data_dependent_k900", "data_dependent_package"]
    p.report("dd_package", *[f for s in stems for f in p.files(s, g)], *wide,
             "--sigma-hist", p.fig("dd_package_sigma_hist.png"))
    pairs = [(s, "data_dependent_package") for s in ("certify", "data_dependent_k900")]
    p.report("dd_package_agreement", *[f for pair in pairs for s in pair for f in p.files(s, g)],
             "--agreement", *wide)
    pairs = [(s, "data_dependent_k900") for s in ("certify", "data_dependent")]
    p.report("dd_agreement", *[f for pair in pairs for s in pair for f in p.files(s, g)],
             "--agreement", *wide)
    c, t = "consistency_s050", "gaussian_dd900_s050"
    p.report("dd_models", *p.files("certify", g), *p.files("data_dependent_k900", g),
             *[f for s in ("certify", "data_dependent", "data_dependent_k900")
               for f in p.files(s, c)],
             *[f for s in ("certify", "data_dependent", "data_dependent_k900")
               for f in p.files(s, t)], "--radii", "0:2.5:0.25", "--common",
             "--plot", p.fig("dd_models.png"))
    p.report("dd_models_agreement", *[f for s in ("certify", "data_dependent_k900")
                                      for f in p.files(s, g) + p.files(s, t)],
             *p.files("certify", c), *p.files("data_dependent_k900", c), "--agreement", *wide)


def sequential_pieces(p: Pieces, d) -> None:
    """Claim 6: sequential vs fixed-n CERTIFY per σ, then image by image on each σ's grid."""
    pairs = {s: [r for r in (f"gaussian_s{s}", f"consistency_s{s}")] for s in ("025", "100")}
    pairs["050"] = d.S050
    stop = {"025": "0.75", "050": "1.5", "100": "3"}
    extra = {"025": p.files("sequential_nmax100k", "gaussian_s025"),
             "050": p.files("sequential_nmax100k", "gaussian_s050"), "100": []}
    for s, runs in pairs.items():
        p.report(f"sequential_s{s}", *[f for r in runs for st in ("certify", "sequential")
                                       for f in p.files(st, r)], *extra[s],
                 "--radii", f"0:{stop[s]}:0.25")
    for s, grid in d.GRIDS.items():
        files = [f for r in d.RUNS if r.endswith(f"_{s}") for st in d.records_of(r)
                 if st.startswith("sequential") for f in p.files("certify", r) + p.files(st, r)]
        p.report(f"agreement_{s}", *files, "--agreement", "--radii", grid)


def judged_comparisons(out: Path) -> list[tuple]:
    """Each comparison of COMPARISONS as (claim, quantity, [first, second] names, claimed sign,
    paired images or None where a file is not published yet, its verdict or None): the
    difference second − first on the images both record files hold, its 95% paired bootstrap
    interval (studies/driver.py: 10,000 resamples, seed 0) judged by the driver's rule
    (``driver.judge``) against the claimed direction (">", "<", or "≈": equality) with the
    driver's margins δ: 2 points of certified accuracy, 5% of the first file's ACR (the seeds
    state no effect at this scale)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # studies/driver.py
    from driver import Comparison, compare

    found = []
    for claim, what, first, second, claimed in COMPARISONS:
        names = [f"{run}/{stem}" for run, stem in (first, second)]
        sign = {"greater": ">", "less": "<"}.get(claimed, claimed)
        radii = () if what == "ACR" else (float(what.removeprefix("r=")),)
        result = compare(out, Comparison("", *names, radii, claimed=CLAIMED[sign]))
        if result is None:
            found.append((claim, what, names, sign, None, None))
            continue
        count, _, judged = result
        found.append((claim, what, names, sign, count,
                      judged["ACR" if what == "ACR" else f"r={radii[0]:g}"]))
    return found


def claim_intervals(judged: list[tuple]) -> tuple[list[str], list[list[str]]]:
    """The table of :func:`judged_comparisons`: one row per comparison (certified accuracy in
    points), its margin δ and its verdict."""
    header = ["claim", "quantity", "first", "second", "images", "second − first [95%]",
              "claimed", "margin δ", "verdict"]
    table = []
    for claim, what, names, sign, count, v in judged:
        if v is None:
            table.append([claim, what, *names, "", "not published yet", sign, "", "—"])
            continue
        scale, digits = (1, 3) if what == "ACR" else (100, 1)
        interval, word = v.cell(scale, digits).split("] ", 1)
        table.append([claim, what, *names, str(count), interval + "]", sign,
                      f"{scale * v.effect:.{digits}f}", word])
    return header, table


def claim_words(judged: list[tuple]) -> tuple[list[str], list[list[str]]]:
    """README.md's claims table: each claim of CLAIMS with its word (``driver.combine`` of its
    comparisons' verdicts, all needed) and which intervals gave which word (``driver.summary``;
    a label is the second file's run and the quantity)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # studies/driver.py
    from driver import combine, summary

    by_claim: dict[str, dict] = {}
    for claim, what, names, _, _, v in judged:
        if v is not None:
            by_claim.setdefault(claim, {})[f"{names[1].split('/')[0]} {what}"] = v
    table = []
    for k, (claim, seed, text, note) in enumerate(CLAIMS, 1):
        found = by_claim.get(claim, {}) if claim else {}
        detail = summary(found) if len({v.word for v in found.values()}) > 1 else ""
        word = combine(found.values()) if claim else "—"
        table.append([str(k), seed, text, word, "; ".join(x for x in (detail, note) if x)])
    header = ["#", "seed", "claim", "verdict",
              "which intervals say what (± half-width, as a fraction); note"]
    return header, table


def rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def dd_training(out: Path) -> tuple[list[str], list[list[str]]]:
    """σ_x of the training examples at the end of data-dependent training (the logs' last rows)."""
    header = ["name", "dd_steps_per_epoch", "sigma_updates", "sigma_min", "sigma_mean",
              "sigma_max"]
    table = []
    for run in ("gaussian_dd_s050", "gaussian_dd900_s050"):
        folder = out / "records" / run
        if not (folder / "log.tsv").is_file() or not (folder / "config.yaml").is_file():
            continue  # not trained and published yet
        cfg = yaml.safe_load((folder / "config.yaml").read_text())
        # configs written before sigma_mode_params kept K and the first epoch as dd_* keys
        params = cfg.get("sigma_mode_params") or {"num_steps": cfg.get("dd_steps"),
                                                  "start_epoch": cfg.get("dd_start_epoch")}
        last = rows(folder / "log.tsv")[-1]
        k, start = int(params["num_steps"]), int(params.get("start_epoch") or 0)
        table.append([run, str(k), str(k * (int(last["epoch"]) - start)),
                      *(f"{float(last[c]):.4f}" for c in ("sigma_min", "sigma_mean", "sigma_max"))])
    return header, table


def sequential_draws(out: Path, d) -> tuple[list[str], list[list[str]]]:
    """Forward passes per image (n0 + n) of CERTIFY and the sequential certifier, and how often
    each stopping rule ended the sequential runs."""
    header = ["name", "file", "certify_forward_per_image", "sequential_forward_per_image",
              "fewer", "stopped"]
    table = []
    for run in d.RUNS:
        for stem in d.records_of(run):
            path = out / "records" / run / f"{stem}.tsv"
            if not stem.startswith("sequential") or not path.is_file():
                continue
            c, s = (forward_per_image(rows(f)) for f in (path.with_name("certify.tsv"), path))
            stops = [r["stopped"] for r in rows(path)]
            how = ",".join(f"{w}={stops.count(w)}" for w in STOPS if stops.count(w))
            table.append([run, stem, f"{c:.0f}", f"{s:.0f}", f"{c / s:.2f}", how])
    return header, table


def forward_per_image(records: list[dict]) -> float:
    return sum(int(r["n0"]) + int(r["n"]) for r in records) / len(records)


def certify_time(out: Path, d) -> tuple[list[str], list[list[str]]]:
    """Seconds per record file (the sum of its rows' time) and per image, with the device type
    its manifest records (cpu or cuda)."""
    header = ["name", "file", "images", "seconds", "seconds_per_image", "device"]
    table = []
    for run in d.RUNS:
        for stem in d.records_of(run):
            path = out / "records" / run / f"{stem}.tsv"
            if stem == "grad_norms" or not path.is_file():  # an analysis, not a certificate
                continue
            seconds = [float(r["time"]) for r in rows(path)]
            manifest = Path(f"{path}.manifest.json")
            device = (json.loads(manifest.read_text()).get("identity", {}).get("device_type")
                      if manifest.is_file() else None)
            table.append([run, stem, str(len(seconds)), f"{sum(seconds):.1f}",
                          f"{sum(seconds) / len(seconds):.3f}", device or "?"])
    return header, table


def train_time(out: Path, d) -> tuple[list[str], list[list[str]]]:
    """Training cost from the published logs: seconds summed over the logged epochs, and the
    wall time of the train commands ("-" where a run trained outside the driver)."""
    header = ["name", "method", "sigma", "sigma_mode", "epochs", "epoch_seconds",
              "seconds_per_epoch", "wall_seconds", "resumed", "hardware"]
    table = []
    for run in d.RUNS:
        folder = out / "records" / run
        if not (folder / "log.tsv").is_file():
            continue
        cfg = dict(line.split(": ", 1) for line in  # top-level keys, their values as written
                   (folder / "config.yaml").read_text().splitlines() if ": " in line
                   and not line.startswith(" "))
        seconds = [float(r["seconds"]) for r in rows(folder / "log.tsv")]
        walls = rows(folder / "wall_time.tsv") if (folder / "wall_time.tsv").is_file() else []
        wall = [f"{sum(float(w['seconds']) for w in walls):.1f}",
                "yes" if any(int(w["epochs_before"]) > 0 for w in walls) else "no",
                walls[-1]["hardware"]] if walls else ["-", "-", "-"]
        table.append([run, cfg["method"], cfg["sigma"], cfg.get("sigma_mode", ""),
                      str(len(seconds)), f"{sum(seconds):.1f}",
                      f"{sum(seconds) / len(seconds):.3f}", *wall])
    return header, table


def splice(doc: Path, name: str, text: str) -> None:
    """Replace the lines between ``<!-- report:NAME -->`` and ``<!-- /report:NAME -->``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # studies/driver.py
    from driver import splice_block

    if not splice_block(doc, name, text):
        print(f"{doc}: no block {name}; tables/{name}.md written only")
