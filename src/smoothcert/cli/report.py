"""``smoothcert report``: tables (and plots) of record files, of run folders (``--train``) or
of pairs of record files (``--agreement``)."""

from __future__ import annotations

from ..errors import SmoothcertError
from .catalog import names
from .common import command

REPORT_RADII = "0:1:0.25"  # report's radii (attack files: distances) when --radii is not given
COST_RADIUS = 0.5  # --plot-cost's radius when --cost-radius is not given

# Every column of report's tables (README.md, "Reading the tables", says the same).
REPORT_COLUMNS = """\
columns (md and latex show fractions in %, csv and json as fractions in [0, 1]; every fraction \
is over all n examples of the file, abstentions included):

CERTIFY and PREDICT files, one row per file
name\tthe file (its name, made distinct where two files share one)
radius in\twhat the row's radii (ACR, r=R) are in: the norm of --norm (ℓ1, ℓ2, ℓ∞: the file's \
radius_l1, radius_l2 or radius_linf column), else the files' one norm, their noise's (ℓ2 \
Gaussian, ℓ1 uniform, ℓ∞ exp-inf), or a certifier's own unit (a patch side in pixels); shown \
with --norm or radii other than ℓ2. Files of different norms need --norm (one table, plot, \
envelope or agreement reads one norm)
dataset\tthe dataset split the file certifies (its manifest's), shown when the files certify \
more than one
n\texamples in the file
clean acc\taccuracy of the smoothed classifier: correct predictions / n, abstentions count as \
wrong; for CERTIFY files this is the certified accuracy at r = 0
abstain\tabstentions (predict = -1) / n
ACR\taverage certified radius: the mean over all n of radius if correct, else 0 (Zhai et al. 2020)
r=R\tcertified accuracy at radius R: examples predicted correctly with radius >= R, / n \
(empty for PREDICT files)
adjusted\tdata-dependent files: certificates the memory-based certifier changed
σ_x min, σ_x mean, σ_x max\tthe smallest, mean and largest σ of the file's rows, shown when some \
file's σ varies (data-dependent σ_x); a fixed-σ file shows its σ, a file without σ none
s/img, passes/img, device\t--cost: mean seconds and mean forward passes (n0 + n, plus a \
certifier's clean pass) per example, and the device the manifest names
envelope\tthe row of --envelope: the best file at each radius (the σ-envelope) of files \
holding the same examples of one dataset split (--common: those all files hold); clean acc is \
the best file's, n, abstain and ACR are empty

attack files, one row per file
attack\tthe attack (pgd or ddn)
clean acc\tPREDICT correct at the clean input / n; only these examples are attacked
attacked\tfraction of the attacked examples whose smoothed prediction was flipped
median dist\tmedian distance to a flip over the attacked examples, a failed attack counting as \
infinite
mean dist\tmean distance over the flipped examples
d<=D\tfraction of the attacked examples flipped within distance D

--train: one row per run folder
method\tthe training method
#HP\tits number of hyperparameters
epochs\tcompleted epochs (log.tsv)
s/epoch\tmean seconds per epoch
peak MB\tlargest peak memory of an epoch, in MB
ACR\tof the first CERTIFY record file in the folder

--agreement: one row per pair of files
first, second\tthe two files
agree\tfraction of (example, radius) pairs that both files certify or both do not
ΔACR, ± SE\tACR(second) − ACR(first) and its paired standard error over the examples
radius in\tas above, after second: shown with --norm or radii other than ℓ2
r=R\ta/b: examples only the first file / only the second certifies at R"""


