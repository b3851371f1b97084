"""``smoothcert merge``: the shard record files of one run, validated, into one record file."""

from __future__ import annotations

from .common import command


def _merge_args(p):
    p.add_argument("files", nargs="+", help="the shard record files of one run")
    p.add_argument("--out", required=True, help="merged record file")


@command("merge", "validate shard record files and write their union", _merge_args,
         resume_hint="rerun the same command")  # nothing to resume: it starts again
def cmd_merge(args):
    from ..io import check_not_input
    from ..runs.records import manifest_path, merge_records

    inputs = [*args.files, *map(manifest_path, args.files)]
    for out in (args.out, manifest_path(args.out)):  # the file and the manifest it writes
        check_not_input(out, inputs)
    print(f"merged: {merge_records(args.files, args.out)}")
