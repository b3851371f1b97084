"""The command line: one module per command (parse, call one library function, print)."""


def __getattr__(name: str):
    # main from .app on first use, so that `python -m smoothcert.cli.catalog` runs the catalog
    # module alone, before the commands import it
    if name != "main":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .app import main

    return main


__all__ = ["main"]
