"""``smoothcert import-checkpoint``: a reference implementation's released checkpoint (a classifier,
or a denoiser of microsoft/denoised-smoothing), converted into a smoothcert checkpoint; or an
improved-diffusion / guided-diffusion UNet (Carlini et al.'s denoisers) converted into a diffusers
folder for ``--denoiser diffusers:FOLDER``."""

from __future__ import annotations

from ..errors import SmoothcertError
from .catalog import names
from .common import command, is_main_rank


def _import_args(p):
    known = names("import-checkpoint")
    formats = known["formats"]  # name -> the first word of its source, sorted
    p.add_argument("file", help="a reference implementation's checkpoint (.pth.tar, .pth, .pt)")
    p.add_argument("--format", required=True, choices=[*formats, *known["openai_formats"]],
                   help="whose layout: " + ", ".join(
                       f"{name} ({source})" for name, source in formats.items())
                   + "; improved-diffusion (openai/improved-diffusion), guided-diffusion "
                     "(openai/guided-diffusion): a UNetModel state dict, written as a diffusers "
                     "folder")
    p.add_argument("--arch", default=None,
                   help="our architecture, e.g. cifar_resnet110, or resnet50 for ImageNet "
                        "(required for classifiers; denoised-smoothing: dncnn, its depth and "
                        "width read from the file)")
    p.add_argument("--dataset", default=None,
                   help="the dataset the model was trained on (required, except for "
                        "improved-diffusion and guided-diffusion)")
    p.add_argument("--sigma", type=float, default=None,
                   help="training noise level σ in pixel units (the files do not store it); 0 for "
                        "a classifier trained on clean images (e.g. one to put behind "
                        "--denoiser). Required, except for improved/guided-diffusion (their "
                        "denoiser gets σ at certify)")
    p.add_argument("--normalization", default="reference", choices=known["normalizations"],
                   help="the input normalization the file was trained with (default: the "
                        "reference code's for the dataset; salman: center, i.e. x − mean; "
                        "denoisers: none, they take raw pixels)")
    p.add_argument("--preset", default=None, choices=known["presets"],
                   help="improved/guided-diffusion: the flags of Carlini et al.'s denoiser "
                        "(carlini-cifar10: improved-diffusion's cifar10_uncond_50M_500K.pt; "
                        "carlini-imagenet: guided-diffusion's 256x256_diffusion_uncond.pt)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="improved/guided-diffusion, repeatable: a flag the model was created "
                        "with, named as in its repository (e.g. --param learn_sigma=True "
                        "--param diffusion_steps=4000); the file does not store them; they "
                        "override --preset and the repository's defaults")
    p.add_argument("--out", required=True,
                   help="smoothcert checkpoint to write (improved/guided-diffusion: a diffusers "
                        "folder)")
    p.add_argument("--force", action="store_true", help="replace an existing --out")


@command(
    "import-checkpoint",
    "convert a reference implementation's released checkpoint into a smoothcert checkpoint, or "
    "an improved/guided-diffusion UNet into a diffusers folder",
    _import_args,
    resume_hint="rerun the same command",  # nothing to resume: it starts again
)
def cmd_import_checkpoint(args):
    from ..denoisers.openai_unet import OPENAI_FORMATS

    if args.format in OPENAI_FORMATS:
        path = _import_openai(args)
        message = f"diffusers folder: {path} (certify with --denoiser diffusers:{path})"
    else:
        path = _import_reference(args)
        message = f"checkpoint: {path}"
    if is_main_rank():  # once under torchrun
        print(message)


def _import_reference(args):
    from ..models.importers import import_checkpoint

    _refuse(args, ("--preset", args.preset is not None), ("--param", bool(args.param)),
            why="they set the flags of improved/guided-diffusion UNets")
    for flag, value in (("--dataset", args.dataset), ("--sigma", args.sigma)):
        if value is None:
            raise SmoothcertError(f"--format {args.format} needs {flag}")
    return import_checkpoint(args.file, args.format, arch=args.arch, dataset=args.dataset,
                             sigma=args.sigma, out=args.out, normalization=args.normalization,
                             overwrite=args.force)


def _import_openai(args):
    from ..denoisers.openai_import import import_openai_unet

    _refuse(args, ("--arch", args.arch is not None), ("--dataset", args.dataset is not None),
            ("--sigma", args.sigma is not None),
            ("--normalization", args.normalization != "reference"),
            why="the UNet's flags are --preset and --param; σ is given at certify")
    params = {}
    for item in args.param:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SmoothcertError(f"--param takes KEY=VALUE, got {item!r}")
        params[key.strip()] = value.strip()
    return import_openai_unet(args.file, args.format, out=args.out, params=params,
                              preset=args.preset, overwrite=args.force)


def _refuse(args, *given: tuple[str, bool], why: str) -> None:
    names = [flag for flag, present in given if present]
    if names:
        raise SmoothcertError(f"--format {args.format} does not take {', '.join(names)}: {why}")
