"""CLI subcommands, one module per stage; each exposes `register(subparsers)` (see bertkit.cli)."""