def _report_args(p):
    p.add_argument("files", nargs="+",
                   help="record files (smoothcert's or Cohen et al.'s; CERTIFY, PREDICT or "
                        "attack records); run folders with --train")
    p.add_argument("--radii", help="start:stop:step or a comma list; attack files: distances "
                                   f"(default: {REPORT_RADII})")
    _html_args(p, names("formats"))
    p.add_argument("--norm", choices=names("norms"),
                   help="read every file's certified radius in this norm (its radius_l1, "
                        "radius_l2 or radius_linf column; default: each file's own radius, in "
                        "its noise's norm, which files of different norms refuse) and say it "
                        "in the table's 'radius in' column and on the plot's axis")
    p.add_argument("--plot", help="write certified accuracy vs radius (attack files: the "
                                  "attack curves) to this image file")
    p.add_argument("--envelope", action="store_true",
                   help="add the σ-envelope of the files (best certified accuracy per radius) "
                        "to the table and the plot; the files must hold the same examples "
                        "(add --common to take it on those all files hold)")
    p.add_argument("--ecdf", metavar="IMAGE",
                   help="write the empirical CDF of p̂_A per file (Sun et al. 2024, Fig. 3)")
    p.add_argument("--sigma-hist", metavar="IMAGE",
                   help="write the histogram of each file's per-example σ (its sigma column: "
                        "σ_x for data-dependent files)")
    p.add_argument("--cost", action="store_true",
                   help="add cost columns: seconds and forward passes (n0 + n, plus a clean "
                        "pass) per example, and the device of the run")
    p.add_argument("--plot-cost", metavar="IMAGE",
                   help="write certified accuracy at --cost-radius against forward passes per "
                        "example, one point per file, and their Pareto frontier")
    p.add_argument("--cost-radius", type=float,
                   help=f"the radius of --plot-cost (default {COST_RADIUS})")
    p.add_argument("--common", action="store_true",
                   help="compare the files on the examples (idx) they all hold, e.g. a file of "
                        "the first 200 images against one of 500 (with --agreement: each pair "
                        "on the examples both hold)")
    p.add_argument("--train", action="store_true",
                   help="compare training runs: method, #HP, s/epoch, peak memory, ACR")
    p.add_argument("--agreement", action="store_true",
                   help="compare the files in pairs (1st with 2nd, ...), example by example: "
                        "per radius, a/b = examples only the first / only the second certifies")
    p.add_argument("--into", metavar="DOC",
                   help="also write the table into DOC, between the lines "
                        "<!-- report:BLOCK --> and <!-- /report:BLOCK --> (needs --block)")
    p.add_argument("--block", help="the block of --into DOC that receives the table")
    p.epilog = REPORT_COLUMNS


def _html_args(p, formats):
    """--format, --out and the page's flags (--format html)."""
    p.add_argument("--format", default="md", choices=formats,
                   help="table format; html writes a self-contained page (tables, curves and "
                        "a gallery of examples) to --out")
    p.add_argument("--out", metavar="FILE",
                   help="write the table (--format html: the page) to FILE instead of stdout")
    p.add_argument("--gallery", type=int, metavar="N",
                   help=f"--format html: examples per file in the gallery (default "
                        f"{names('gallery')}; "
                        "0: none), spread over the file")
    p.add_argument("--gallery-eps", type=float, metavar="EPS",
                   help="--format html, median files: the ε of the grid at which the certified "
                        "box envelope is drawn (default: each example's largest ε with every "
                        "interval finite)")
    p.add_argument("--data-root", default=None,
                   help="--format html: folder holding the datasets' files, for the gallery's "
                        "images")


@command(
    "report", "certified accuracy at radii, ACR and abstention, one row per file", _report_args,
    resume_hint="rerun the same command",  # nothing to resume: it starts again
)
def cmd_report(args):
    from ..evaluation.blocks import check_block, splice_block
    from ..evaluation.metrics import parse_radii
    from ..evaluation.report import agreement_report, report
    from ..evaluation.train_report import train_report

    if (args.into is None) != (args.block is None):
        raise SmoothcertError("--into DOC and --block NAME go together")
    _check_report_mode(args)
    _check_cost_radius(args)
    _check_html(args)
    if not args.train:
        _check_record_paths(args.files)
    if args.into is not None:
        _check_into(args, args.files, args.train)
        check_block(args.into, args.block)
    if args.out is not None:
        _check_output(args, args.files, args.train, "--out", args.out)
    radii = args.radii if args.radii is not None else REPORT_RADII
    if args.format == "html":
        _html_page(args, radii)
        _say_written(args)
        return
    if args.train:
        table = train_report(args.files, fmt=args.format)
    elif args.agreement:
        table = agreement_report(args.files, radii, fmt=args.format, common=args.common,
                                 norm=args.norm)
    else:
        table = report(args.files, parse_radii(radii), fmt=args.format, plot=args.plot,
                       envelope=args.envelope, ecdf=args.ecdf, sigma_hist=args.sigma_hist,
                       common=args.common, cost=args.cost, plot_cost=args.plot_cost,
                       cost_radius=COST_RADIUS if args.cost_radius is None
                       else args.cost_radius, norm=args.norm)
    if args.into is not None:
        splice_block(args.into, args.block, table)
    if args.out is not None:
        from ..io import write_text_atomic

        write_text_atomic(args.out, table)
    else:
        print(table, end="")
    _say_written(args)


def _html_page(args, radii) -> None:
    """``--format html``: the page, written to ``--out``."""
    from ..evaluation.html import GALLERY, html_report

    html_report(args.files, radii, args.out,
                gallery=GALLERY if args.gallery is None else args.gallery,
                data_root=args.data_root, eps=args.gallery_eps, plot=args.plot,
                envelope=args.envelope, ecdf=args.ecdf, sigma_hist=args.sigma_hist,
                common=args.common, cost=args.cost, plot_cost=args.plot_cost,
                cost_radius=COST_RADIUS if args.cost_radius is None else args.cost_radius,
                norm=args.norm)


