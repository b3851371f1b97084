"""``smoothcert import-checkpoint``: a reference implementation's released checkpoint (a classifier,
or a denoiser of microsoft/denoised-smoothing), converted into a smoothcert checkpoint."""

from __future__ import annotations

from .common import command, is_main_rank


def _import_args(p):
    from ..models.importers import FORMATS, NORMALIZATIONS

    p.add_argument("file", help="a reference implementation's checkpoint (.pth.tar, .pth)")
    p.add_argument("--format", required=True, choices=sorted(FORMATS),
                   help="whose layout: " + ", ".join(
                       f"{name} ({fmt.source.split()[0]})"
                       for name, fmt in sorted(FORMATS.items())))
    p.add_argument("--arch", default=None,
                   help="our architecture, e.g. cifar_resnet110, or resnet50 for ImageNet "
                        "(required for classifiers; denoised-smoothing: dncnn, its depth and "
                        "width read from the file)")
    p.add_argument("--dataset", required=True, help="the dataset the model was trained on")
    p.add_argument("--sigma", type=float, required=True,
                   help="training noise level σ in pixel units (the files do not store it); 0 for "
                        "a classifier trained on clean images (e.g. one to put behind "
                        "--denoiser)")
    p.add_argument("--normalization", default="reference", choices=NORMALIZATIONS,
                   help="the input normalization the file was trained with (default: the "
                        "reference code's for the dataset; salman: center, i.e. x − mean; "
                        "denoisers: none, they take raw pixels)")
    p.add_argument("--out", required=True, help="smoothcert checkpoint to write")
    p.add_argument("--force", action="store_true", help="replace an existing --out")


@command(
    "import-checkpoint",
    "convert a reference implementation's released checkpoint into a smoothcert checkpoint",
    _import_args,
    resume_hint="rerun the same command",  # nothing to resume: it starts again
)
def cmd_import_checkpoint(args):
    from ..models.importers import import_checkpoint

    path = import_checkpoint(args.file, args.format, arch=args.arch, dataset=args.dataset,
                             sigma=args.sigma, out=args.out, normalization=args.normalization,
                             overwrite=args.force)
    if is_main_rank():  # once under torchrun
        print(f"checkpoint: {path}")
