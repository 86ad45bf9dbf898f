"""One module per `etl` subcommand.

Each module defines `NAME`, `HELP`, `add_arguments(parser)` and `run(args) -> int`, and
keeps heavy imports inside `run` so that `etl --help` and `etl run` stay light.
The CLI discovers the modules here, so adding a command is adding a file.
"""
