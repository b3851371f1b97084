"""``smoothcert attack``: PGD or DDN on the soft smoothed classifier, judged by PREDICT, into a
record file of distances."""

from __future__ import annotations

import dataclasses

from .catalog import names
from .common import command
from .dataset_run import (
    dataset_run_args,
    model_args,
    monte_carlo_args,
    noise_args,
    run_certifier,
)


def _attack_args(p):
    attack = names("attack")
    d = attack["defaults"]  # AttackSettings' defaults
    model_args(p)
    p.add_argument("--attack", default=d["attack"], choices=attack["attacks"],
                   help="PGD-L2 or DDN on the soft smoothed classifier (default: pgd)")
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--epsilon", type=float, help="L2 budget of the attack (pixel units)")
    budget.add_argument("--min-distance", action="store_true",
                        help="raise ε by --epsilon-step up to --max-epsilon until PREDICT flips")
    p.add_argument("--max-epsilon", type=float, default=d["max_epsilon"],
                   help=f"cap of --min-distance (default {d['max_epsilon']})")
    p.add_argument("--epsilon-step", type=float, default=d["epsilon_step"],
                   help=f"ε grid step of --min-distance (default {d['epsilon_step']})")
    p.add_argument("--steps", type=int, default=d["steps"],
                   help=f"gradient steps per attack (default {d['steps']})")
    p.add_argument("--noise-draws", type=int, default=d["noise_draws"],
                   help=f"noises m in the soft objective (default {d['noise_draws']})")
    p.add_argument("--fresh-noise", action="store_true",
                   help="redraw the m noises at every step (default: drawn once per input, "
                        "as Salman et al. and Campbell et al.)")
    p.add_argument("--ddn-gamma", type=float, default=d["ddn_gamma"],
                   help=f"DDN's norm change per step (default {d['ddn_gamma']})")
    p.add_argument("--ddn-init-norm", type=float, default=d["ddn_init_norm"],
                   help=f"DDN's first norm (default {d['ddn_init_norm']})")
    noise_args(p)
    monte_carlo_args(p, "PREDICT's draws at the clean and attacked inputs, at most 2**53 "
                        "(default 100000)")
    dataset_run_args(p)


@command(
    "attack",
    "attack the smoothed classifier (PGD/DDN), judge with PREDICT: records with distances",
    _attack_args,
)
def cmd_attack(args):
    from ..certifiers.attack import AttackSettings

    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(AttackSettings)}
    if given["epsilon"] is None:  # --min-distance: the budget grid, not ε
        given["epsilon"] = AttackSettings.epsilon
    settings = AttackSettings(**given)  # validated here, before any file is written
    run_certifier("attack", args, options=dataclasses.asdict(settings))