def _check_html(args) -> None:
    """``--format html`` writes a page to ``--out`` for record files; its own flags need it."""
    html = args.format == "html"
    if html and args.out is None:
        raise SmoothcertError("--format html writes a page; give its file with --out "
                              "report.html")
    if html and (args.train or args.agreement or args.into is not None):
        flag = "--train" if args.train else "--agreement" if args.agreement else "--into"
        raise SmoothcertError(f"--format html is the page of record files; {flag} does not "
                              "apply to it (drop one of them)")
    own = {"--gallery": args.gallery is not None, "--gallery-eps": args.gallery_eps is not None,
           "--data-root": args.data_root is not None}
    given = [flag for flag, is_given in own.items() if is_given]
    if given and not html:
        raise SmoothcertError(f"{given[0]} is for the page of --format html; add --format html "
                              "--out report.html or drop it")
    if args.gallery is not None and args.gallery < 0:
        raise SmoothcertError(f"--gallery must be >= 0, got {args.gallery}")


WRITTEN = (("plot", "plot"), ("ecdf", "p̂_A ECDF"), ("sigma_hist", "σ histogram"),
           ("plot_cost", "cost plot"), ("into", "table"), ("out", "report"))
"""(argument, what it receives) of report's outputs besides the table on stdout."""


def _say_written(args) -> None:
    """One line per file written, on stderr (stdout holds the table alone, for a pipe), in the
    ``what: PATH`` form of the other commands' outputs (``records: ...``, ``merged: ...``)."""
    import sys

    for name, what in WRITTEN:
        path = getattr(args, name)
        if path is not None:
            block = f" (block {args.block})" if name == "into" else ""
            print(f"{what}: {path}{block}", file=sys.stderr)


def _check_record_paths(files) -> None:
    """Each file is a record file, not a folder: a training run folder is reported with
    ``--train``; any other folder's record files are named one by one."""
    from pathlib import Path

    for name in files:
        folder = Path(name)
        if not folder.is_dir():
            continue
        tsv = ", ".join(sorted(p.name for p in folder.glob("*.tsv") if p.name != "log.tsv"))
        inside = f" (record files there: {tsv})" if tsv else ""
        if any((folder / f).is_file() for f in ("checkpoint.pt", "config.yaml", "log.tsv")):
            raise SmoothcertError(f"{name} is a training run folder, not a record file; "
                                  f"compare training runs with report --train {name}, or give "
                                  f"a record file{inside}")
        raise SmoothcertError(f"{name} is a folder, not a record file; give the record files "
                              f"to report{inside}")


def _check_report_mode(args) -> None:
    """Refuse a flag that the chosen table would silently ignore."""
    if args.train and args.agreement:
        raise SmoothcertError("--train and --agreement are different tables; pick one")
    mode = "--train" if args.train else "--agreement" if args.agreement else None
    if mode is None:
        return
    given = {"--plot": args.plot is not None, "--envelope": args.envelope,
             "--cost": args.cost, "--plot-cost": args.plot_cost is not None,
             "--ecdf": args.ecdf is not None, "--sigma-hist": args.sigma_hist is not None,
             "--common": args.train and args.common,
             "--norm": args.train and args.norm is not None,
             "--radii": args.train and args.radii is not None}
    ignored = [flag for flag, is_given in given.items() if is_given]
    if ignored:
        raise SmoothcertError(f"{' and '.join(ignored)} {'does' if len(ignored) == 1 else 'do'} "
                              f"not apply to {mode}; drop {'it' if len(ignored) == 1 else 'them'}"
                              " or run report without " + mode)


def _check_cost_radius(args) -> None:
    """``--cost-radius`` is --plot-cost's, a finite radius >= 0."""
    import math

    if args.cost_radius is None:
        return
    if args.plot_cost is None:
        raise SmoothcertError("--cost-radius is the radius of --plot-cost; add --plot-cost "
                              "IMAGE or drop it")
    if not (math.isfinite(args.cost_radius) and args.cost_radius >= 0):
        raise SmoothcertError(f"--cost-radius must be a finite number >= 0, got "
                              f"{args.cost_radius}")


def _check_into(args, files, train: bool) -> None:
    """``--into DOC`` must not be a file the report reads: a record file or its manifest, or
    (``--train``) a run folder's files; nor a figure the report writes."""
    _check_output(args, files, train, "--into", args.into)


def _check_output(args, files, train: bool, flag: str, path) -> None:
    """An output (``--into DOC``, ``--out FILE``) must not be a file the report reads: a record
    file or its manifest, or (``--train``) a run folder's files; nor another output."""
    from ..evaluation.report import check_outputs
    from ..io import check_not_input

    if train:
        from pathlib import Path

        read = [f for folder in files for f in Path(folder).glob("*") if f.is_file()]
        check_not_input(path, read, flag)
        return
    check_outputs(files, {"--plot": args.plot, "--ecdf": args.ecdf,
                          "--sigma-hist": args.sigma_hist, "--plot-cost": args.plot_cost,
                          "--into": args.into, "--out": args.out})
